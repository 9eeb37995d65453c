"""Per-message state inside a reliable subscription's window, and the timer queues over it."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class EntryState(IntEnum):
    PENDING = 0  # offered, never sent (or held: no consumer can take it yet)
    IN_FLIGHT = 1  # sent, waiting for an ack until `deadline`
    RETRY = 2  # waiting to be sent again at `retry_at`
    EXHAUSTED = 3  # failed max_redelivery_count + 1 times; dead letter pending or blocked


@dataclass(slots=True)
class Entry:
    offset: int
    key: str
    state: EntryState = EntryState.PENDING
    deliveries: int = 0  # sends so far (the next Delivery.attempt is deliveries + 1)
    failures: int = 0  # nacks and ack timeouts (detaches do not count)
    consumer: int | None = None  # who holds it while IN_FLIGHT
    deadline: int = 0
    retry_at: int = 0
    reason: str | None = None
    gen: int = 0  # bumped on every state change; stale timer items carry an older value
    reported: bool = False  # dead letter handed to the broker and not yet failed/resolved


# A validity check for queued timer items: (offset, gen) -> still current?
Validity = Callable[[int, int], bool]


class TimerQueue:
    """A min-heap of (time, offset, gen) with lazy invalidation and bounded garbage.

    Items become stale when their entry changes state; they are skipped when they surface, and the heap is
    rebuilt from the live items whenever the garbage would make it more than twice `live_limit`.
    """

    __slots__ = ("_heap", "_limit", "_valid")

    def __init__(self, live_limit: int, valid: Validity) -> None:
        self._heap: list[tuple[int, int, int]] = []
        self._limit = 2 * live_limit + 64
        self._valid = valid

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at: int, offset: int, gen: int) -> None:
        heapq.heappush(self._heap, (at, offset, gen))
        if len(self._heap) > self._limit:
            self._heap = [item for item in self._heap if self._valid(item[1], item[2])]
            heapq.heapify(self._heap)

    def pop_due(self, now: int) -> list[int]:
        """Offsets of the live items due at `now`, in time order."""
        due: list[int] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, offset, gen = heapq.heappop(heap)
            if self._valid(offset, gen):
                due.append(offset)
        return due

    def earliest(self) -> int | None:
        """The time of the earliest live item (drops stale items from the top)."""
        heap = self._heap
        while heap and not self._valid(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
