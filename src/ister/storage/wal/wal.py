"""The per-topic write-ahead log: opening (recovery), appends, readers, closing.

`Wal` joins its parts, each with one responsibility (their state is `WalState`'s, walstate.py): here the
open, the appends and their offsets, the frames kept for followers and the close; `completions.py` what
the writer reports back; `cuts.py` truncation and reset; `walfiles.py` the segment files (listing,
dropping, verifying). The writing itself is `writer.py`'s, run by the shared pool (pool.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from ister.core.frames import HEADER_SIZE, encode_frames
from ister.errors import Fenced, IsterError, OffsetOutOfRange, StorageError

from .cache import CacheBudget
from .completions import WalCompletions
from .config import WalConfig
from .cuts import WalCuts
from .entry import Entry
from .frametail import FrameRun, FrameTail
from .pool import WriterPool, default_pool
from .reader import WalReader
from .segment import Recovered, recover
from .walfiles import WalFiles
from .writer import WalWriter

log = logging.getLogger(__name__)


class Wal(WalFiles, WalCuts, WalCompletions):
    """Append-only log of opaque payloads with dense offsets, stored in segment files under `directory`.

    All methods must be called from the event loop the WAL was opened on. Offsets are assigned at call time
    in call order; an append resolves once its frames are durable (fsync=always) or written (interval).
    Writing is done by a `WriterPool` shared with other WALs (pool.py); an open WAL costs no thread and,
    while it is not being written, no file descriptor.
    """

    __slots__ = ()  # all in WalState (walstate.py)

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
        super().__init__(directory, config, recovered, loop, label, cache_budget)
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

    # ---- writing ---------------------------------------------------------------------------------

    async def append(
        self,
        payloads: Sequence[bytes],
        *,
        at: int | None = None,
        assigned: Callable[[int], None] | None = None,
    ) -> int:
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
        `assigned(first)` is called once the offsets are taken: from then on the records are written even if
        the caller goes away (unless the writer refuses them with DiskFull / StorageExhausted).
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
        return await self._submit(first, count, data, items, reserved, assigned)

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
        self,
        first: int,
        count: int,
        data: bytes,
        payloads: list[bytes] | None,
        reserved: bool,
        assigned: Callable[[int], None] | None = None,
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
        if assigned is not None:
            assigned(first)
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
