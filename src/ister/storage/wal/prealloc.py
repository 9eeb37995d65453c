"""Preallocation of the active segment's file.

Groups are written at explicit positions (pwrite, not O_APPEND), and once the active segment holds data
its file is allocated ahead of it (posix_fallocate, up to `preallocate_bytes` past the data, at most
doubling it), so most fdatasyncs flush data into blocks the file already has instead of also journalling
a new file size: about 30 % less time per fdatasync on ext4 here (docs/benchmarks.md). The zeros past the
data are cut off when the segment is sealed, its file is closed as idle, or the WAL closes; after a crash,
recovery cuts them like a torn tail (segment.py). Never before the segment's first frame is on disk, so
zeros never sit where offset 0 is expected (a zero header reads as an empty frame at offset 0): the
writer asks for a reserve only when the segment already holds data.

`Preallocation` is the one owner of what is known about the active file's allocation; the writer tells
it when the file was cut or replaced. Used by the pool thread of the writer's turn only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .durable import EXHAUSTED_ERRNOS

log = logging.getLogger(__name__)

PAGE_BYTES = 4096  # preallocation rounds up to whole pages


class Preallocation:
    __slots__ = ("_ahead", "_allocated", "_directory")

    def __init__(self, directory: Path, ahead_bytes: int) -> None:
        self._directory = directory
        self._ahead = ahead_bytes
        # Bytes of the active segment's file allocated (0: not known to exceed the data, -1: preallocation
        # does not work here, or is off)
        self._allocated = 0 if ahead_bytes else -1

    def reserve(self, fd: int, end: int) -> None:
        """Have the active segment's file allocated past `end` (bytes of data once the group is written)."""
        allocated = self._allocated
        if end <= allocated or allocated < 0:
            return
        ahead = min(self._ahead, end)
        target = -(-(end + ahead) // PAGE_BYTES) * PAGE_BYTES
        try:
            os.posix_fallocate(fd, 0, target)
        except OSError as exc:
            if exc.errno not in EXHAUSTED_ERRNOS:  # not supported here: write without a reserve
                log.warning(
                    "WAL %s: cannot preallocate segment files (%s); writing without", self._directory, exc
                )
                self._allocated = -1
            return  # no room for a reserve: the write may still fit
        self._allocated = target

    def exact(self) -> None:
        """The active segment's file ends at its data (cut, truncated or new): no reserve is known."""
        if self._allocated > 0:
            self._allocated = 0

    def cut_to(self, fd: int, size: int) -> None:
        """Cut the active file back to `size` (a group that did not fit leaves nothing behind)."""
        os.ftruncate(fd, size)
        self.exact()

    def trim(self, fd: int | None, path: Path, size: int) -> None:
        """Cut the zeros past the active segment's data (`size`: it is sealed, or the WAL closes); a failure
        leaves them for recovery to cut."""
        allocated = self._allocated
        self.exact()  # also when the reserve was already used up: the next segment starts afresh
        if allocated <= size:
            return
        try:
            if fd is not None:
                os.ftruncate(fd, size)
            else:
                os.truncate(path, size)
        except OSError as exc:
            log.warning("WAL %s: cannot cut the preallocated tail of %s: %s", self._directory, path, exc)
