"""In-flight messages, tracked by delivery batch.

Every poll sends its messages in a few batches: one per consumer and phase (retries, then new messages).
All members of a batch share the consumer and the ack deadline, so those live on the batch, and the only
per-message state is `holder[offset] -> batch`. A new message's batch is a `range` (a strided one in
Shared round-robin), so large polls cost a few C-level bulk operations per message.

- Ack deadlines: one heap item (deadline, seq, batch) per batch. When it is due, the members still held
  by that batch time out; a batch whose members are all gone (`live == 0`) is skipped.
- Cumulative acks: per consumer, a heap of (lowest unscanned member, seq, batch). Members are ascending
  within a batch, so `take_upto` pops the batches that start at or below the ack and advances a scan
  position in each: every member is scanned at most once.
- Garbage (items of dead batches) is bounded: a heap is rebuilt from its live items whenever it grows past
  twice the number of live batches (plus slack).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterator, Sequence

_SLACK = 64


class Batch:
    """Messages sent to one consumer by one poll phase; `offsets` ascending (a range or a list)."""

    __slots__ = ("consumer", "deadline", "live", "offsets", "pos", "seq")

    def __init__(self, consumer: int, deadline: int, offsets: Sequence[int], seq: int) -> None:
        self.consumer = consumer
        self.deadline = deadline
        self.offsets = offsets
        self.live = 0  # members still held by this batch (holder[o] is self)
        self.pos = 0  # members before pos were scanned by a cumulative ack
        self.seq = seq


_Item = tuple[int, int, Batch]


class SendPhase:
    """The batches of one poll phase, one per consumer, filled one offset at a time (ascending)."""

    __slots__ = ("_deadline", "_flight", "_groups", "sent")

    def __init__(self, flight: FlightTable, deadline: int) -> None:
        self._flight = flight
        self._deadline = deadline
        self._groups: dict[int, tuple[Batch, list[int]]] = {}
        self.sent = 0

    def add(self, consumer: int, offset: int) -> None:
        group = self._groups.get(consumer)
        if group is None:
            members: list[int] = []
            group = self._groups[consumer] = (
                self._flight.new_batch(consumer, self._deadline, members),
                members,
            )
        group[1].append(offset)
        self._flight.holder[offset] = group[0]
        self.sent += 1

    def close(self) -> None:
        """Start the deadlines of the filled batches (members sorted: Key-Shared may add out of order)."""
        for batch, members in self._groups.values():
            members.sort()
            self._flight.register(batch)

    def groups(self) -> list[tuple[int, list[int]]]:
        """(consumer, ascending offsets) of every filled batch."""
        return [(cid, members) for cid, (_, members) in self._groups.items()]


class FlightTable:
    __slots__ = ("_by_consumer", "_deadlines", "_live", "_seq", "holder")

    def __init__(self) -> None:
        self.holder: dict[int, Batch] = {}
        self._deadlines: list[_Item] = []
        self._by_consumer: dict[int, list[_Item]] = {}
        self._live = 0  # batches with live > 0
        self._seq = 0

    def __len__(self) -> int:
        return len(self.holder)

    # -- sending -----------------------------------------------------------------------------------------
    def new_batch(self, consumer: int, deadline: int, offsets: Sequence[int]) -> Batch:
        """A batch to fill with `add` (its `offsets` list must grow ascending); then `register` it."""
        self._seq += 1
        return Batch(consumer, deadline, offsets, self._seq)

    def add_run(self, consumer: int, deadline: int, offsets: Sequence[int]) -> None:
        """Send ascending offsets (none of them in flight) to one consumer, as one batch."""
        batch = self.new_batch(consumer, deadline, offsets)
        self.holder.update(dict.fromkeys(offsets, batch))
        self.register(batch)

    def register(self, batch: Batch) -> None:
        """Start the deadline of a filled batch (its members are already in `holder`)."""
        batch.live = len(batch.offsets)
        if not batch.live:
            return
        self._live += 1
        limit = 2 * self._live + _SLACK
        item = (batch.deadline, batch.seq, batch)
        heap = self._deadlines
        heapq.heappush(heap, item)
        if len(heap) > limit:
            self._deadlines = _compact(heap)
        mine = self._by_consumer.get(batch.consumer)
        if mine is None:
            self._by_consumer[batch.consumer] = [(batch.offsets[0], batch.seq, batch)]
            return
        heapq.heappush(mine, (batch.offsets[0], batch.seq, batch))
        if len(mine) > limit:
            self._by_consumer[batch.consumer] = _compact(mine)

    # -- leaving -----------------------------------------------------------------------------------------
    def release(self, batch: Batch, count: int = 1) -> None:
        """`count` members of `batch` were removed from `holder` by the caller."""
        batch.live -= count
        if not batch.live:
            self._live -= 1

    def release_all(self, batches: list[Batch | None]) -> None:
        """Members were removed from `holder` by the caller: one list item per member (None: not one)."""
        head = batches[0]
        if head is not None and batches.count(head) == len(batches):  # all from one batch
            self.release(head, len(batches))
            return
        for batch, count in Counter(batches).items():
            if batch is not None:
                self.release(batch, count)

    def pop(self, offset: int) -> Batch | None:
        """Take one offset out of flight; returns its batch (None if it was not in flight)."""
        batch = self.holder.pop(offset, None)
        if batch is not None:
            batch.live -= 1
            if not batch.live:
                self._live -= 1
        return batch

    def expire(self, now: int) -> list[tuple[int, int]]:
        """Take out every member whose deadline is due: (offset, consumer) pairs."""
        heap = self._deadlines
        out: list[tuple[int, int]] = []
        if not heap or heap[0][0] > now:
            return out
        holder = self.holder
        while heap and heap[0][0] <= now:
            batch = heapq.heappop(heap)[2]
            if not batch.live:
                continue
            consumer = batch.consumer
            for offset in batch.offsets:
                if holder.get(offset) is batch:
                    del holder[offset]
                    out.append((offset, consumer))
            batch.live = 0
            self._live -= 1
        return out

    def take_consumer(self, consumer: int) -> list[int]:
        """Take out everything in flight at `consumer`, ascending."""
        mine = self._by_consumer.pop(consumer, None)
        out: list[int] = []
        if not mine:
            return out
        holder = self.holder
        for _, _, batch in mine:
            if not batch.live:
                continue
            for offset in batch.offsets:
                if holder.get(offset) is batch:
                    del holder[offset]
                    out.append(offset)
            batch.live = 0
            self._live -= 1
        out.sort()
        return out

    def take_upto(self, consumer: int, upto: int) -> list[int]:
        """Take out everything in flight at `consumer` with offset <= `upto`, ascending."""
        mine = self._by_consumer.get(consumer)
        out: list[int] = []
        if not mine:
            return out
        holder = self.holder
        while mine and mine[0][0] <= upto:
            _, seq, batch = heapq.heappop(mine)
            if not batch.live:
                continue
            offsets = batch.offsets
            pos, end = batch.pos, len(offsets)
            if not pos and batch.live == end and offsets[-1] <= upto:  # the whole batch, all still held
                deque(map(holder.__delitem__, offsets), 0)  # del holder[o] for each, in C
                out.extend(offsets)
                batch.pos = end
                self.release(batch, end)
                continue
            taken = 0
            while pos < end:
                offset = offsets[pos]
                if offset > upto:
                    break
                pos += 1
                if holder.get(offset) is batch:
                    del holder[offset]
                    out.append(offset)
                    taken += 1
            batch.pos = pos
            if taken:
                self.release(batch, taken)
            if batch.live and pos < end:
                heapq.heappush(mine, (offsets[pos], seq, batch))
        if not mine:
            del self._by_consumer[consumer]
        out.sort()
        return out

    # -- queries -----------------------------------------------------------------------------------------
    def consumers(self) -> list[int]:
        """Consumers that may have messages in flight."""
        return list(self._by_consumer)

    def earliest(self) -> int | None:
        """The earliest deadline of a live batch (drops dead batches from the top)."""
        heap = self._deadlines
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def is_due(self, now: int) -> bool:
        heap = self._deadlines
        return bool(heap) and heap[0][0] <= now

    def items(self) -> Iterator[tuple[int, int]]:
        """(offset, consumer) for everything in flight."""
        return ((offset, batch.consumer) for offset, batch in self.holder.items())


def _compact(heap: list[_Item]) -> list[_Item]:
    live = [item for item in heap if item[2].live]
    heapq.heapify(live)
    return live
