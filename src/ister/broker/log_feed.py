"""Reading a reliable subscription's log into its dispatch window.

Records come from the subscription's reader (a `TieredReader`: objects, then WAL, then live; or the WAL's
own) as frame blocks or single records, and are offered to the state machine in runs of consecutive
offsets. Offsets the log has nowhere are skipped (gaps never wedge a subscription: docs/architecture.md
§12): counted as retention's when retention deleted them first, reported to the topic as a gap otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ister.broker import metrics
from ister.broker.held import HeldRecords
from ister.core.dispatch import ReliableSubscriptionState
from ister.core.frameblock import FrameBlock
from ister.core.record import decode_message
from ister.errors import OffsetOutOfRange
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalReader

log = logging.getLogger(__name__)


class LogFeed:
    """Feeds one subscription; the state, reader and held records are passed in (a reset replaces them)."""

    def __init__(
        self,
        topic: str,
        name: str,
        wal: Wal,
        needs_key: bool,
        report_gap: Callable[[int, int], None] | None,
        retention_start: Callable[[], int] | None,
    ) -> None:
        self._where = f"{topic}/{name}"
        self._wal = wal
        self._needs_key = needs_key  # only Key-Shared routes by key: the others never decode a record here
        self._report_gap = report_gap  # the topic counts and logs each missing offset once
        self._retention_start = retention_start  # offsets below it were deleted by retention
        self._retention_warned = False

    async def fill(
        self,
        state: ReliableSubscriptionState,
        reader: TieredReader | WalReader,
        held: HeldRecords,
        now: int,
        limit: int | None = None,
    ) -> None:
        """Offer the state what the reader has, up to its window (and `limit` new records: a dispatch rate's
        allowance)."""
        if not state.attached_consumers():
            return  # nobody to deliver to: leave the log where it is (publishers pay nothing for us)
        budget = limit if limit is not None else 1 << 62
        while (capacity := min(state.capacity(), budget)) > 0 and reader.available() > 0:
            if isinstance(reader, TieredReader):
                got = await reader.read_frames(max_records=capacity, timeout=0)
                if isinstance(got, FrameBlock):
                    self._offer_block(state, held, got, now)
                    budget -= got.count
                    continue
                records = got
            else:
                try:
                    records = await reader.read(max_records=capacity, timeout=0)
                except OffsetOutOfRange:
                    if reader.next_offset >= self._wal.first_offset:
                        raise
                    reader.next_offset = self._wal.first_offset  # retention dropped the files below it
                    continue
            if not records:
                break
            budget -= len(records)
            held.add_records(records)
            if self._needs_key:
                keys = [decode_message(payload).key for _, payload in records]
            else:  # only Key-Shared routes by key: skip decoding here (the batch API never decodes)
                keys = [""] * len(records)
            first = records[0][0]
            if first == state.next_offset and records[-1][0] - first == len(records) - 1:
                state.offer_batch(first, keys, now)
            else:
                self._offer_across_gaps(state, records, keys, now)
        # The reader went past offsets that exist nowhere (and has nothing after them yet): the cursor may
        # pass them as soon as everything below is acknowledged.
        if state.next_offset < reader.next_offset:
            self._skip(state, reader.next_offset, now)

    def _offer_block(
        self, state: ReliableSubscriptionState, held: HeldRecords, block: FrameBlock, now: int
    ) -> None:
        """Offer the consecutive offsets of frames read from the durable tier (after a skipped range, if the
        reader passed one)."""
        held.add_block(block)
        if self._needs_key:
            keys = [decode_message(payload).key for payload in block.payloads()]
        else:
            keys = [""] * block.count
        if block.first > state.next_offset:
            self._skip(state, block.first, now)
        state.offer_batch(block.first, keys, now)

    def _offer_across_gaps(
        self,
        state: ReliableSubscriptionState,
        records: Sequence[tuple[int, object]],
        keys: list[str],
        now: int,
    ) -> None:
        """Offer records that skip offsets: each gap is skipped, each run offered."""
        run_start = 0
        for i in range(1, len(records) + 1):
            if i < len(records) and records[i][0] == records[i - 1][0] + 1:
                continue
            first = records[run_start][0]
            if first > state.next_offset:
                self._skip(state, first, now)
            state.offer_batch(first, keys[run_start:i], now)
            run_start = i

    def _skip(self, state: ReliableSubscriptionState, end: int, now: int) -> None:
        first = state.next_offset
        state.skip(first, end, now)
        floor = self._retention_start() if self._retention_start is not None else 0
        if first < floor:  # retention deleted them before this subscription read them: counted, not a gap
            upto = min(end, floor)
            metrics.retention_skipped.inc(upto - first)
            if not self._retention_warned:
                self._retention_warned = True
                log.warning(
                    "%s: retention deleted offsets %d..%d before this subscription read them; "
                    "it continues at %d",
                    self._where,
                    first,
                    upto - 1,
                    upto,
                )
            first = upto
        if first < end and self._report_gap is not None:
            self._report_gap(first, end)
