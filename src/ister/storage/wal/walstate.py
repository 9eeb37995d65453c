"""A WAL's state on the event loop: its offsets, the queries on them, and the flush and rotation requests.

`WalState` holds every attribute of a `Wal`: one `__slots__` for all its parts (wal.py lists them).
All run on the loop the WAL was opened on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ister.errors import StorageError

from .backpressure import QueuedBytes
from .cache import CacheBudget, RecordCache
from .config import WalConfig
from .entry import Entry
from .frametail import FrameTail
from .holes import Holes
from .segment import Recovered, Segment
from .writer import WalWriter


class WalState:
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

    _writer: WalWriter  # made by `Wal.__init__`, which has the callbacks the parts define

    def __init__(
        self,
        directory: Path,
        config: WalConfig,
        recovered: Recovered,
        loop: asyncio.AbstractEventLoop,
        label: str,
        cache_budget: CacheBudget | None,
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

    def idle_seconds(self) -> float:
        """Seconds since records were last committed (since the open, when none were)."""
        return self._loop.time() - self._last_append

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

    def _wake_readers(self) -> None:
        waiters = list(self._read_waiters)
        self._read_waiters.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
