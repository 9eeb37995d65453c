"""The per-topic write-ahead log: offset assignment, group commit, cache, readers, recovery."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ister.core.frames import HEADER_SIZE, encode_frames
from ister.errors import Fenced, IsterError, OffsetOutOfRange, StorageError, StorageExhausted

from .backpressure import QueuedBytes
from .cache import CacheBudget, RecordCache
from .config import WalConfig
from .durable import fsync_dir
from .entry import Entry
from .frametail import FrameRun, FrameTail
from .holes import Hole, Holes
from .pool import WriterPool, default_pool
from .reader import WalReader, verify_segment
from .segment import Recovered, Segment, recover
from .writer import WalWriter

log = logging.getLogger(__name__)

MAX_CUTS_KEPT = 64  # a reader that missed more cuts than this is treated as cut (raises LogTruncated)


class Wal:
    """Append-only log of opaque payloads with dense offsets, stored in segment files under `directory`.

    All methods must be called from the event loop the WAL was opened on. Offsets are assigned at call time
    in call order; an append resolves once its frames are durable (fsync=always) or written (interval).
    Writing is done by a `WriterPool` shared with other WALs (pool.py); an open WAL costs no thread and,
    while it is not being written, no file descriptor.
    """

    # slots: one per reliable topic; a __dict__ with these attributes would cost ~1 KB each
    __slots__ = (
        "_cache",
        "_close_task",
        "_closed",
        "_closing",
        "_committed",
        "_config",
        "_cut_count",
        "_cut_gen",
        "_cuts",
        "_cutting",
        "_directory",
        "_failed",
        "_first_offset",
        "_frame_tail",
        "_last_append",
        "_loop",
        "_next_offset",
        "_read_waiters",
        "_release",
        "_segments",
        "_segments_lock",
        "_space",
        "_stopped",
        "_synced",
        "_visible",
        "_writer",
        "damage",
        "label",
        "lost_ranges",
        "offset_limit",
        "on_committed",
        "truncated",
    )

    def __init__(
        self,
        directory: Path,
        config: WalConfig,
        recovered: Recovered,
        loop: asyncio.AbstractEventLoop,
        label: str,
        pool: WriterPool,
        cache_budget: CacheBudget | None = None,
    ) -> None:
        self._directory = directory
        self._config = config
        self._loop = loop
        self._segments: list[Segment] = recovered.segments
        self._segments_lock = threading.Lock()
        self._first_offset = recovered.first_offset
        # Set through `limit_offsets` by the topic's claim: appends that would reach this offset are refused.
        self.offset_limit: int | None = None
        self._next_offset = recovered.next_offset
        self._committed = recovered.next_offset
        self._synced = recovered.next_offset
        # A replicated topic's leader caps what readers see at the replication commit (None: no cap, every
        # durable record is visible). Only `durable_offset` readers (followers' fetches) see past it.
        self._visible: int | None = None
        self._cache = RecordCache(config.cache_max_bytes, cache_budget)
        self._last_append = loop.time()  # when records were last committed (or the WAL opened)
        self._cache.reset(recovered.next_offset)
        self._frame_tail: FrameTail | None = None  # kept only while a replicated topic's leader asks
        self._space = QueuedBytes(loop, config.max_queued_bytes)  # back-pressure on appends
        self._read_waiters: set[asyncio.Future[None]] = set()
        # Called on the loop whenever readers can see more records (a commit, or the visible cap moving up),
        # with the WAL's state already updated and before the appenders' futures resolve (the topic wakes
        # its subscriptions from here).
        self.on_committed: Callable[[], None] | None = None
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._failed: StorageError | None = None
        self.truncated = recovered.truncated  # (path, old size, new size) repaired at open
        self.label = label
        self.damage = Holes(label)  # lost and damaged ranges (logged at open by recovery, counted here)
        for hole in recovered.holes:
            self.damage.add(hole.first, hole.end, lost=hole.lost, why=hole.why)
        # (first, end) ranges lost below the high-water mark (found at this open or recorded by an earlier
        # one): acknowledged once, stored nowhere locally now
        self.lost_ranges: list[tuple[int, int]] = [(h.first, h.end) for h in recovered.holes if h.lost]
        self._release = recovered.release
        self._stopped: asyncio.Future[None] | None = None  # resolved by the writer at the end of close()
        self._cutting = False  # a truncate/reset runs: appends are refused, readers wait
        self._cut_gen = 0  # bumped when a cut starts: a file read that overlapped one is done again
        self._cut_count = 0  # cuts made (or attempted) so far: readers compare it with what they saw
        self._cuts: list[int] | None = None  # the ends of the newest MAX_CUTS_KEPT cuts (None: none yet)
        self._writer = WalWriter(
            pool,
            loop,
            config,
            directory,
            self._segments,
            self._segments_lock,
            self._on_commit,
            self._on_failure,
            self._on_refused,
            self._on_writer_stopped,
            self.damage.lost_ranges,
            0 if recovered.mark is None else recovered.mark,  # None: an empty new WAL, nothing to keep
            self._on_cut,
        )

    @classmethod
    async def open(
        cls,
        directory: Path,
        config: WalConfig | None = None,
        *,
        start_offset: int = 0,
        label: str | None = None,
        pool: WriterPool | None = None,
        lock_root: Path | None = None,
        cache_budget: CacheBudget | None = None,
    ) -> Wal:
        """Open (creating if needed) and recover the WAL in `directory`. See docs/formats.md.

        `label` names the WAL in logs and in the `topic` label of its metrics; by default
        `/<parent dir>/<dir>`, which is the topic's full name in the broker's `wal/<ns>/<topic>` layout.
        `pool` writes it (default: the process-wide pool). `lock_root` is the directory whose `flock` keeps
        other processes out (locks.py; default: `directory` itself; a broker passes `<data_dir>/wal`, one
        descriptor for all its WALs). `cache_budget` caps the record caches of all the WALs given it
        together (cache.py). A second `Wal` on the same directory raises StorageError.
        """
        if start_offset < 0:
            raise ValueError("start_offset must be >= 0")
        config = config if config is not None else WalConfig()
        directory = Path(directory)
        loop = asyncio.get_running_loop()
        recovery = asyncio.ensure_future(
            asyncio.to_thread(
                recover,
                directory,
                start_offset,
                index_every_frames=config.index_every_frames,
                index_every_bytes=config.index_every_bytes,
                lock_root=lock_root,
            )
        )
        try:
            recovered = await asyncio.shield(recovery)
        except asyncio.CancelledError:
            # The recovery runs on in its thread and takes the directory's lock: without this the lock
            # would stay taken by nobody and every later open of the directory would fail.
            recovery.add_done_callback(_release_recovered)
            raise
        try:
            label = label or f"/{directory.parent.name}/{directory.name}"
            wal = cls(directory, config, recovered, loop, label, pool or default_pool(), cache_budget)
            wal._writer.start()
        except BaseException:
            recovered.release()
            raise
        return wal

    # ---- state -----------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def config(self) -> WalConfig:
        return self._config

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def committed_offset(self) -> int:
        """Records below this are durable here and visible to readers (for a replicated topic's leader:
        also on enough replicas, see `cap_visible`)."""
        visible = self._visible
        return self._committed if visible is None or visible > self._committed else visible

    @property
    def durable_offset(self) -> int:
        """Records below this are durable on this broker's disk (visible or not)."""
        return self._committed

    @property
    def visible_cap(self) -> int | None:
        return self._visible

    def cap_visible(self, end: int | None) -> None:
        """Readers see offsets below `end` only (None: no cap). A replicated topic's leader moves it to the
        replication commit; it never goes back while set."""
        if end is not None and self._visible is not None and end < self._visible:
            raise ValueError(f"the visible end of {self.label} cannot go back ({self._visible} -> {end})")
        before = self.committed_offset
        self._visible = end
        if self._read_waiters:
            self._wake_readers()
        if self.on_committed is not None and self.committed_offset > before:
            self.on_committed()

    @property
    def synced_offset(self) -> int:
        """All offsets below this were fdatasync'd (== committed_offset in fsync=always mode)."""
        return self._synced

    @property
    def first_offset(self) -> int:
        return self._first_offset

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def failed(self) -> StorageError | None:
        return self._failed

    def holes(self) -> list[tuple[int, int]]:
        """(first, end) offset ranges, end exclusive, that the local WAL cannot serve although they are at
        or above its first offset: lost at open (below the high-water mark) or damaged in a segment file.
        Readers skip them (a TieredReader reads them from the durable tier when it holds them)."""
        return self.damage.ranges()

    def hole_at(self, offset: int) -> Hole | None:
        return self.damage.find(offset) if self.damage else None

    async def verify_segment(self, first_offset: int) -> list[Hole]:
        """Read every committed frame of the segment that starts at `first_offset` (CRC checked), recording
        each damaged range found in `damage` (logged and counted once); returns the new ones."""
        seg = next((s for s in self.segments_snapshot() if s.first_offset == first_offset), None)
        if seg is None or self._cutting:
            return []
        gen = self._cut_gen
        return await verify_segment(seg, self._committed, self.damage, lambda: self._cut_gen == gen)

    @property
    def active_bytes(self) -> int:
        """Bytes in the active (last) segment file."""
        with self._segments_lock:
            return self._segments[-1].size

    @property
    def segment_count(self) -> int:
        with self._segments_lock:
            return len(self._segments)

    def idle_seconds(self) -> float:
        """Seconds since records were last committed (since the open, when none were)."""
        return self._loop.time() - self._last_append

    def segments(self) -> list[tuple[int, Path, int]]:
        """(first_offset, path, size in bytes) of every segment file, oldest first; the last is active."""
        return [(s.first_offset, s.path, s.size) for s in self.segments_snapshot()]

    def record_ranges(self) -> list[tuple[int, int]]:
        """[first, end) offsets of the records each non-empty segment file holds, oldest first."""
        return [
            (s.first_offset, s.end_offset) for s in self.segments_snapshot() if s.end_offset > s.first_offset
        ]

    async def drop_segments(self, paths: Sequence[Path]) -> int:
        """Delete closed segment files from the oldest end (the durable tier holds their records).

        Only a leading run of closed segments is dropped (never the active one, never a gap in the middle);
        the WAL's first offset moves to the first remaining segment. Readers below it get OffsetOutOfRange
        (the tiered reader then reads from objects). Returns how many files were deleted.
        """
        if self._cutting:
            return 0  # the cut decides which files stay; retention asks again later
        wanted = {Path(p) for p in paths}
        with self._segments_lock:
            drop = []
            for seg in self._segments[:-1]:
                if seg.path not in wanted:
                    break
                drop.append(seg)
            if not drop:
                return 0
            del self._segments[: len(drop)]
            self._first_offset = self._segments[0].first_offset
        self.damage.prune(self._first_offset)
        await asyncio.to_thread(_unlink_all, [s.path for s in drop], self._directory)
        return len(drop)

    async def drop_below(self, start: int) -> int:
        """Delete the closed segment files wholly below `start` (retention moved the topic's start offset
        past them); returns how many."""
        segments = self.segments()
        paths = [segments[i][1] for i in range(len(segments) - 1) if segments[i + 1][0] <= start]
        return await self.drop_segments(paths) if paths else 0

    def stats(self) -> dict[str, Any]:
        segments = self.segments_snapshot()
        return {
            "next_offset": self._next_offset,
            "committed_offset": self._committed,
            "synced_offset": self._synced,
            "first_offset": self._first_offset,
            "segments": len(segments),
            "segment_bytes": sum(s.size for s in segments),
            "cache_bytes": self._cache.nbytes,
            "cache_first_offset": self._cache.first_offset,
            "queued_bytes": self._space.queued,
            "holes": self.damage.ranges(),
            "failed": self._failed is not None,
            "closed": self._closing,
        }

    def segments_snapshot(self) -> list[Segment]:
        with self._segments_lock:
            return list(self._segments)

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise StorageError(f"wal failed: {self._failed}")
        if self._closing:
            raise StorageError("wal closed")
        if self._cutting:
            raise StorageError("wal is being truncated")

    def _finished_error(self) -> StorageError | None:
        """The error readers get once they have read everything: None while more may still come."""
        if self._failed is not None:
            return StorageError(f"wal failed: {self._failed}")
        if self._closed:
            return StorageError("wal closed")
        return None

    # ---- writing ---------------------------------------------------------------------------------

    async def append(self, payloads: Sequence[bytes], *, at: int | None = None) -> int:
        """Append records with consecutive offsets; returns the first offset once they are committed.

        Offsets are assigned when the call starts (after waiting for queue space, if the writer is more than
        max_queued_bytes behind), so concurrent callers get increasing offsets in call order. Resolves after
        fdatasync (fsync="always") or after write (fsync="interval"). Raises ValueError for an empty list or
        an oversize payload and StorageError after close() or a writer failure; in those cases no offset is
        consumed. Raises DiskFull (retriable) while the disk is full, StorageExhausted (retriable) while no
        file descriptor is left to open a segment: nothing of the append stays on disk and its offsets are
        handed back (never acknowledged, they go to later appends). If the caller is
        cancelled after the offsets were assigned, the records are still written. With `at` (a follower
        copying its leader's offsets), StorageError unless the records get exactly offsets from `at`.
        """
        count = len(payloads)
        if count == 0:
            raise ValueError("append needs at least one payload")
        if at is not None:
            self._check_at(at)
        self._check_limit(self._next_offset, count)
        if self._failed is not None or self._closing or self._cutting:
            self._check_writable()
        items = list(payloads)
        first = self._next_offset
        data = encode_frames(first, items)  # ValueError on an oversize payload: no offset consumed
        size = len(data)
        reserved = await self._space.reserve(size)
        if reserved:
            try:
                self._check_writable()
            except StorageError:
                self._space.release(size)
                raise
            if self._next_offset != first:
                first = self._next_offset
                try:
                    if at is not None:
                        self._check_at(at)
                    self._check_limit(first, count)
                except (Fenced, StorageError):
                    self._space.release(size)
                    raise
                data = encode_frames(first, items)
        return await self._submit(first, count, data, items, reserved)

    async def append_frames(self, first: int, count: int, frames: bytes) -> int:
        """Append `count` frames already encoded (a follower's copy of its leader's, offsets from `first`);
        returns `first` once they are committed. The frames are written as they are and not cached (nothing
        reads a follower's copy until it leads). StorageError unless `first` is the next offset; otherwise
        as `append`."""
        if count < 1 or len(frames) < HEADER_SIZE * count:
            raise ValueError(f"{count} frames in {len(frames)} bytes")
        self._check_at(first)
        self._check_limit(first, count)
        if self._failed is not None or self._closing or self._cutting:
            self._check_writable()
        reserved = await self._space.reserve(len(frames))
        if reserved:
            try:
                self._check_writable()
                self._check_at(first)
            except StorageError:
                self._space.release(len(frames))
                raise
        return await self._submit(first, count, frames, None, reserved)

    async def _submit(
        self, first: int, count: int, data: bytes, payloads: list[bytes] | None, reserved: bool
    ) -> int:
        """Hand the frames to the writer, take their offsets, and wait until they are committed."""
        size = len(data)
        future: asyncio.Future[int] = self._loop.create_future()
        try:
            self._writer.submit(Entry(first, count, data, payloads, size - HEADER_SIZE * count, future))
        except StorageError:
            if reserved:
                self._space.release(size)
            raise
        self._next_offset = first + count
        if not reserved:
            self._space.add(size)
        return await future

    def _check_at(self, first: int) -> None:
        if first != self._next_offset:
            raise StorageError(
                f"WAL {self._directory.name}: records for offset {first} do not follow its end "
                f"{self._next_offset} (an earlier append was refused)"
            )

    def keep_frames(self, max_bytes: int) -> None:
        """Keep the frames of about the last `max_bytes` of committed appends for `frames` (0: stop)."""
        if max_bytes <= 0:
            self._frame_tail = None
        elif self._frame_tail is None:
            self._frame_tail = FrameTail(max_bytes)
        else:
            self._frame_tail.max_bytes = max_bytes

    def frames(self, start: int, end: int, max_records: int, max_bytes: int) -> FrameRun | None:
        """The frames of whole committed appends from `start`, below `end` (see `FrameTail.take`)."""
        tail = self._frame_tail
        return None if tail is None else tail.take(start, min(end, self._committed), max_records, max_bytes)

    def frames_start(self, start: int, end: int) -> int:
        """Where kept frames begin after `start` (`end` if not before): a reader stops its records there."""
        first = self._frame_tail.first_offset if self._frame_tail is not None else None
        return first if first is not None and start < first < end else end

    def trim_frames(self, below: int) -> None:
        if self._frame_tail is not None:
            self._frame_tail.trim(below)

    def limit_offsets(self, end: int | None) -> None:
        """Refuse appends that would assign an offset at or above `end` (None: no limit). A claim uses it to
        confine appends to its reservation, and to stop them at once when it is revoked."""
        self.offset_limit = end

    def _check_limit(self, first: int, count: int) -> None:
        if self.offset_limit is not None and first + count > self.offset_limit:
            raise Fenced(
                f"WAL {self._directory.name}: offsets up to {first + count - 1} are outside this owner's "
                f"reservation (ends before {self.offset_limit})"
            )

    async def flush(self) -> None:
        """Wait until everything appended so far is fdatasync'd (in both fsync modes)."""
        if self._failed is not None:
            raise StorageError(f"wal failed: {self._failed}")
        if self._synced >= self._next_offset:
            return
        future: asyncio.Future[int] = self._loop.create_future()
        self._writer.submit(Entry(self._next_offset, 0, b"", [], 0, future))
        await future

    async def rotate(self) -> None:
        """Close the active segment (if it holds anything) and start a new one: a quiet topic's last
        records then sit in a closed segment the durable tier can export."""
        self._check_writable()
        future: asyncio.Future[int] = self._loop.create_future()
        self._writer.rotate_requested = True
        self._writer.submit(Entry(self._next_offset, 0, b"", [], 0, future))
        await future

    # ---- cutting (replicas) ----------------------------------------------------------------------

    async def truncate(self, end: int) -> None:
        """Cut the log so that `next_offset == end`: the records at offsets >= end are gone for good, and
        the next append gets `end` (a follower replica drops records its leader never committed).

        `first_offset <= end <= next_offset`, else ValueError (nothing changes); `end == next_offset` does
        nothing. Appends already made are flushed first; appends, rotate() and truncate()/reset() called
        while it runs raise StorageError ("being truncated"), drop_segments() drops nothing. Readers
        positioned past `end` raise LogTruncated from their next read (never a stale record); readers at or
        below it go on. Holes and lost ranges at or above `end` are forgotten. Crash-safe (truncate.py):
        a crash at any point reopens as the old log or the truncated one. A disk error raises StorageError
        and fails the WAL (reopen it: it is then old or truncated, as after a crash). If the caller is
        cancelled once the cut was handed to the writer, the cut still completes.
        """
        if not self._first_offset <= end <= self._next_offset:
            raise ValueError(
                f"truncate to {end}: the WAL holds offsets {self._first_offset}..{self._next_offset - 1}"
            )
        await self._cut(end, reset=False)

    async def reset(self, start: int) -> None:
        """Drop every record and restart the log empty at `start` (any offset >= 0): first_offset ==
        next_offset == start. For a replica that must follow a leader whose log starts elsewhere (its
        older records are in the durable tier), or whose own log cannot be trusted. Every segment file is
        deleted (unlike `open(start_offset=...)`, which keeps older files and never moves backwards), the
        high-water checkpoint is rewritten to `start` with no lost range. Readers below `start` get
        OffsetOutOfRange, past it LogTruncated; the rest as for `truncate`, also crash-safety."""
        if start < 0:
            raise ValueError("start must be >= 0")
        await self._cut(start, reset=True)

    async def _cut(self, end: int, *, reset: bool) -> None:
        self._check_writable()
        self._cutting = True
        self._cut_gen += 1
        future: asyncio.Future[int] | None = None
        try:
            await self.flush()  # appends already made are durable first: the cut keeps what is below end
            if not reset:
                if not self._first_offset <= end <= self._next_offset:  # refused appends handed offsets back
                    raise ValueError(f"truncate to {end}: the WAL now ends at {self._next_offset}")
                if end == self._next_offset:
                    return
            future = self._loop.create_future()
            self._writer.submit_cut(end, reset, Entry(end, 0, b"", [], 0, future))
            future.add_done_callback(self._cut_finished)  # runs after _on_cut, whatever the outcome
        finally:
            if future is None:
                self._cut_finished(None)
        await asyncio.shield(future)

    def _cut_finished(self, _: asyncio.Future[int] | None) -> None:
        self._cutting = False
        self._wake_readers()

    def _on_cut(self, end: int, reset: bool) -> None:
        """The writer cut the log to `end` (or tried: then the WAL fails right after; readers must not see
        records above `end` either way)."""
        self._next_offset = end
        self._committed = self._synced = end
        if reset:
            self._first_offset = end
            self._cache.reset(end)
            self.damage.prune(end)
        else:
            self._cache.truncate(end)
        if self._frame_tail is not None:
            if reset:
                self._frame_tail.clear()
            else:
                self._frame_tail.truncate(end)
        self.damage.cut(end)
        self.lost_ranges = [(a, min(b, end)) for a, b in self.lost_ranges if a < end and not reset]
        self._cut_count += 1
        cuts = self._cuts if self._cuts is not None else []
        cuts.append(end)
        del cuts[:-MAX_CUTS_KEPT]
        self._cuts = cuts
        self._wake_readers()

    # ---- completions from the writer thread (run on the loop) ------------------------------------

    def _on_commit(self, group: list[Entry], committed: int, synced: int, nbytes: int) -> None:
        # One cache chunk per group: O(1) Python work per append, not per record. The payload lists are
        # private copies made by append(), so the first one can be extended in place.
        visible_before = self.committed_offset
        chunk: list[bytes] | None = None
        chunk_first = 0
        chunk_bytes = 0
        tail = self._frame_tail
        for entry in group:
            if entry.count:
                if tail is not None:
                    tail.add(entry.first_offset, entry.count, entry.data)
                payloads = entry.payloads
                if payloads is None:  # frames appended as they came (a follower's): not cached
                    if chunk is not None:
                        self._cache.add(chunk_first, chunk, chunk_bytes)
                        chunk, chunk_bytes = None, 0
                    self._cache.reset(entry.first_offset + entry.count)
                else:
                    if chunk is None:
                        chunk, chunk_first = payloads, entry.first_offset
                    else:
                        chunk.extend(payloads)
                    chunk_bytes += entry.payload_bytes
        if chunk is not None:
            self._cache.add(chunk_first, chunk, chunk_bytes)
        if nbytes:
            self._last_append = self._loop.time()
        self._committed = committed
        self._synced = synced
        self._space.taken(nbytes)
        # Readers are woken before the appenders: wake-ups run in the order they are scheduled, so a live
        # consumer's delivery goes out without waiting behind the producer's acknowledgement.
        if self._read_waiters:
            self._wake_readers()
        if self.on_committed is not None and self.committed_offset > visible_before:
            self.on_committed()  # under a cap (replicated) readers see records once cap_visible lets them
        for entry in group:
            future = entry.future
            if future is not None and not future.done():
                future.set_result(entry.first_offset)
        self._space.wake()

    def _on_refused(self, entries: list[Entry], err: StorageExhausted, resume: int) -> None:
        # Every entry at or after `resume` is in `entries` (the writer refuses new ones until accept()).
        nbytes = 0
        for entry in entries:
            nbytes += len(entry.data)
            future = entry.future
            if future is not None and not future.done():
                future.set_exception(type(err)(str(err)))
        self._space.taken(nbytes)
        self._next_offset = resume
        self._writer.accept()
        self._space.wake()

    def _on_failure(self, entries: list[Entry], err: StorageError) -> None:
        self._failed = err
        for entry in entries:
            future = entry.future
            if future is not None and not future.done():
                future.set_exception(StorageError(str(err)))
        self._space.fail(err)
        self._wake_readers()

    def _on_writer_stopped(self) -> None:
        self._writer.detach()  # no cycle between the two once closed (frozen objects, broker/heap.py)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _wake_readers(self) -> None:
        waiters = list(self._read_waiters)
        self._read_waiters.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ---- reading ---------------------------------------------------------------------------------

    def reader(self, start: int, *, skip_holes: bool = True, durable: bool = False) -> WalReader:
        """A reader from `start` (first_offset <= start <= next_offset; start == next_offset reads live).

        With `skip_holes` the reader steps over lost or damaged ranges (listing them in `skipped`);
        without, it raises CorruptRange for them (the tiered reader then looks in the durable tier)."""
        if start < 0:
            raise ValueError("start must be >= 0")
        if start > self._next_offset:
            raise OffsetOutOfRange(f"offset {start} is beyond the WAL's next offset {self._next_offset}")
        return WalReader(self, start, skip_holes=skip_holes, durable=durable)

    # ---- shutdown --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush, fsync and stop the writer. Idempotent; later appends raise StorageError."""
        if self._close_task is None:
            self._closing = True  # from now on appends are refused (before any offset is assigned)
            self._close_task = self._loop.create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        self._space.fail(StorageError("wal closed"))
        try:
            if self._failed is None and self._synced < self._next_offset:
                future: asyncio.Future[int] = self._loop.create_future()
                self._writer.submit(Entry(self._next_offset, 0, b"", [], 0, future))
                await future
        except IsterError as exc:
            log.error("WAL %s: final flush failed: %s", self._directory, exc)
        finally:
            self._stopped = stopped = self._loop.create_future()
            self._writer.stop()
            try:
                await asyncio.wait_for(asyncio.shield(stopped), self._config.close_timeout_s)
                self._release()  # the directory may now be opened again
            except TimeoutError:
                log.error(
                    "WAL %s: writer did not stop within %.1fs",
                    self._directory,
                    self._config.close_timeout_s,
                )
            self._closed = True
            self._cache.reset(self._cache.end_offset)  # its memory goes back to the shared budget
            self._wake_readers()


def _release_recovered(job: asyncio.Future[Recovered]) -> None:
    if not job.cancelled() and job.exception() is None:
        job.result().release()


def _unlink_all(paths: list[Path], directory: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
    fsync_dir(directory)
