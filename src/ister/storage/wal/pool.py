"""The WAL writer pool: a few threads, shared by every WAL of the process, do all writes and fdatasyncs.

Each WAL's `WalWriter` queues its appends on the event loop and asks the pool for a turn. A pool thread
takes a batch of writers that have work (at most BATCH_WRITERS, spread over the idle threads) and runs
one turn for all of them: it writes each one's group, then fdatasyncs every file that needs it in one
pass, then hands all their completions to the event loop (one `call_soon_threadsafe` per loop and batch),
then writes the checkpoints that are due. A writer is in at most one batch at a time and its turns run in
queue order, so each WAL keeps its own order and group commit; fsyncs of different WALs share a pass.

With fsync=always, when several writers of a batch wrote to files on one filesystem, the pool makes them all
durable with one syncfs(2) of that filesystem instead of an fdatasync each (`shared_sync`), and writes the
batch's due checkpoints with one more (checkpoint.write_checkpoints): with 1,000 topics written at once
that halves the pool's system calls and its threads' trips through the GIL, so two threads do (more only
take turns holding the GIL) and a batch takes up to BATCH_WRITERS_SHARED writers. Should a syncfs fail,
each writer fdatasyncs its own file (and writes its checkpoint) as usual, so an error is still reported
for the file it concerns.

Timers (the `fsync: interval` deadline, the high-water checkpoint) give a writer a turn when they are due.
File descriptors: a writer opens its active segment when it has something to write; the pool has it
closed again once the segment was not written for `idle_close_s`, or, least recently written first, when
more than `max_open_files` are open. So a process holds one descriptor per recently written WAL, never one
per WAL.

All writer state shared with the loop (queues, flags, timers, the open-file list) is guarded by the one
pool lock (`WriterPool.lock`, a Condition the idle threads wait on), held only for O(1) steps per writer.
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import logging
import math
import resource
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Gauge

from ister.errors import StorageError
from ister.histogram import histogram
from ister.wal_settings import check_pool_settings

from . import durable
from .checkpoint import Checkpoint, write_checkpoints

if TYPE_CHECKING:
    from .writer import WalWriter

log = logging.getLogger(__name__)

BATCH_WRITERS = 32  # writers per turn of one pool thread (their fdatasyncs run back to back, then acks)
BATCH_WRITERS_SHARED = 128  # the same where one syncfs serves the batch (a seventh less pool CPU than 32)
# High-water checkpoints written per second by the whole pool (a burst of as many at once). Each costs two
# fsyncs and a rename (about 0.5 ms of disk), more than a write group: with 1,000 WALs written at once,
# one per WAL per second took a third of the pool's time. Beyond the budget they are spaced out, so a
# WAL's checkpoint lags by up to (WALs written at once / this) seconds instead of one.
CHECKPOINTS_PER_SECOND = 100
CHECKPOINT_GROUP = 16  # with shared_sync, spaced-out checkpoint slots fall due in groups of this many
# Fewest writers of one batch on one filesystem for which a syncfs replaces their fdatasyncs.
SHARED_SYNC_MIN_FILES = 2
# syncfs errors that mean "not here" (an old kernel, a sandbox's filter), not a failed write-back.
_NO_SYNCFS_ERRNOS = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.EOPNOTSUPP})
Call = tuple[Callable[..., None], tuple[Any, ...]]
_T = TypeVar("_T")

_pools: weakref.WeakSet[WriterPool] = weakref.WeakSet()


def default_threads(shared_sync: bool) -> int:
    """2 where one syncfs makes a whole batch durable: more threads only fight over the GIL (with 1,000 topics
    written at once, 2 threads published a third more than 8 on 2 CPUs, and used half the CPU per batch).
    8 where every file needs its own fdatasync: those overlap well up to about 8 on one disk, whatever the
    number of CPUs (a quarter more than 4 with 1,000 topics)."""
    return 2 if shared_sync else 8


def default_max_open_files() -> int:
    """A quarter of the process's file descriptor limit, at most 8,192."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, min(8192, soft // 4))


class WriterPool:
    def __init__(
        self,
        threads: int = 0,
        *,
        idle_close_s: float = 30.0,
        max_open_files: int = 0,
        name: str = "wal-writer",
        shared_sync: bool = True,
    ) -> None:
        """`threads` 0: default_threads(shared_sync); `max_open_files` 0: default_max_open_files();
        `shared_sync`: one syncfs for a batch's files where the platform has a usable one (else always an
        fdatasync each)."""
        check_pool_settings(threads, idle_close_s, max_open_files)
        self.shared_sync = shared_sync and durable.syncfs is not None
        self.threads = threads or default_threads(self.shared_sync)
        self.idle_close_s = idle_close_s
        self.max_open_files = max_open_files or default_max_open_files()
        self.name = name
        self.lock = threading.Condition(threading.Lock())
        self._ready: deque[WalWriter] = deque()  # writers waiting for a turn (each at most once)
        self._timers: list[tuple[float, int, WalWriter]] = []  # heap; stale entries are skipped
        self._seq = 0
        self._open: OrderedDict[WalWriter, float] = OrderedDict()  # fd open -> last written (monotonic)
        self._waiting = 0  # threads waiting on the lock's condition
        self.lingers = 0  # turns a thread waited for more appends before taking (linger.py)
        self._writers = 0
        self._closed = False
        self._checkpoint_next = 0.0  # the next free slot of the checkpoint budget (monotonic)
        self._threads: list[threading.Thread] = []
        _pools.add(self)

    # ---- loop side / any thread ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "threads": len(self._threads),
                "writers": self._writers,
                "open_files": len(self._open),
                "ready": len(self._ready),
            }

    def register(self, writer: WalWriter) -> None:
        """A new writer joins (the threads start with the first one)."""
        with self.lock:
            if self._closed:
                raise StorageError("the WAL writer pool is closed")
            writer.registered = True
            self._writers += 1
            self.finished(writer, stopped=False)  # arms its timer (a checkpoint owed since the open)
            if not self._threads:
                for i in range(self.threads):
                    thread = threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
                    self._threads.append(thread)
                    thread.start()
            elif self._waiting:
                self.lock.notify()  # a waiting thread must see the new timer

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the threads once no turn is pending (close every WAL first); True if they all ended."""
        with self.lock:
            self._closed = True
            self.lock.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def reserve_checkpoint(self, now: float) -> float:
        """Reserve a slot of the checkpoint budget: when the caller may write its checkpoint (now, or
        later when many WALs want one at once)."""
        step = 1.0 / CHECKPOINTS_PER_SECOND
        with self.lock:
            slot = max(now - 1.0 + step, self._checkpoint_next)  # up to a second's worth at once
            self._checkpoint_next = slot + step
        if slot > now and self.shared_sync:
            # Spaced-out slots come in groups that fall due together, so their checkpoints tend to share
            # a batch and its syncfs (write_checkpoints) rather than cost an fdatasync each.
            grid = CHECKPOINT_GROUP * step
            slot = math.ceil(slot / grid) * grid
        return max(now, slot)

    # ---- called with `lock` held -----------------------------------------------------------------

    def wake(self, writer: WalWriter) -> None:
        """Give `writer` a turn (unless it has one already)."""
        if not writer.busy:
            writer.busy = True
            self._ready.append(writer)
            if self._waiting:
                self.lock.notify()

    def finished(self, writer: WalWriter, *, stopped: bool) -> None:
        """`writer`'s turn ended and it wants no other now: arm its timer, or forget it when stopped."""
        writer.busy = False
        if stopped:
            writer.timer_at = None
            self._open.pop(writer, None)
            if writer.registered:
                writer.registered = False
                self._writers -= 1
            return
        at = writer.deadline()
        if at is not None and at != writer.timer_at:
            writer.timer_at = at
            self._seq += 1
            heapq.heappush(self._timers, (at, self._seq, writer))

    def requeue(self, writer: WalWriter) -> None:
        """`writer` wants another turn right away (it stays busy). Called by the pool thread ending its
        turn, which takes a batch again next (and wakes an idle thread then if work is left over): waking
        one here would mostly have it find the queue already empty (a context switch per group)."""
        self._ready.append(writer)

    def note_open(self, writer: WalWriter, now: float) -> None:
        """`writer` wrote to its open segment file now (it becomes the most recently written)."""
        self._open[writer] = now
        self._open.move_to_end(writer)

    def note_closed(self, writer: WalWriter) -> None:
        self._open.pop(writer, None)

    # ---- pool threads ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.lock:
                batch = self._take_batch()
            if batch is None:
                return
            self._turn(batch)

    def _take_batch(self) -> list[WalWriter] | None:
        ready = self._ready
        while True:
            now = time.monotonic()
            self._due(now)
            if len(ready) == 1 and not ready[0].lingered_this_turn and ready[0].lingers():
                # This writer is the only work and its appends come close together: wait a moment so that
                # one flush serves more of them (linger.py). The lock is released meanwhile;
                # appends to a writer already in the ready queue wake nobody.
                writer = ready[0]
                writer.lingered_this_turn = True
                queued = writer.queued()
                self.lock.wait(writer.linger_s)
                self.lingers += 1
                writer.lingered(writer.queued() > queued)
                continue  # it may have been taken by another thread meanwhile, or stopped
            if ready:
                if self.shared_sync:
                    n = min(BATCH_WRITERS_SHARED, len(ready))  # one syncfs makes the whole batch durable
                else:
                    n = min(BATCH_WRITERS, -(-len(ready) // (self._waiting + 1)))  # work for the idle too
                batch = [ready.popleft() for _ in range(n)]
                for writer in batch:
                    writer.lingered_this_turn = False
                    writer.take(now)
                if ready and self._waiting:
                    self.lock.notify()
                return batch
            if self._closed:
                return None
            wait = self._next_due(now)
            self._waiting += 1
            try:
                self.lock.wait(wait)
            finally:
                self._waiting -= 1

    def _due(self, now: float) -> None:
        """Turns for writers whose timer is due, and for those whose file must be closed."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, writer = heapq.heappop(timers)
            if writer.timer_at == at:
                writer.timer_at = None
                self.wake(writer)
        opened = self._open
        idle_before = now - self.idle_close_s
        while opened:
            writer, last = next(iter(opened.items()))
            if last > idle_before and len(opened) <= self.max_open_files:
                break
            del opened[writer]
            writer.close_requested = True
            self.wake(writer)

    def _next_due(self, now: float) -> float | None:
        at = self._timers[0][0] if self._timers else None
        if self._open:
            idle_at = next(iter(self._open.values())) + self.idle_close_s
            at = idle_at if at is None else min(at, idle_at)
        return None if at is None else max(0.0, at - now)

    def _turn(self, batch: list[WalWriter]) -> None:
        for writer in batch:
            writer.turn_write()
        if self.shared_sync and len(batch) >= SHARED_SYNC_MIN_FILES:
            self._sync_shared(batch)
        for writer in batch:
            writer.turn_sync()
        _send(_collect(batch))  # every append of the batch is durable now: complete them
        self._checkpoints(batch)
        for writer in batch:
            writer.turn_after()
        calls = _collect(batch)  # taken while the writers are still this thread's
        with self.lock:
            now = time.monotonic()
            for writer in batch:
                writer.turn_end(now)
        _send(calls)  # after turn_end: a stopped writer is out of the pool's books when its WAL hears

    def _sync_shared(self, batch: list[WalWriter]) -> None:
        """One syncfs per filesystem for the writers that owe an fdatasync, where enough of them share it."""
        syncfs = durable.syncfs
        assert syncfs is not None
        owing = [(device, writer) for writer in batch if (device := writer.owes_sync()) is not None]
        for writers in _by_device(owing).values():
            if len(writers) < SHARED_SYNC_MIN_FILES:
                continue
            try:
                started = time.monotonic()
                syncfs(writers[0].sync_fd())
                wal_fsync.observe(time.monotonic() - started)
            except OSError as exc:
                # Each writer fdatasyncs its own file instead (turn_sync), which reports a write-back error
                # for the file it concerns.
                if exc.errno in _NO_SYNCFS_ERRNOS:
                    self.shared_sync = False
                    log.warning("WAL writer pool: syncfs is not usable here (%s); fdatasync per file", exc)
                    return
                log.warning("WAL writer pool: syncfs failed (%s); each file is fdatasync'd instead", exc)
                continue
            for writer in writers:
                writer.presynced()

    def _checkpoints(self, batch: list[WalWriter]) -> None:
        """Record the checkpoints due in the batch: where enough of them share a filesystem, all at once
        with one syncfs (write_checkpoints), else each with its own flush."""
        due = [(writer, cp) for writer in batch if (cp := writer.checkpoint_due()) is not None]
        if not due:
            return
        groups: dict[int | None, list[tuple[WalWriter, Checkpoint]]]
        if self.shared_sync and len(due) >= SHARED_SYNC_MIN_FILES:
            groups = _by_device([(writer.device, (writer, cp)) for writer, cp in due])
        else:
            groups = {None: due}
        syncfs = durable.syncfs
        for device, items in groups.items():
            if device is not None and syncfs is not None and len(items) >= SHARED_SYNC_MIN_FILES:
                try:
                    failed = write_checkpoints([(w.checkpoint_file, cp) for w, cp in items], syncfs)
                except OSError as exc:
                    log.warning("WAL writer pool: syncfs failed (%s); checkpoints written one by one", exc)
                except Exception:  # nothing may end a pool thread: each is written on its own instead
                    log.exception("WAL writer pool: writing checkpoints together failed")
                else:
                    for (writer, cp), error in zip(items, failed, strict=True):
                        if error is None:
                            writer.checkpoint_recorded(cp)
                        else:
                            writer.checkpoint_failed(error)
                    continue
            for writer, cp in items:
                writer.record_checkpoint(cp)


def _by_device(items: Iterable[tuple[int | None, _T]]) -> dict[int | None, list[_T]]:
    """Group (filesystem device, item) pairs by device: one syncfs serves each group (None: unknown)."""
    groups: dict[int | None, list[_T]] = {}
    for device, item in items:
        groups.setdefault(device, []).append(item)
    return groups


def _collect(batch: list[WalWriter]) -> dict[asyncio.AbstractEventLoop, list[Call]]:
    """Take the completions the batch's writers collected, by event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Call]] = {}
    for writer in batch:
        if writer.posts:
            by_loop.setdefault(writer.loop, []).extend(writer.posts)
            writer.posts = []
    return by_loop


def _send(by_loop: dict[asyncio.AbstractEventLoop, list[Call]]) -> None:
    """Hand completions to their event loops, one call per loop."""
    for loop, calls in by_loop.items():
        try:
            loop.call_soon_threadsafe(_run_calls, calls)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            log.debug("wal writer pool: event loop closed, dropping %d completions", len(calls))


def _run_calls(calls: list[Call]) -> None:
    for callback, args in calls:
        try:
            callback(*args)
        except Exception:
            log.exception("WAL completion callback failed")


_default_lock = threading.Lock()
_default: WriterPool | None = None


def default_pool() -> WriterPool:
    """The process-wide pool `Wal.open` uses when given none (never closed; its threads are daemons)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WriterPool()
        return _default


open_segment_files = Gauge(
    "ister_wal_open_segment_files",
    "WAL segment files open for writing (WALs written within wal.idle_close_seconds, at most "
    "wal.max_open_segments)",
)
open_segment_files.set_function(lambda: sum(len(p._open) for p in list(_pools)))
writer_threads = Gauge("ister_wal_writer_threads", "Threads of the WAL writer pool(s)")
writer_threads.set_function(lambda: sum(len(p._threads) for p in list(_pools)))
wal_writers = Gauge("ister_wal_writers", "Open WALs served by the writer pool(s)")
wal_writers.set_function(lambda: sum(p._writers for p in list(_pools)))
wal_fsync = histogram(
    "ister_wal_fsync_seconds",
    "Syncs that made WAL writes durable: one fdatasync of a segment file, or one syncfs covering several "
    "WALs' files (fsync: always; interval mode's periodic fdatasyncs too)",
    threadsafe=True,
)
