"""Cutting a WAL (replicas): `truncate` drops the records from an offset on, `reset` restarts it empty.

The loop side of a cut: appends are refused and readers wait while it runs, then the WAL's offsets, cache,
kept frames and holes move to the cut's end and readers past it learn they were cut (`WalReader`). The
writer carries the cut out on disk (`segfiles.py`, `truncate.py`).
"""

from __future__ import annotations

import asyncio

from .entry import Entry
from .walstate import WalState

MAX_CUTS_KEPT = 64  # a reader that missed more cuts than this is treated as cut (raises LogTruncated)


class WalCuts(WalState):
    __slots__ = ()

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
