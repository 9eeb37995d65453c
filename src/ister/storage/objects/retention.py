"""Which local WAL files may go: only files whose offsets are all in recorded objects, past local retention.

Pure logic (`deletable`) plus a small blocking helper for file ages. Deleting is the caller's job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .catalog import ObjectDescriptor, covering


@dataclass(frozen=True, slots=True)
class LocalRetention:
    """Keep locally at least the newest `keep_bytes` of WAL files, and every file younger than
    `keep_seconds` (by modification time), even when they are already in the durable tier."""

    keep_bytes: int = 0
    keep_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.keep_bytes < 0 or self.keep_seconds < 0:
            raise ValueError("retention limits must be >= 0")


def covered(descriptors: Sequence[ObjectDescriptor], lo: int, hi: int) -> bool:
    """True if every offset in [lo, hi] is in some descriptor (descriptors sorted by start)."""
    offset = lo
    while offset <= hi:
        d = covering(descriptors, offset)
        if d is None:
            return False
        offset = d.end_offset + 1
    return True


def deletable(
    segments: Sequence[tuple[int, Path, int]],
    descriptors: Sequence[ObjectDescriptor],
    retention: LocalRetention = LocalRetention(),
    *,
    ages: Mapping[Path, float] | None = None,
    keep_from: int | None = None,
    holes: Sequence[tuple[int, int]] = (),
) -> list[Path]:
    """The oldest WAL files that may be deleted now, oldest first (always a prefix of `segments`).

    `segments` is `Wal.segments()` ((first_offset, path, size), oldest first, the last one active);
    `descriptors` is a fresh `catalog.list_descriptors` result. A file qualifies only if:
      * it is not the last (active) file;
      * every offset from its first up to the next file's first - 1 is in a recorded object or in one of
        `holes` (`Wal.holes()`: (first, end) ranges the WAL lost or found damaged, which no copy can come
        from); a file followed by a gap in the WAL is judged by that whole span, so it stays until the gap
        is covered;
      * the newer files hold at least `retention.keep_bytes` bytes;
      * it is at least `retention.keep_seconds` old (`ages`: path -> seconds; a missing age keeps it);
      * it holds no offset >= `keep_from` (say, the slowest subscription's next offset), if given.
    The first file that does not qualify stops the list, so the WAL never gets a hole.
    """
    out: list[Path] = []
    newer = sum(size for _, _, size in segments)
    for i in range(len(segments) - 1):
        first, path, size = segments[i]
        newer -= size
        last = segments[i + 1][0] - 1
        if last >= first and not _covered_or_hole(descriptors, holes, first, last):
            break
        if newer < retention.keep_bytes:
            break
        if retention.keep_seconds > 0:
            age = None if ages is None else ages.get(path)
            if age is None or age < retention.keep_seconds:
                break
        if keep_from is not None and last >= keep_from:
            break
        out.append(path)
    return out


def _covered_or_hole(
    descriptors: Sequence[ObjectDescriptor], holes: Sequence[tuple[int, int]], lo: int, hi: int
) -> bool:
    offset = lo
    while offset <= hi:
        d = covering(descriptors, offset)
        if d is not None:
            offset = d.end_offset + 1
            continue
        h = next((end for first, end in holes if first <= offset < end), None)
        if h is None:
            return False
        offset = h
    return True


def file_ages(paths: Sequence[Path], now: float) -> dict[Path, float]:
    """Seconds since each file was last modified (blocking; missing files are left out)."""
    ages: dict[Path, float] = {}
    for path in paths:
        try:
            ages[path] = now - os.stat(path).st_mtime
        except FileNotFoundError:
            continue
    return ages


__all__ = ["LocalRetention", "covered", "deletable", "file_ages"]
