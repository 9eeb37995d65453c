"""One WAL's writer: group commit of queued frames into the active segment, run by the shared pool.

The event loop encodes frames, assigns offsets and queues one `Entry` per append call (in offset order),
then asks the pool (`pool.py`) for a turn. In a turn a pool thread takes everything queued (up to
max_write_bytes), issues one write of the joined buffer, fdatasyncs it (with the other files of its batch),
then reports the whole group back to the loop in one callback. The active segment's file descriptor is
opened for a write and closed again when the pool says the WAL has been idle (or too many are open).

A full disk (ENOSPC, EDQUOT) while writing a group is not a failure of the WAL, nor is running out of
file descriptors (EMFILE, ENFILE) when opening a segment: the partly written bytes are cut off again, the
group and everything queued behind it are refused with `DiskFull` / `StorageExhausted` (their offsets are
handed back, none was acknowledged), and the next append tries again. At most once a second (and on stop)
a turn also records the committed offset in the high-water checkpoint (`checkpoint.py`).

The parts, each with one owner: `WalWriter` (here) runs the group commit: the queue, the turns, the
offsets written and synced, refusals and failures. It asks `segfiles.py` (the active segment, its
descriptor, rotation, the cut; `truncate.py` carries a cut out on disk), `linger.py` (whether a busy
writer waits to group more appends), `prealloc.py` (the active file allocated ahead of its data, through
segfiles), `highwater.py` (when the high-water checkpoint is recorded) and `shortage.py` (episodes of a
full disk or no free descriptor, and their errors).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ister.errors import StorageError, StorageExhausted

from .checkpoint import Checkpoint, CheckpointFile
from .config import WalConfig
from .durable import DISK_FULL_ERRNOS
from .entry import CommitCallback, CutCallback, Entry, FailureCallback, RefusedCallback
from .highwater import CheckpointSchedule
from .linger import GroupLinger
from .pool import Call, WriterPool
from .segfiles import NoSpace, SegmentFiles
from .segment import Segment
from .shortage import Shortage

log = logging.getLogger(__name__)


class WalWriter:
    # slots: a broker holds one per reliable topic (100,000 of them), a __dict__ each would cost ~1.5 KB
    __slots__ = (
        "_always",
        "_close_now",
        "_config",
        "_cut_now",
        "_cut_request",
        "_directory",
        "_failed",
        "_files",
        "_final",
        "_group",
        "_interval",
        "_last_sync",
        "_lock",
        "_lost_ranges",
        "_nbytes",
        "_on_commit",
        "_on_cut",
        "_on_failure",
        "_on_refused",
        "_on_stopped",
        "_presynced",
        "_queue",
        "_refusing",
        "_shortage",
        "_stopped",
        "_stopping",
        "_sync_requested",
        "_synced_end",
        "_written",
        "_written_end",
        "_wrote",
        "busy",
        "checkpoints",
        "close_requested",
        "linger",
        "lingered_this_turn",
        "loop",
        "pool",
        "posts",
        "registered",
        "rotate_requested",
        "timer_at",
    )

    def __init__(
        self,
        pool: WriterPool,
        loop: asyncio.AbstractEventLoop,
        config: WalConfig,
        directory: Path,
        segments: list[Segment],
        segments_lock: threading.Lock,
        on_commit: CommitCallback,
        on_failure: FailureCallback,
        on_refused: RefusedCallback,
        on_stopped: Callable[[], None],
        lost_ranges: Callable[[], tuple[tuple[int, int], ...]],
        mark: int,
        on_cut: CutCallback,
    ) -> None:
        self.pool = pool
        self.loop = loop
        self._config = config
        self._always = config.fsync == "always"
        self._interval = config.fsync_interval_ms / 1000.0
        self._directory = directory
        self._on_commit = on_commit
        self._on_failure = on_failure
        self._on_refused = on_refused
        self._on_stopped = on_stopped
        self._on_cut = on_cut
        self._lost_ranges = lost_ranges
        # Guarded by the pool's lock: the queue, the flags below and the pool's bookkeeping of this writer.
        self._lock = pool.lock
        self._queue: list[Entry] = []  # a list, not a deque: an empty deque costs ~600 bytes per WAL
        self.busy = False  # in the pool's ready queue or in a batch
        self.timer_at: float | None = None  # the deadline armed in the pool's timer heap
        self.lingered_this_turn = False  # a pool thread has waited for more appends before this turn
        self.linger = GroupLinger(config.group_linger_us)
        self.close_requested = False  # the pool wants the segment file closed (idle, or too many open)
        self._stopping = False
        self._stopped = False
        self._failed: StorageError | None = None
        self._refusing: StorageExhausted | None = None  # set while the loop has not taken offsets back
        self._files = SegmentFiles(directory, config, segments, segments_lock)
        self.rotate_requested = False  # set by the loop (Wal.rotate), honoured before the next group
        self._cut_request: tuple[int, bool] | None = None  # (end, reset) from Wal.truncate / Wal.reset
        self._cut_now: tuple[int, bool] | None = None  # the cut this turn makes
        self._written_end = self._files.active.end_offset
        self._synced_end = self._written_end
        self._last_sync = time.monotonic()
        self.checkpoints = CheckpointSchedule(directory, mark)
        self._shortage: Shortage | None = None  # made when a refusal episode starts (most WALs never see one)
        self.registered = False  # counted in the pool's writers (between start() and the end of stop())
        # One turn (pool thread, while this writer is in a batch): set by take(), used by the turn_* steps.
        self._group: list[Entry] = []
        self._nbytes = 0
        self._sync_requested = False
        self._close_now = False
        self._final = False  # stopping and nothing queued behind this group
        self._written: Segment | None = None  # the group is in this segment's file, not yet accounted for
        self._wrote = False
        self._presynced = False  # the pool made this turn's group durable (one syncfs for its batch)
        self.posts: list[Call] = []  # completions for the loop, handed over by the pool after each step

    # ---- loop side -------------------------------------------------------------------------------

    def start(self) -> None:
        self.pool.register(self)

    def submit(self, entry: Entry) -> None:
        """Queue an entry; raises StorageError (queueing nothing) if the writer failed or is stopping."""
        with self._lock:
            if self._failed is not None:
                raise StorageError(f"wal failed: {self._failed}")
            if self._stopping or self.pool.closed:
                raise StorageError("wal closed")
            if self._refusing is not None:
                raise type(self._refusing)(str(self._refusing))
            self._queue.append(entry)
            self.linger.submitted(time.monotonic())
            self.pool.wake(self)

    def lingers(self) -> bool:
        """Whether a pool thread should wait `linger_s` before taking this writer's group (pool lock held):
        fsync always, nothing queued that must not wait (a flush marker, a cut, a stop, an idle close),
        and the traffic says waiting pays (linger.py)."""
        queue = self._queue
        if not self._always or self._stopping or self.close_requested:
            return False
        if self._failed is not None or self._cut_request is not None:
            return False
        if not all(entry.count for entry in queue):  # a flush marker (count 0) is waited on by flush()
            return False
        return self.linger.pays(len(queue))

    @property
    def linger_s(self) -> float:
        """How long a pool thread waits when `lingers()` says so."""
        return self.linger.linger_s

    @property
    def checkpoint_file(self) -> CheckpointFile:
        return self.checkpoints.file

    @property
    def device(self) -> int | None:
        """st_dev of the segment files, known once one was opened."""
        return self._files.device

    def queued(self) -> int:
        """Entries waiting for a turn (pool lock held)."""
        return len(self._queue)

    def lingered(self, gained: bool) -> None:
        """A pool thread waited for this writer (pool lock held); `gained`: appends came meanwhile."""
        self.linger.lingered(gained)

    def submit_cut(self, end: int, reset: bool, entry: Entry) -> None:
        """Queue a cut of the log to `end` (see truncate.py) and a marker that completes after it. The loop
        queues nothing else with it: the turn that takes the marker makes the cut before any write."""
        with self._lock:
            if self._failed is not None:
                raise StorageError(f"wal failed: {self._failed}")
            if self._stopping or self.pool.closed:
                raise StorageError("wal closed")
            self._cut_request = (end, reset)
            self._queue.append(entry)
            self.pool.wake(self)

    def accept(self) -> None:
        """The loop took back the offsets of refused appends: accept new entries again."""
        with self._lock:
            self._refusing = None

    def stop(self) -> None:
        """Finish what is queued, fdatasync, write the checkpoint, close the file; then on_stopped runs."""
        with self._lock:
            self._stopping = True
            if not self.pool.closed:
                self.pool.wake(self)
                return
        self._stop_without_pool()

    def _stop_without_pool(self) -> None:
        """The pool is gone (closed before this WAL): finish here, on the caller's thread."""
        try:
            if self._failed is None and self._files.fd is not None and self._synced_end < self._written_end:
                self._sync()
            self._checkpoint(final=True)
            if self._failed is None:
                self._trim()
        except OSError as exc:
            log.error("WAL %s: final fdatasync failed: %s", self._directory, exc)
        self._close_fd()
        self._stopped = True
        self._on_stopped()

    # ---- pool thread: one turn -------------------------------------------------------------------

    def take(self, now: float) -> None:
        """Start a turn (pool lock held): take a group (everything queued, up to max_write_bytes)."""
        queue = self._queue
        nbytes = 0
        sync_requested = False
        limit = self._config.max_write_bytes
        taken = 0
        for entry in queue:
            if entry.count == 0:
                sync_requested = True
            elif nbytes and nbytes + len(entry.data) > limit:
                break
            else:
                nbytes += len(entry.data)
            taken += 1
        if taken == len(queue):
            group, self._queue = queue, []
            queue = self._queue
        else:
            group = queue[:taken]
            del queue[:taken]
        self._group = group
        if taken:
            self.linger.took(taken)
        self._nbytes = nbytes
        self._cut_now, self._cut_request = self._cut_request, None
        self._sync_requested = sync_requested
        self._close_now = self.close_requested
        self._final = self._stopping and not queue
        self._wrote = False

    def turn_write(self) -> None:
        cut, self._cut_now = self._cut_now, None
        if self._stopped or self._failed is not None or not self._group:
            return
        try:
            if cut is not None:
                self._cut(*cut)
            self._write_group(self._group, self._nbytes, self._sync_requested)
        except NoSpace as exc:
            self._refuse(exc.cause)
        except BaseException as exc:  # OSError mostly; anything else must not leave appends hanging
            self._fail(exc)

    def owes_sync(self) -> int | None:
        """The device of the file this turn wrote a group to that must be made durable before it is
        acknowledged (fsync=always), or None. The pool may make it durable for several writers at once
        (`presynced`); turn_sync fdatasyncs it otherwise."""
        if not self._always or self._written is None or self._files.fd is None:
            return None
        if self._stopped or self._failed is not None:
            return None
        return self.device

    def presynced(self) -> None:
        """The pool made this turn's written group durable (syncfs of its filesystem, after the write)."""
        self._presynced = True

    def sync_fd(self) -> int:
        """The open segment file (only while owes_sync() says so)."""
        fd = self._files.fd
        assert fd is not None
        return fd

    def turn_sync(self) -> None:
        """Make the written group durable (fsync=always) and report it; fdatasync what interval mode owes."""
        presynced, self._presynced = self._presynced, False
        if self._stopped or self._failed is not None:
            return
        try:
            seg = self._written
            synced_before = self._synced_end
            if seg is not None:
                if self._always and not presynced:
                    try:
                        self._fdatasync()
                    except OSError as exc:
                        if exc.errno not in DISK_FULL_ERRNOS:
                            raise
                        fd = self._files.fd
                        assert fd is not None
                        self._files.prealloc.cut_to(fd, seg.size)  # nothing of the group stays behind
                        raise NoSpace(exc) from exc
                self._written = None
                self._account(seg, self._group)
            now = time.monotonic()
            if self._synced_end < self._written_end and (
                self._sync_requested
                or self._final
                or (self._close_now and not self._wrote)
                or now - self._last_sync >= self._interval
            ):
                self._sync()
            if self._group or self._synced_end != synced_before:
                committed = self._synced_end if self._always else self._written_end
                self.posts.append((self._on_commit, (self._group, committed, self._synced_end, self._nbytes)))
        except NoSpace as exc:
            self._refuse(exc.cause)
        except BaseException as exc:
            self._fail(exc)
        self._group = []

    def turn_after(self) -> None:
        """After the completions went out and the pool recorded the checkpoints due (checkpoint_due): close
        the file when idle or stopping."""
        if self._stopped:
            return
        if self._final or self._failed is not None:
            if self._final or self._stopping:
                if self._failed is None:
                    self._trim()
                self._close_fd()
                self._stopped = True
                self.posts.append((self._on_stopped, ()))
        elif self._close_now and not self._wrote:
            self._trim()  # an idle topic keeps no reserve (reopened and allocated again by the next write)
            self._close_fd()

    def turn_end(self, now: float) -> None:
        """End the turn (pool lock held): another turn now, a timer, or nothing."""
        pool = self.pool
        if self._stopped:
            pool.finished(self, stopped=True)
            return
        if self._files.fd is None:
            pool.note_closed(self)
        elif self._wrote:
            pool.note_open(self, now)
            self.close_requested = False  # written just now: not idle after all
        if self._close_now:
            self.close_requested = False
        if self._failed is not None and not self._stopping:
            pool.finished(self, stopped=False)  # nothing to do until stop()
            return
        deadline = self.deadline()
        due = deadline is not None and deadline <= now
        if self._queue or self.close_requested or self._stopping or due:
            pool.requeue(self)
        else:
            pool.finished(self, stopped=False)

    def deadline(self) -> float | None:
        """When this writer needs a turn without new appends (monotonic), or None."""
        if self._failed is not None:
            return None
        deadline = None
        if not self._always and self._synced_end < self._written_end:
            deadline = self._last_sync + self._interval
        at = self.checkpoints.deadline(self._committed())
        if at is not None:
            deadline = at if deadline is None else min(deadline, at)
        return deadline

    def _committed(self) -> int:
        """The offset below which everything is acknowledged (durable with fsync=always)."""
        return self._synced_end if self._always else self._written_end

    # ---- writing ---------------------------------------------------------------------------------

    def _write_group(self, group: list[Entry], nbytes: int, sync_requested: bool) -> None:
        """Write the group's frames (one write); turn_sync makes them durable and accounts for them."""
        files = self._files
        if self.rotate_requested:
            self.rotate_requested = False
            if files.active.size > 0:
                # close the active segment so it can be exported
                self._rotate(self._written_end, keep_open=nbytes > 0)
        if not nbytes:
            return
        first = next(e for e in group if e.count)
        seg = files.active
        if files.due_to_rotate():
            seg = self._rotate(first.first_offset, keep_open=True)
        buf = group[0].data if len(group) == 1 else b"".join([e.data for e in group if e.count])
        fd = files.open()
        if seg.size:  # never before the segment's first frame (prealloc.py)
            files.prealloc.reserve(fd, seg.size + len(buf))
        try:
            self._write_all(buf)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            files.prealloc.cut_to(fd, seg.size)  # no torn frame (nor reserve) stays behind
            raise NoSpace(exc) from exc
        self._written = seg
        self._wrote = True

    def _account(self, seg: Segment, group: list[Entry]) -> None:
        """The group's frames are in `seg` (and durable with fsync=always): index them, move the ends."""
        if self._shortage is not None:
            self._shortage.written()
            self._shortage = None
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

    def _close_fd(self) -> None:
        self._files.close()

    def _write_all(self, buf: bytes) -> None:
        """Write `buf` after the active segment's data."""
        self._files.write_all(buf)

    def _trim(self) -> None:
        self._files.trim()

    def _fdatasync(self) -> None:
        self._files.fdatasync()

    def _sync(self) -> None:
        self._fdatasync()
        self._synced_end = self._written_end
        self._last_sync = time.monotonic()

    def _rotate(self, first_offset: int, *, keep_open: bool) -> Segment:
        if self._synced_end < self._written_end:
            self._sync()
        return self._files.rotate(first_offset, keep_open=keep_open)

    def _cut(self, end: int, reset: bool) -> None:
        """Cut the log to `end` (everything with `reset`; segfiles.py). The loop refuses appends meanwhile
        and flushed before asking. Any error fails the WAL (the caller of turn_write)."""
        try:
            self._files.cut(end, reset, self._lost_ranges, self.checkpoints.file)
            self._written_end = self._synced_end = end
            self.checkpoints.cut(end)
        finally:
            self.posts.append((self._on_cut, (end, reset)))

    def _refuse(self, cause: OSError) -> None:
        """Out of space (or descriptors): refuse this group and everything queued behind it until the loop
        takes their offsets back (Wal._on_refused, then accept()); the next append tries again."""
        self._written = None
        shortage = self._shortage
        if shortage is None:
            shortage = self._shortage = Shortage(self._directory)
        err = shortage.error(cause)
        with self._lock:
            self._refusing = err
            rest = list(self._queue)
            self._queue.clear()
        entries = self._group + rest
        self._group = []
        shortage.refused(err, sum(1 for e in entries if e.count))
        self._final = False  # a stop behind the refused entries gets its own turn
        self.posts.append((self._on_refused, (entries, err, self._written_end)))

    def _checkpoint(self, *, final: bool) -> None:
        """Record the committed offset in the high-water checkpoint, at most once per interval (and when
        stopping). A failure is logged once and retried later; it never fails the WAL."""
        checkpoint = self._checkpoint_due(final)
        if checkpoint is not None:
            self.record_checkpoint(checkpoint)

    def checkpoint_due(self) -> Checkpoint | None:
        """After a turn's completions went out (pool thread): the checkpoint this writer should record now,
        or None. The caller records it (`record_checkpoint`, or with others' through one syncfs and then
        `checkpoint_recorded`)."""
        if self._stopped or self._failed is not None:
            return None
        try:
            return self._checkpoint_due(self._final)
        except BaseException as exc:  # the lost ranges come from the WAL: nothing may escape a turn
            self._fail(exc)
            return None

    def _checkpoint_due(self, final: bool) -> Checkpoint | None:
        return self.checkpoints.due(
            self._committed(), final, time.monotonic(), self.pool.reserve_checkpoint, self._lost_ranges
        )

    def record_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Write `checkpoint` on its own (into the file's free slot and fdatasync, or a new file)."""
        try:
            self.checkpoints.file.write(checkpoint)
        except OSError as exc:
            self.checkpoint_failed(exc)
        except BaseException as exc:
            self._fail(exc)
        else:
            self.checkpoint_recorded(checkpoint)

    def checkpoint_failed(self, exc: OSError) -> None:
        self.checkpoints.failed(exc)

    def checkpoint_recorded(self, checkpoint: Checkpoint) -> None:
        self.checkpoints.recorded(checkpoint)

    def _fail(self, exc: BaseException) -> None:
        err = StorageError(f"WAL writer failed in {self._directory}: {exc!r}")
        log.error("%s", err)
        self._written = None
        with self._lock:
            self._failed = err
            rest = list(self._queue)
            self._queue.clear()
        entries = self._group + rest
        self._group = []
        self._close_fd()
        self.posts.append((self._on_failure, (entries, err)))

    def detach(self) -> None:
        """Drop the references to the WAL (its callbacks) once stopped, so the two form no cycle."""
        self._on_commit = _ignore
        self._on_failure = _ignore
        self._on_refused = _ignore
        self._on_stopped = _ignore
        self._on_cut = _ignore
        self._lost_ranges = _no_ranges


def _ignore(*args: object) -> None:
    return None


def _no_ranges() -> tuple[tuple[int, int], ...]:
    return ()
