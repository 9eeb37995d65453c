"""The WAL writer thread: group commit of queued frames into the active segment.

The event loop encodes frames, assigns offsets and queues one `Entry` per append call (in offset order).
The thread takes everything queued (up to max_write_bytes), issues one write of the joined buffer and one
fdatasync, then reports the whole group back to the loop with a single call_soon_threadsafe.

A full disk (ENOSPC, EDQUOT) while writing a group is not a failure of the WAL: the partly written bytes
are cut off again, the group and everything queued behind it are refused with `DiskFull` (their offsets
are handed back, none was acknowledged), and the next append tries again. At most once a second (and on
stop) the thread also records the committed offset in the high-water checkpoint (`checkpoint.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ister.core.frames import SparseIndex
from ister.errors import DiskFull, StorageError

from .checkpoint import Checkpoint, write_checkpoint
from .config import WalConfig
from .segment import Segment, fsync_dir, segment_name

log = logging.getLogger(__name__)

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
CHECKPOINT_INTERVAL_S = 1.0  # the high-water checkpoint lags the committed offset by at most about this


class _NoSpace(Exception):
    """Internal: a group could not be written for lack of space; nothing of it is left in the file."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Entry:
    """One append call (count > 0) or a flush marker (count == 0, forces an fdatasync)."""

    __slots__ = ("count", "data", "first_offset", "future", "payload_bytes", "payloads")

    def __init__(
        self,
        first_offset: int,
        count: int,
        data: bytes,
        payloads: list[bytes],
        payload_bytes: int,
        future: asyncio.Future[int] | None,
    ) -> None:
        self.first_offset = first_offset
        self.count = count
        self.data = data
        self.payloads = payloads
        self.payload_bytes = payload_bytes
        self.future = future


# (group, committed_end, synced_end, group_bytes) -> None, run on the loop thread
CommitCallback = Callable[[list[Entry], int, int, int], None]
# (entries that will never be written, error) -> None, run on the loop thread
FailureCallback = Callable[[list[Entry], StorageError], None]
# (entries refused for lack of space, error, offset the next append must get) -> None, run on the loop thread
DiskFullCallback = Callable[[list[Entry], DiskFull, int], None]


class WalWriter:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: WalConfig,
        directory: Path,
        segments: list[Segment],
        segments_lock: threading.Lock,
        on_commit: CommitCallback,
        on_failure: FailureCallback,
        on_disk_full: DiskFullCallback,
        lost_ranges: Callable[[], tuple[tuple[int, int], ...]],
        mark: int,
    ) -> None:
        self._loop = loop
        self._config = config
        self._always = config.fsync == "always"
        self._interval = config.fsync_interval_ms / 1000.0
        self._directory = directory
        self._segments = segments  # shared list; appended to under segments_lock
        self._segments_lock = segments_lock
        self._on_commit = on_commit
        self._on_failure = on_failure
        self._on_disk_full = on_disk_full
        self._lost_ranges = lost_ranges
        # _lock guards _queue, _idle, _stopping and _failed. The writer sleeps on _wake (a lock used as a
        # binary semaphore, held while nobody signalled); whoever finds _idle set under _lock clears it and
        # releases _wake exactly once. Only C-level lock operations on the event-loop side.
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()
        self._queue: deque[Entry] = deque()
        self._idle = False
        self._stopping = False
        self._failed: StorageError | None = None
        self._refusing: DiskFull | None = None  # set while the loop has not taken back refused offsets
        self._active = segments[-1]
        self._active_since = time.monotonic()
        self.rotate_requested = False  # set by the loop (Wal.rotate), honoured before the next group
        self._fd = os.open(self._active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._written_end = self._active.end_offset
        self._synced_end = self._written_end
        self._last_sync = time.monotonic()
        self._mark = mark  # the committed offset the checkpoint file holds
        self._last_checkpoint = 0.0
        self._checkpoint_error: str | None = None
        self._full_since: float | None = None  # monotonic start of the current disk-full episode
        self._full_refused = 0
        self._thread = threading.Thread(target=self._run, name=f"wal-writer:{directory.name}", daemon=True)

    # ---- loop side -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, entry: Entry) -> None:
        """Queue an entry; raises StorageError (queueing nothing) if the writer failed or is stopping."""
        with self._lock:
            if self._failed is not None:
                raise StorageError(f"wal failed: {self._failed}")
            if self._stopping:
                raise StorageError("wal closed")
            if self._refusing is not None:
                raise DiskFull(str(self._refusing))
            self._queue.append(entry)
            if self._idle:
                self._idle = False
                self._wake.release()

    def accept(self) -> None:
        """The loop took back the offsets of refused appends: accept new entries again."""
        with self._lock:
            self._refusing = None

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            if self._idle:
                self._idle = False
                self._wake.release()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- writer thread ---------------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            log.debug("wal writer: event loop closed, dropping a completion")

    def _run(self) -> None:
        group: list[Entry] = []
        try:
            while True:
                group, nbytes, sync_requested, stopping = self._take()
                if group:
                    try:
                        self._write_group(group, nbytes, sync_requested)
                    except _NoSpace as exc:
                        self._refuse(group, exc.cause)
                    group = []
                elif self._synced_end < self._written_end:
                    self._sync()  # interval mode: the idle deadline passed (or we are stopping)
                    self._post(self._on_commit, [], self._written_end, self._synced_end, 0)
                self._checkpoint(final=False)
                if stopping and not group:
                    with self._lock:
                        if not self._queue:
                            break
            if self._synced_end < self._written_end:
                self._sync()
            self._checkpoint(final=True)
        except BaseException as exc:  # OSError mostly; anything else must not leave appends hanging
            self._fail(exc, group)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _take(self) -> tuple[list[Entry], int, bool, bool]:
        """Wait for work, then take a group (everything queued, up to max_write_bytes)."""
        lock = self._lock
        queue = self._queue
        while True:
            with lock:
                if queue or self._stopping:
                    break
                timeout = -1.0
                deadline = self._deadline()
                if deadline is not None:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break  # time to fdatasync what was written (interval mode) or to checkpoint
                self._idle = True
            if not self._wake.acquire(timeout=timeout):
                with lock:
                    if self._idle:
                        self._idle = False
                        continue
                self._wake.acquire()  # a release raced with the timeout: consume it
        with lock:
            group: list[Entry] = []
            nbytes = 0
            sync_requested = False
            limit = self._config.max_write_bytes
            while queue:
                entry = queue[0]
                if entry.count == 0:
                    sync_requested = True
                elif nbytes and nbytes + len(entry.data) > limit:
                    break
                else:
                    nbytes += len(entry.data)
                queue.popleft()
                group.append(entry)
            return group, nbytes, sync_requested, self._stopping

    def _deadline(self) -> float | None:
        """When the idle thread must wake up by itself (monotonic), or None."""
        deadline = None
        if not self._always and self._synced_end < self._written_end:
            deadline = self._last_sync + self._interval
        committed = self._synced_end if self._always else self._written_end
        if committed > self._mark:
            at = self._last_checkpoint + CHECKPOINT_INTERVAL_S
            deadline = at if deadline is None else min(deadline, at)
        return deadline

    def _write_group(self, group: list[Entry], nbytes: int, sync_requested: bool) -> None:
        if self.rotate_requested:
            self.rotate_requested = False
            if self._active.size > 0:
                self._rotate(self._written_end)  # close the active segment so it can be exported
        if nbytes:
            first = next(e for e in group if e.count)
            seg = self._active
            max_age = self._config.segment_max_age_s
            if seg.size > 0 and (
                seg.size >= self._config.segment_max_bytes
                or (max_age and time.monotonic() - self._active_since >= max_age)
            ):
                seg = self._rotate(first.first_offset)
            buf = group[0].data if len(group) == 1 else b"".join([e.data for e in group if e.count])
            try:
                self._write_all(buf)
                if self._always:
                    self._fdatasync()
            except OSError as exc:
                if exc.errno not in DISK_FULL_ERRNOS:
                    raise
                os.ftruncate(self._fd, seg.size)  # no torn frame stays behind; O_APPEND writes go there
                raise _NoSpace(exc) from exc
            if self._full_since is not None:
                log.warning(
                    "WAL %s: disk space is available again; writes resumed after %.1f s (%d appends refused)",
                    self._directory,
                    time.monotonic() - self._full_since,
                    self._full_refused,
                )
                self._full_since = None
                self._full_refused = 0
            index = seg.index
            pos = seg.size
            end = seg.end_offset
            for e in group:
                if e.count:
                    index.note(e.first_offset, pos)
                    pos += len(e.data)
                    end = e.first_offset + e.count
            seg.size = pos
            seg.end_offset = end
            self._written_end = end
            if self._always:
                self._synced_end = end
                self._last_sync = time.monotonic()
        now = time.monotonic()
        if self._synced_end < self._written_end and (
            self._always or sync_requested or now - self._last_sync >= self._interval
        ):
            self._sync()
        committed = self._synced_end if self._always else self._written_end
        self._post(self._on_commit, group, committed, self._synced_end, nbytes)

    def _write_all(self, buf: bytes) -> None:
        fd = self._fd
        n = os.write(fd, buf)
        if n == len(buf):
            return
        view = memoryview(buf)
        while n < len(buf):
            written = os.write(fd, view[n:])
            if written <= 0:
                raise OSError(f"write to {self._active.path} made no progress")
            n += written

    def _fdatasync(self) -> None:
        os.fdatasync(self._fd)

    def _sync(self) -> None:
        self._fdatasync()
        self._synced_end = self._written_end
        self._last_sync = time.monotonic()

    def _rotate(self, first_offset: int) -> Segment:
        if self._synced_end < self._written_end:
            self._sync()
        path = self._directory / segment_name(first_offset)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise _NoSpace(exc) from exc
            raise
        try:
            fsync_dir(self._directory)
        except BaseException as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)  # a retry creates it again
            if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
                raise _NoSpace(exc) from exc
            raise
        old_fd = self._fd
        self._fd = fd
        os.close(old_fd)
        old = self._active
        index = SparseIndex(old.index.every_frames, old.index.every_bytes)
        seg = Segment(first_offset, path, size=0, end_offset=first_offset, index=index)
        with self._segments_lock:
            self._segments.append(seg)
        self._active = seg
        self._active_since = time.monotonic()
        return seg

    def _refuse(self, group: list[Entry], cause: OSError) -> None:
        """Disk full: refuse this group and everything queued behind it until the loop takes their offsets
        back (Wal._on_disk_full, then accept()); the next append tries the disk again."""
        err = DiskFull(f"disk full: cannot write to the WAL in {self._directory}: {cause.strerror or cause}")
        with self._lock:
            self._refusing = err
            rest = list(self._queue)
            self._queue.clear()
        entries = group + rest
        refused = sum(1 for e in entries if e.count)
        if self._full_since is None:
            log.error("WAL %s: %s; appends are refused (retriable) until space returns", self._directory, err)
            self._full_since = time.monotonic()
        self._full_refused += refused
        self._post(self._on_disk_full, entries, err, self._written_end)

    def _checkpoint(self, *, final: bool) -> None:
        """Record the committed offset in the high-water checkpoint, at most once per interval (and when
        stopping). A failure is logged once and retried later; it never fails the WAL."""
        committed = self._synced_end if self._always else self._written_end
        if committed <= self._mark:
            return
        now = time.monotonic()
        if not final and now - self._last_checkpoint < CHECKPOINT_INTERVAL_S:
            return
        self._last_checkpoint = now
        try:
            write_checkpoint(self._directory, Checkpoint(committed, self._lost_ranges()))
        except OSError as exc:
            if self._checkpoint_error is None:
                log.error("WAL %s: cannot write the high-water checkpoint: %s", self._directory, exc)
            self._checkpoint_error = str(exc)
            return
        if self._checkpoint_error is not None:
            log.warning("WAL %s: high-water checkpoint written again", self._directory)
            self._checkpoint_error = None
        self._mark = committed

    def _fail(self, exc: BaseException, group: list[Entry]) -> None:
        err = StorageError(f"WAL writer failed in {self._directory}: {exc!r}")
        log.error("%s", err)
        with self._lock:
            self._failed = err
            rest = list(self._queue)
            self._queue.clear()
        self._post(self._on_failure, group + rest, err)
