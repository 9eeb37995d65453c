"""WalReader: one ordered stream of committed records: files, then cache, then live."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ister.errors import CorruptRange, DataLoss, LogTruncated, OffsetOutOfRange, StorageError
from ister.limits import MiB

from .filereader import FilePosition, read_segments
from .frametail import FrameRun
from .holes import Hole, Holes
from .segment import Segment

if TYPE_CHECKING:
    from .wal import Wal


class WalReader:
    """Reads committed records from `next_offset` on: fsync'd ones with `fsync: always`, written ones with
    `fsync: interval`. Never repeats an offset (one next_offset across all sources) and skips only holes:
    ranges the WAL lost (below its high-water mark) or found damaged, which nothing local can serve.

    Each skip is appended to `skipped` (and to `damaged`: here every skip is a damaged or lost range) as
    (first, last), inclusive, from the reader's position; one `read` never returns records from both sides
    of a hole, so a batch is always consecutive offsets. With `skip_holes=False` a hole raises CorruptRange
    instead (the tiered reader then reads it from the durable tier). With `strict_start` set, a hole met
    before the first record was returned raises DataLoss instead of being skipped (the batch Read RPC).

    If the WAL is cut (`Wal.truncate`, `Wal.reset`) below `next_offset`, every later read raises
    LogTruncated: the reader already returned records that are gone, so it is never moved back silently.
    Reads wait while a cut runs, and a file read that overlapped one is done again.
    """

    def __init__(self, wal: Wal, start: int, *, skip_holes: bool = True, durable: bool = False) -> None:
        self._wal = wal
        # durable: read up to what is durable here, past a replicated leader's visible cap (a follower's
        # fetch); otherwise up to what readers may see
        self._durable = durable
        self.next_offset = start
        self.skip_holes = skip_holes
        self.strict_start = False
        self.skipped: list[tuple[int, int]] = []
        self.damaged: list[tuple[int, int]] = []
        self._returned = False
        self._hint: FilePosition | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reading = False
        self._closed = False
        self._cuts_seen = wal._cut_count
        self._cut_below: int | None = None  # set once a cut went below next_offset

    @property
    def closed(self) -> bool:
        return self._closed

    def available(self) -> int:
        return max(0, self._end() - self.next_offset)

    def _end(self) -> int:
        wal = self._wal
        return wal.durable_offset if self._durable else wal.committed_offset

    def close(self) -> None:
        self._closed = True
        self._hint = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(
        self,
        max_records: int = 512,
        max_bytes: int = 4 * MiB,
        timeout: float | None = None,  # noqa: ASYNC109 (part of the broker-facing API)
    ) -> list[tuple[int, bytes]]:
        """>= 1 consecutive records from next_offset, or [] when `timeout` passes with nothing new.

        Raises OffsetOutOfRange if next_offset is older than the WAL keeps, StorageError once the WAL is
        closed (or failed) and every committed record was returned, or if this reader was closed.
        """
        run = await self._read_checked(max_records, max_bytes, timeout, frames=False)
        assert not isinstance(run, FrameRun)
        return run

    async def read_run(
        self,
        max_records: int = 512,
        max_bytes: int = 4 * MiB,
        timeout: float | None = None,  # noqa: ASYNC109 (part of the broker-facing API)
    ) -> list[tuple[int, bytes]] | FrameRun:
        """As `read`, but whole appends come as their frames (`FrameRun`) while the WAL keeps them
        (`Wal.keep_frames`): a replicated leader ships those to its followers as they are."""
        return await self._read_checked(max_records, max_bytes, timeout, frames=True)

    async def _read_checked(
        self,
        max_records: int,
        max_bytes: int,
        timeout: float | None,  # noqa: ASYNC109 (read's, passed on)
        *,
        frames: bool,
    ) -> list[tuple[int, bytes]] | FrameRun:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be >= 1")
        if self._reading:
            raise RuntimeError("WalReader.read called concurrently on the same reader")
        self._reading = True
        loop = asyncio.get_running_loop()
        try:
            return await self._read(
                max_records, max_bytes, None if timeout is None else loop.time() + timeout, frames
            )
        finally:
            self._reading = False

    async def _read(
        self, max_records: int, max_bytes: int, deadline: float | None, frames: bool = False
    ) -> list[tuple[int, bytes]] | FrameRun:
        wal = self._wal
        while True:
            if self._closed:
                raise StorageError("reader closed")
            self._check_cuts()
            if wal._cutting:
                if not await self._wait(deadline):
                    return []
                continue
            start = self.next_offset
            first = wal.first_offset
            if start < first:
                raise OffsetOutOfRange(f"offset {start} is older than the WAL's first offset {first}")
            committed = self._end()
            if start < committed:
                if frames:
                    run = wal.frames(start, committed, max_records, max_bytes)
                    if run is not None:
                        self.next_offset = run.end
                        self._returned = True
                        return run
                    committed = wal.frames_start(start, committed)  # records up to where frames begin
                records = wal._cache.read(start, committed, max_records, max_bytes)
                if records is None:
                    hole = wal.hole_at(start)
                    if hole is not None:
                        self._hole(start, hole.end, hole.why)
                        continue
                    records = await self._read_files(start, committed, max_records, max_bytes)
                if records:
                    self.next_offset = records[-1][0] + 1
                    self._returned = True
                    return records
                continue
            failure = wal._finished_error()
            if failure is not None:
                raise failure
            if not await self._wait(deadline):
                return []

    async def _read_files(
        self, start: int, committed: int, max_records: int, max_bytes: int
    ) -> list[tuple[int, bytes]] | None:
        """Records from the segment files; None (or []) when the caller must look again (a hole was
        skipped, a cut overlapped the read)."""
        wal = self._wal
        gen = wal._cut_gen
        try:
            records, self._hint = await asyncio.to_thread(
                read_segments,
                wal.segments_snapshot(),
                start,
                committed,
                max_records,
                max_bytes,
                self._hint,
            )
        except (CorruptRange, OffsetOutOfRange) as exc:
            if wal._cut_gen != gen:  # the files changed under the read: not damage
                self._hint = None
                return None
            if not isinstance(exc, CorruptRange):
                raise
            wal.damage.note_damaged(exc.first, exc.end, str(exc))
            self._hole(start, exc.end, str(exc))
            return None
        if wal._cut_gen != gen:  # these may be records a cut removed meanwhile
            self._hint = None
            return None
        return records

    def _check_cuts(self) -> None:
        """Raise LogTruncated once the WAL was cut below this reader's position."""
        wal = self._wal
        if wal._cut_count != self._cuts_seen:
            missed = wal._cut_count - self._cuts_seen
            self._cuts_seen = wal._cut_count
            cuts = wal._cuts or []
            low = min(cuts[-missed:]) if missed <= len(cuts) else -1  # too many to tell: assume cut
            if self.next_offset > low:
                self._cut_below = low
        if self._cut_below is not None:
            raise LogTruncated(
                f"{wal.label} was truncated to offset {self._cut_below}, below this reader's position "
                f"{self.next_offset}"
            )

    async def _wait(self, deadline: float | None) -> bool:
        """Wait until the WAL wakes its readers (records committed, a cut done, closed); False when the
        deadline passed first."""
        loop = asyncio.get_running_loop()
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            return False
        wal = self._wal
        waiter = loop.create_future()
        self._waiter = waiter
        wal._read_waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, remaining)
        except TimeoutError:
            return False
        finally:
            wal._read_waiters.discard(waiter)
            self._waiter = None
        return True

    def _hole(self, start: int, end: int, why: str) -> None:
        """Offsets [start, end) are in a hole: skip them, or raise as configured."""
        if not self.skip_holes:
            raise CorruptRange(why, start, end)
        if self.strict_start and not self._returned:
            raise DataLoss(
                f"offsets {start}..{end - 1} of {self._wal.label} are lost or damaged, no copy exists ({why})"
            )
        self.skipped.append((start, end - 1))
        self.damaged.append((start, end - 1))
        self.next_offset = end


async def verify_segment(
    seg: Segment, committed: int, holes: Holes, unchanged: Callable[[], bool] = lambda: True
) -> list[Hole]:
    """Read every frame of `seg` below `committed` (CRC checked) and record each damaged range in `holes`;
    returns the new ones. Stops early, recording nothing more, once `unchanged()` is False (the WAL was
    cut meanwhile: a failed read is then no sign of damage)."""
    found: list[Hole] = []
    end = min(seg.end_offset, committed)
    at: int = seg.first_offset
    hint: FilePosition | None = None
    while at < end:
        hole = holes.find(at)
        if hole is not None:
            at = hole.end
            continue
        try:
            records, hint = await asyncio.to_thread(read_segments, [seg], at, end, 65536, 8 * MiB, hint)
        except (CorruptRange, OffsetOutOfRange) as exc:
            if not unchanged():
                return found
            if not isinstance(exc, CorruptRange):
                raise
            found += holes.note_damaged(exc.first, exc.end, str(exc))
            at = exc.end
            continue
        if not unchanged():
            return found
        at = records[-1][0] + 1
    return found
