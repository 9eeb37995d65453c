"""The orphan-file sweep of one table (docs/tables.md, "Orphan files"): list the table's data directory
through its own FileIO's filesystem (a local warehouse or S3, with the table's S3 settings), then read
which files its snapshots name, then delete the Parquet files none names that are older than the minimum
age (`core.orphans` decides). Blocking: runs in the table worker.

The listing comes first: a file committed after it was listed is in the referenced set read after it, and
a file written after the listing is not a candidate at all. The minimum age keeps the file of a commit in
flight (another writer's, a deposed leader's) however the two interleave.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ister.core.orphans import ListedFile, orphans

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: the files it deleted and, when it stopped on a failure, why (picklable: it
    goes back from the worker process to the broker)."""

    deleted: list[str] = field(default_factory=list)
    error: str | None = None


def _filesystem(io: Any, location: str) -> tuple[Any, str, str]:
    """(pyarrow filesystem, scheme, path within it) of a location, as the table's FileIO opens it."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        raise TypeError(f"orphan sweep needs pyiceberg's PyArrowFileIO, the table has {type(io).__name__}")
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    return io.fs_by_scheme(scheme, netloc), scheme, path


def normal(io: Any, location: str) -> str:
    """A location in one spelling (`scheme://path`), whether the table wrote it with or without a scheme."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, _netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    return f"{scheme}://{path}"


def data_dir(table: Any) -> str:
    """Where the table's writer puts data files (`<location>/data` unless `write.data.path` says)."""
    probe: str = table.location_provider().new_data_location("probe.parquet")
    return probe.rsplit("/", 1)[0]


def list_files(io: Any, directory: str) -> list[ListedFile]:
    """Every file under `directory` (recursively: partitions are subdirectories), normalised paths."""
    from pyarrow.fs import FileSelector, FileType

    fs, scheme, path = _filesystem(io, directory)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return [
        ListedFile(f"{scheme}://{i.path}", i.mtime.timestamp() if i.mtime is not None else None)
        for i in infos
        if i.type == FileType.File
    ]


def current_files(table: Any) -> list[str]:
    """The data files the table's current snapshot names."""
    snap = table.current_snapshot()
    if snap is None:
        return []
    io = table.io
    return [
        entry.data_file.file_path
        for manifest in snap.manifests(io)
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)
    ]


def sweep(
    table: Any,
    referenced: Callable[[], Iterable[str]],
    min_age: float,
    now: float | None = None,
) -> SweepResult:
    """Delete the table's orphan data files (see the module's docstring). A listing failure raises (nothing
    was deleted); a file that cannot be deleted is reported in the result's `error` and left as it is, and
    the sweep goes on with the others."""
    io = table.io
    listed = list_files(io, data_dir(table))
    now = time.time() if now is None else now
    table.refresh()
    # Most old files are the current snapshot's: one manifest read rules them out, and every snapshot's
    # manifests (hundreds, one per commit kept for time travel) are read only when something is left.
    current = {normal(io, p) for p in current_files(table)}
    candidates = set(orphans(listed, current, now, min_age))
    doomed: list[str] = []
    if candidates:
        named = {normal(io, p) for p in referenced()}
        doomed = orphans([f for f in listed if f.path in candidates], named, now, min_age)
    deleted: list[str] = []
    failed: list[str] = []
    for path in doomed:
        fs, _scheme, inner = _filesystem(io, path)
        try:
            fs.delete_file(inner)
        except FileNotFoundError:
            continue  # gone meanwhile (another sweep)
        except OSError as exc:  # one file that will not go does not keep the others
            failed.append(f"{path}: {exc}")
            continue
        deleted.append(path)
    if deleted:
        log.info("orphan sweep of %s: deleted %d unreferenced data files", table.name(), len(deleted))
    if failed:
        return SweepResult(deleted, f"could not delete {len(failed)} of {len(doomed)} orphans, {failed[0]}")
    return SweepResult(deleted)


__all__ = ["SweepResult", "current_files", "data_dir", "list_files", "normal", "sweep"]
