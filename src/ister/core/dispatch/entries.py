"""Per-message state of messages that failed or were requeued at least once, and the queues over it.

A message that is only offered, or delivered once and not yet failed, has no record here: the window keeps
it as a bare offset (pending) or as a member of a delivery batch (in flight, see `flight.py`). A record is
made the first time a delivery fails (nack, ack timeout) or is handed back (detach), and lives until the
message is resolved. Records are few in a healthy subscription, so they can afford a per-message object.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum


class EntryState(IntEnum):
    PENDING = 0  # offered, never sent (or held: no consumer can take it yet)
    IN_FLIGHT = 1  # sent, waiting for an ack until its batch's deadline
    RETRY = 2  # waiting to be sent again at `retry_at`
    EXHAUSTED = 3  # failed max_redelivery_count + 1 times; dead letter pending or blocked


_RETRY = EntryState.RETRY
_EXHAUSTED = EntryState.EXHAUSTED


@dataclass(slots=True)
class Entry:
    state: EntryState
    deliveries: int  # sends so far (the next Delivery.attempt is deliveries + 1)
    consumer: int  # who it was last delivered to (a cumulative ack from that consumer covers it)
    failures: int = 0  # nacks and ack timeouts (detaches do not count)
    retry_at: int = 0
    reason: str | None = None
    gen: int = 0  # bumped whenever it enters RETRY; older retry-queue items are stale
    reported: bool = False  # dead letter handed to the broker and not yet failed/resolved


class RetryQueue:
    """A min-heap of (retry_at, offset, gen) over RETRY entries, with lazy invalidation.

    An item is live while its entry is still in RETRY with the same gen. Garbage is bounded: the heap is
    rebuilt from its live items whenever it grows past twice the number of RETRY entries (plus slack).
    """

    __slots__ = ("_entries", "_heap")

    def __init__(self, entries: dict[int, Entry]) -> None:
        self._entries = entries
        self._heap: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def _live(self, offset: int, gen: int) -> bool:
        entry = self._entries.get(offset)
        return entry is not None and entry.gen == gen and entry.state is _RETRY

    def push(self, entry: Entry, offset: int, live_count: int) -> None:
        heap = self._heap
        heapq.heappush(heap, (entry.retry_at, offset, entry.gen))
        if len(heap) > 2 * live_count + 64:
            self._heap = [item for item in heap if self._live(item[1], item[2])]
            heapq.heapify(self._heap)

    def is_due(self, now: int) -> bool:
        heap = self._heap
        return bool(heap) and heap[0][0] <= now

    def pop_due(self, now: int) -> list[int]:
        """Offsets of the live items due at `now`, ascending, each once."""
        due: list[int] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, offset, gen = heapq.heappop(heap)
            if self._live(offset, gen):
                due.append(offset)
        if len(due) > 1:
            due = sorted(set(due))
        return due

    def earliest(self) -> int | None:
        """The time of the earliest live item (drops stale items from the top)."""
        heap = self._heap
        while heap and not self._live(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class LateIndex:
    """Per consumer, a min-heap of the offsets last delivered to it that now wait (RETRY or EXHAUSTED).

    It lets a cumulative ack (`ack_upto`) reach late messages without scanning the window. Items are
    validated on use (the entry must still wait and still name that consumer); each heap is rebuilt from its
    live items when it grows past twice the number of waiting entries (plus slack).
    """

    __slots__ = ("_entries", "_heaps")

    def __init__(self, entries: dict[int, Entry]) -> None:
        self._entries = entries
        self._heaps: dict[int, list[int]] = {}

    def _live(self, offset: int, consumer: int) -> bool:
        entry = self._entries.get(offset)
        return entry is not None and entry.consumer == consumer and entry.state in (_RETRY, _EXHAUSTED)

    def push(self, consumer: int, offset: int, live_count: int) -> None:
        heap = self._heaps.get(consumer)
        if heap is None:
            self._heaps[consumer] = [offset]
            return
        heapq.heappush(heap, offset)
        if len(heap) > 2 * live_count + 64:
            heap = sorted({o for o in heap if self._live(o, consumer)})  # a sorted list is a heap
            if heap:
                self._heaps[consumer] = heap
            else:
                del self._heaps[consumer]

    def take_upto(self, consumer: int, offset: int) -> list[int]:
        """Waiting offsets <= `offset` last delivered to `consumer`, ascending (removed from the index)."""
        heap = self._heaps.get(consumer)
        out: list[int] = []
        if not heap:
            return out
        while heap and heap[0] <= offset:
            o = heapq.heappop(heap)
            if (not out or out[-1] != o) and self._live(o, consumer):
                out.append(o)
        if not heap:
            del self._heaps[consumer]
        return out
