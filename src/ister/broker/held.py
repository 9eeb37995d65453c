"""The records a reliable subscription holds, by offset: blocks of frames as they were read from the durable
tier (`FrameBlock`), and single records (from the WAL).

A run of new offsets goes to a consumer as slices of the blocks (`chunks`): no record is copied or framed
again. Blocks are dropped when the cursor passes them; while the cursor is held back (an unacknowledged
message), `prune` compacts the blocks once they grow numerous: a block with nothing held is dropped, one with
little held gives its held records to `records` (copies) and is dropped, so memory stays bounded by what the
window holds.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Container, Iterable, Sequence
from itertools import accumulate
from operator import attrgetter

from ister.broker.sessions import CHUNK_MAX_BYTES, CHUNK_MAX_MESSAGES, OutChunk, Record
from ister.core.frameblock import FrameBlock
from ister.core.frames import HEADER_SIZE

COMPACT_MIN_BLOCKS = 64  # blocks held above the cursor before the first compaction
SPARSE = 4  # a block whose held frames take less than 1/SPARSE of its buffer gives them up as copies

_first = attrgetter("first")


class HeldRecords:
    __slots__ = ("_blocks", "_compact_at", "records")

    def __init__(self) -> None:
        self.records: dict[int, Record] = {}
        self._blocks: list[FrameBlock] = []  # ascending, disjoint
        self._compact_at = COMPACT_MIN_BLOCKS

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def add_records(self, records: Iterable[tuple[int, Record]]) -> None:
        self.records.update(records)

    def add_block(self, block: FrameBlock) -> None:
        """Frames of offsets above everything held so far."""
        self._blocks.append(block)

    def _block_of(self, offset: int) -> FrameBlock | None:
        blocks = self._blocks
        i = bisect_right(blocks, offset, key=_first) - 1
        if i >= 0 and offset < blocks[i].end:
            return blocks[i]
        return None

    def get(self, offset: int) -> Record | None:
        record = self.records.get(offset)
        if record is None and self._blocks:
            block = self._block_of(offset)
            if block is not None:
                return block.record(offset)
        return record

    def chunks(self, offsets: Sequence[int], redelivery: bool) -> list[OutChunk] | None:
        """`offsets` (ascending) as chunks for one consumer's stream, in order; None if one is not held."""
        out: list[OutChunk] = []
        if isinstance(offsets, range) and offsets.step == 1 and self._blocks:
            at, stop = offsets.start, offsets.stop
            while at < stop:
                block = self._block_of(at)
                if block is None:
                    break
                piece = block.slice(at, min(stop, block.end))
                while True:
                    n = piece.prefix(CHUNK_MAX_MESSAGES, CHUNK_MAX_BYTES)
                    part = piece.slice(piece.first, piece.first + n) if n < piece.count else piece
                    out.append(OutChunk(range(part.first, part.end), block=part, redelivery=redelivery))
                    if n == piece.count:
                        break
                    piece = piece.slice(part.end, piece.end)
                at = piece.end
            if at == stop:
                return out
            offsets = offsets[at - offsets.start :]
        records: list[Record | None] = list(map(self.records.get, offsets))
        if self._blocks and None in records:
            records = [r if r is not None else self.get(o) for o, r in zip(offsets, records, strict=True)]
        if None in records:
            return None
        done: list[Record] = records  # type: ignore[assignment]  # no None left
        ends = list(accumulate(len(r) + HEADER_SIZE for r in done))
        i, n = 0, len(done)
        while i < n:
            base = ends[i - 1] if i else 0
            j = min(n, i + CHUNK_MAX_MESSAGES, max(i + 1, bisect_right(ends, base + CHUNK_MAX_BYTES, i, n)))
            out.append(OutChunk(offsets[i:j], records=done[i:j], redelivery=redelivery))
            i = j
        return out

    def prune(self, resolved: Sequence[int], first_open: int, held: Container[int]) -> None:
        """Forget what is resolved: `resolved` offsets' records, blocks below `first_open` (the lowest
        unresolved offset); compact the blocks when they grew numerous (`held`: the offsets still held)."""
        if self.records and resolved:
            pop = self.records.pop
            for offset in resolved:
                pop(offset, None)
        blocks = self._blocks
        if not blocks:
            return
        i = 0
        while i < len(blocks) and blocks[i].end <= first_open:
            i += 1
        if i:
            del blocks[:i]
        if len(blocks) > self._compact_at:
            self._compact(held)
            self._compact_at = max(COMPACT_MIN_BLOCKS, 2 * len(self._blocks))

    def _compact(self, held: Container[int]) -> None:
        kept: list[FrameBlock] = []
        for block in self._blocks:
            live = [o for o in range(block.first, block.end) if o in held]
            if not live:
                continue
            starts, first = block.starts, block.first
            nbytes = sum(starts[o - first + 1] - starts[o - first] for o in live)
            if nbytes * SPARSE < len(block.buf):
                self.records.update((o, block.record(o)) for o in live)
            else:
                kept.append(block)
        self._blocks = kept

    def clear(self) -> None:
        self.records.clear()
        self._blocks.clear()


__all__ = ["HeldRecords"]
