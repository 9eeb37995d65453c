"""One WAL's segment files as its writer sees them: the active segment, its descriptor (open only while
written), rotation to a new segment and the cut of the log (`truncate.py` plans and carries it out on
disk). `SegmentFiles` is their one owner; the writer (`writer.py`) decides when to write, sync, rotate and
cut, and keeps the offsets. Used by the pool thread of the writer's turn only; the segment list is shared
with the `Wal` and changed under its lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ister.core.frames import SparseIndex
from ister.errors import CorruptionError

from .checkpoint import CheckpointFile
from .config import WalConfig
from .durable import EXHAUSTED_ERRNOS, fsync_dir
from .names import segment_name
from .pool import wal_fsync
from .prealloc import Preallocation
from .segment import Segment
from .truncate import CutPlan, carry_out, clip_ranges, frame_position


class NoSpace(Exception):
    """A group could not be written for lack of space (or of a file descriptor); nothing of it is left in
    the file."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SegmentFiles:
    # slots: one per reliable topic's writer (100,000 of them)
    __slots__ = ("_config", "_directory", "_lock", "_segments", "active", "device", "fd", "prealloc", "since")

    def __init__(
        self, directory: Path, config: WalConfig, segments: list[Segment], segments_lock: threading.Lock
    ) -> None:
        self._directory = directory
        self._config = config
        self._segments = segments  # shared list; appended to under segments_lock
        self._lock = segments_lock
        self.active = segments[-1]
        self.since = time.monotonic()  # when the active segment was started (its age rotates it)
        self.fd: int | None = None  # the active segment, open only while it is being written
        self.device: int | None = None  # st_dev of the segment files, known once one was opened
        self.prealloc = Preallocation(directory, config.preallocate_bytes)

    def due_to_rotate(self) -> bool:
        """The active segment holds data and reached its size or age limit."""
        seg = self.active
        max_age = self._config.segment_max_age_s
        return seg.size > 0 and (
            seg.size >= self._config.segment_max_bytes
            or bool(max_age and time.monotonic() - self.since >= max_age)
        )

    def open(self) -> int:
        """The active segment's descriptor, opened if need be (NoSpace when out of descriptors)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.active.path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in EXHAUSTED_ERRNOS:
                    raise NoSpace(exc) from exc
                raise
            if self.device is None:
                self.device = os.fstat(self.fd).st_dev
        return self.fd

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def write_all(self, buf: bytes) -> None:
        """Write `buf` after the active segment's data."""
        fd = self.open()
        at = self.active.size
        n = os.pwrite(fd, buf, at)
        if n == len(buf):
            return
        view = memoryview(buf)
        while n < len(buf):
            written = os.pwrite(fd, view[n:], at + n)
            if written <= 0:
                raise OSError(f"write to {self.active.path} made no progress")
            n += written

    def fdatasync(self) -> None:
        fd = self.open()
        started = time.monotonic()
        os.fdatasync(fd)
        wal_fsync.observe(time.monotonic() - started)

    def trim(self) -> None:
        """Cut the zeros past the active segment's data (it is sealed, or the WAL closes)."""
        self.prealloc.trim(self.fd, self.active.path, self.active.size)

    def rotate(self, first_offset: int, *, keep_open: bool) -> Segment:
        """Start a new active segment at `first_offset` (everything written before is durable: the caller
        synced). Its file and directory entry are durable before it is used; NoSpace when out of space."""
        path = self._directory / segment_name(first_offset)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in EXHAUSTED_ERRNOS:
                raise NoSpace(exc) from exc
            raise
        try:
            fsync_dir(self._directory)
        except BaseException as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)  # a retry creates it again
            if isinstance(exc, OSError) and exc.errno in EXHAUSTED_ERRNOS:
                raise NoSpace(exc) from exc
            raise
        self.trim()  # the sealed segment's file ends at its last frame (exports and scans read it)
        self.close()
        if keep_open:
            self.fd = fd
            if self.device is None:
                self.device = os.fstat(fd).st_dev
        else:
            os.close(fd)  # nothing to write yet: the file is opened again by the next write
        old = self.active
        index = SparseIndex(old.index.every_frames, old.index.every_bytes)
        seg = Segment(first_offset, path, size=0, end_offset=first_offset, index=index)
        with self._lock:
            self._segments.append(seg)
        self.active = seg
        self.since = time.monotonic()
        return seg

    def cut(
        self,
        end: int,
        reset: bool,
        lost_ranges: Callable[[], tuple[tuple[int, int], ...]],
        checkpoint: CheckpointFile,
    ) -> None:
        """Cut the log to `end` (everything with `reset`) on disk and here (truncate.py); the high-water
        checkpoint file is replaced with one that says so. Everything below the old end is durable (the
        caller flushed). An error leaves memory no longer saying what the disk holds: the caller fails the
        WAL, and the next open reads the old log, or the cut one when the intent got to disk."""
        self.close()
        with self._lock:
            segments = list(self._segments)
        keep: list[Segment] = []
        holder: Segment | None = None
        position = 0
        if not reset:
            i = max(i for i, s in enumerate(segments) if s.first_offset <= end)
            keep = segments[: i + 1]
            seg = segments[i]
            if end <= seg.end_offset:  # else `end` lies past its readable frames: a new segment
                holder = seg
                found = seg.index.floor(end) or (seg.first_offset, 0)
                at = seg.size if end == seg.end_offset else frame_position(seg.path, *found, end)
                if at is None:
                    raise CorruptionError(f"{seg.path}: no frame boundary for offset {end}")
                position = at
        lost = () if reset else clip_ranges(lost_ranges(), end)
        drop = [s.path for s in segments[len(keep) :]]
        plan = CutPlan(end, reset, drop, None if holder is None else holder.path, position, lost)
        checkpoint.replaced()  # the cut replaces the file
        path = carry_out(self._directory, plan)
        index = SparseIndex(self._config.index_every_frames, self._config.index_every_bytes)
        if holder is not None:
            for offset, pos in holder.index.entries:  # a new index: readers may hold the old one
                if offset < end:
                    index.add(offset, pos)
            holder.index, holder.size, holder.end_offset = index, position, end
        else:
            keep.append(Segment(end, path, size=0, end_offset=end, index=index))
        with self._lock:
            self._segments[:] = keep  # the list is shared with the Wal
        self.active = keep[-1]
        self.since = time.monotonic()
        self.prealloc.exact()
