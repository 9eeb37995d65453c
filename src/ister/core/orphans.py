"""Which files in a table's data directory are orphans (docs/tables.md, "Orphan files").

An orphan is a Parquet data file that no snapshot of the table names: a crash between writing a file and
the catalog commit that would have named it, a refused commit, or an expiry interrupted before it deleted
what the expired snapshots alone named. A file is an orphan only once it is older than `min_age`: a
younger one may belong to a commit in flight (written, not yet committed), which the sweep must never
break. Pure: the listing, the referenced set and the time are arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

DATA_SUFFIX = ".parquet"


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file as the warehouse lists it: its path (in the same form as `referenced`) and modification time
    (seconds since the epoch; None when the store did not give one)."""

    path: str
    mtime: float | None


def orphans(
    listed: Iterable[ListedFile], referenced: Collection[str], now: float, min_age: float
) -> list[str]:
    """The paths among `listed` to delete, sorted: Parquet files no snapshot names (`referenced`) and
    modified at least `min_age` seconds before `now`. A file without a modification time is kept (its age
    is unknown), as is every file that is not Parquet (not written by the table's writer)."""
    if min_age < 0:
        raise ValueError(f"min_age must be >= 0, got {min_age}")
    cutoff = now - min_age
    return sorted(
        f.path
        for f in listed
        if f.path.endswith(DATA_SUFFIX)
        and f.path not in referenced
        and f.mtime is not None
        and f.mtime <= cutoff
    )


__all__ = ["DATA_SUFFIX", "ListedFile", "orphans"]
