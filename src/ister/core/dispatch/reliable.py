"""The reliable (at-least-once) dispatch state machine of one subscription.

The broker feeds it messages from the log in offset order (`offer`, bounded by `capacity`), asks what to
send (`poll`), and reports acks, nacks and consumer changes. Every offered message stays in the window
until it is acknowledged or resolved by the poison policy; the cursor only passes resolved offsets.

Choices where Danube differs (deliberately):
- Failover promotes the next attached standby as soon as the active consumer detaches.
- A detached or removed consumer's in-flight messages are redelivered (immediately, not counted as a
  failure) to another consumer or to the same one when it returns; nothing is ever treated as acked.
- A late ack (the message already timed out, or is exhausted) is accepted: the consumer did process it.
- Key-Shared: one in-flight message per key; a key's later messages wait behind its earliest unresolved
  one (also while that one is exhausted and blocked or waiting for its dead-letter publish). A message whose
  key no attached consumer's filters accept is held, never skipped: it keeps its window slot until a
  matching consumer attaches.
- Attaching a consumer that is already attached (a new stream taking over) resends its in-flight messages.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Set

from ister.core.dispatch.entries import Entry, EntryState, TimerQueue
from ister.core.dispatch.policy import BLOCK, DEAD_LETTER, DROP, FailurePolicy
from ister.core.dispatch.selector import ConsumerSelector
from ister.core.dispatch.types import DeadLetter, Delivery, SubscriptionStats, SubType
from ister.core.dispatch.window import CursorTracker
from ister.errors import InvalidArgument
from ister.limits import MAX_WINDOW, MIN_WINDOW

ACK_TIMEOUT_REASON = "ack timeout"

_PENDING, _IN_FLIGHT, _RETRY, _EXHAUSTED = (
    EntryState.PENDING,
    EntryState.IN_FLIGHT,
    EntryState.RETRY,
    EntryState.EXHAUSTED,
)


class ReliableSubscriptionState:
    def __init__(self, sub_type: SubType, *, start_offset: int, window: int, policy: FailurePolicy) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or not MIN_WINDOW <= window <= MAX_WINDOW:
            raise InvalidArgument(f"dispatch window must be in {MIN_WINDOW}..{MAX_WINDOW}, got {window!r}")
        if isinstance(start_offset, bool) or not isinstance(start_offset, int) or start_offset < 0:
            raise InvalidArgument(f"start offset must be a non-negative integer, got {start_offset!r}")
        self.sub_type = SubType(sub_type)
        self.window = window
        self.policy = policy
        self._key_shared = self.sub_type is SubType.KEY_SHARED
        self._selector = ConsumerSelector(self.sub_type)
        self._cursor = CursorTracker(start_offset)
        self._next_offset = start_offset
        self._entries: dict[int, Entry] = {}
        self._counts = [0, 0, 0, 0]  # entries per EntryState
        self._new: deque[int] = deque()  # PENDING offsets in order (all types but Key-Shared)
        self._heads: list[int] = []  # Key-Shared: heap of PENDING offsets that head their key's queue
        self._keys: dict[str, deque[int]] = {}  # Key-Shared: unresolved offsets per key, in order
        self._parked: set[int] = set()  # Key-Shared: heads no attached consumer accepts
        self._parked_version = -1
        self._by_consumer: dict[int, set[int]] = {}  # in-flight offsets per consumer
        self._dead_letters: deque[int] = deque()  # exhausted offsets not yet handed to the broker
        self._retries = TimerQueue(window, self._is_current)
        self._deadlines = TimerQueue(window, self._is_current)
        self._totals = dict.fromkeys(
            ("delivered", "redelivered", "acked", "nacked", "timeouts", "dead_lettered", "dropped"), 0
        )

    # -- consumers ---------------------------------------------------------------------------------------
    def attach(self, consumer_id: int, key_filters: Iterable[str] = (), now_ms: int = 0) -> None:
        """A consumer's stream opened. Re-attaching an attached consumer resends its in-flight messages."""
        was_attached = self._selector.is_attached(consumer_id)
        self._selector.attach(consumer_id, key_filters)
        if was_attached:
            self._requeue(consumer_id, now_ms)
        self._requeue_unattached(now_ms)

    def detach(self, consumer_id: int, now_ms: int) -> int:
        """The stream is gone; its in-flight messages become ready now. Returns how many were requeued."""
        self._selector.detach(consumer_id)
        return self._requeue(consumer_id, now_ms)

    def remove(self, consumer_id: int, now_ms: int) -> int:
        """Forget the consumer; its in-flight messages become ready now. Returns how many were requeued."""
        self._selector.remove(consumer_id)
        return self._requeue(consumer_id, now_ms)

    def _requeue(self, consumer_id: int, now_ms: int) -> int:
        offsets = self._by_consumer.pop(consumer_id, None)
        if not offsets:
            return 0
        for offset in sorted(offsets):
            entry = self._entries[offset]
            entry.consumer = None
            entry.retry_at = now_ms
            self._set_state(entry, _RETRY)
            self._retries.push(now_ms, offset, entry.gen)
        return len(offsets)

    def _requeue_unattached(self, now_ms: int) -> None:
        for cid in [c for c in self._by_consumer if not self._selector.is_attached(c)]:
            self._requeue(cid, now_ms)

    # -- feeding -----------------------------------------------------------------------------------------
    def capacity(self) -> int:
        """How many more messages `offer` accepts."""
        return self.window - len(self._entries)

    def offer(self, offset: int, key: str, now_ms: int) -> None:
        """Add the next message of the log. Raises ValueError if out of order or the window is full."""
        if offset != self._next_offset:
            raise ValueError(f"offer of offset {offset}, expected {self._next_offset}")
        if len(self._entries) >= self.window:
            raise ValueError(f"dispatch window full ({self.window}); offer of offset {offset} refused")
        entry = Entry(offset, key)
        self._entries[offset] = entry
        self._counts[_PENDING] += 1
        self._next_offset += 1
        if not self._key_shared:
            self._new.append(offset)
            return
        queue = self._keys.get(key)
        if queue is None:
            self._keys[key] = deque((offset,))
            heapq.heappush(self._heads, offset)
        else:
            queue.append(offset)

    # -- dispatching -------------------------------------------------------------------------------------
    def poll(self, now_ms: int) -> list[Delivery]:
        """Everything to send now: due retries first, then new messages, each in offset order.

        Applies due ack timeouts first (as `tick`). Call it after offer, attach, ack, nack and dead-letter
        resolution, and at `next_wakeup`.
        """
        self._expire(now_ms)
        if not self._selector.has_attached:
            return []
        out: list[Delivery] = []
        if self._parked and self._parked_version != self._selector.version:
            self._unpark()
        for offset in sorted(set(self._retries.pop_due(now_ms))):
            entry = self._entries[offset]
            if entry.state is _RETRY:
                self._dispatch(entry, now_ms, out)
        if self._key_shared:
            while self._heads:
                head = self._entries.get(heapq.heappop(self._heads))
                if head is not None and head.state is _PENDING:
                    self._dispatch(head, now_ms, out)
        elif not self._blocked():
            while self._new:
                self._dispatch(self._entries[self._new.popleft()], now_ms, out)
        return out

    def _blocked(self) -> bool:
        return self.policy.poison_policy == BLOCK and self._counts[_EXHAUSTED] > 0

    def _target(self, entry: Entry) -> int | None:
        if self._key_shared:
            return self._selector.for_key(entry.key)
        if self.sub_type is SubType.SHARED:
            return self._selector.next_round_robin()
        return self._selector.active()

    def _dispatch(self, entry: Entry, now_ms: int, out: list[Delivery]) -> None:
        consumer_id = self._target(entry)
        if consumer_id is None:  # Key-Shared only: nobody accepts this key now; hold it
            self._parked.add(entry.offset)
            self._parked_version = self._selector.version
            return
        redelivery = entry.deliveries > 0
        entry.deliveries += 1
        entry.consumer = consumer_id
        entry.deadline = now_ms + self.policy.ack_timeout_ms
        self._set_state(entry, _IN_FLIGHT)
        self._deadlines.push(entry.deadline, entry.offset, entry.gen)
        self._by_consumer.setdefault(consumer_id, set()).add(entry.offset)
        self._totals["delivered"] += 1
        if redelivery:
            self._totals["redelivered"] += 1
        out.append(Delivery(consumer_id, entry.offset, entry.deliveries, redelivery))

    def _unpark(self) -> None:
        for offset in sorted(self._parked):
            entry = self._entries[offset]
            if entry.state is _RETRY:
                self._retries.push(entry.retry_at, offset, entry.gen)
            else:
                heapq.heappush(self._heads, offset)
        self._parked.clear()

    # -- outcomes ----------------------------------------------------------------------------------------
    def on_ack(self, offset: int, now_ms: int) -> bool:
        """Accept an ack of a delivered, unresolved offset (also late: after a timeout or exhaustion).

        An ack of an offset never delivered, or already resolved, is ignored and returns False.
        """
        entry = self._entries.get(offset)
        if entry is None or entry.deliveries == 0:
            return False
        self._totals["acked"] += 1
        self._resolve(entry)
        return True

    def on_nack(
        self, offset: int, now_ms: int, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """A consumer gave the message back; only an in-flight offset counts (late nacks are ignored)."""
        entry = self._entries.get(offset)
        if entry is None or entry.state is not _IN_FLIGHT:
            return False
        self._totals["nacked"] += 1
        self._fail(entry, now_ms, delay_ms, reason)
        return True

    def tick(self, now_ms: int) -> int:
        """Apply ack timeouts due at `now_ms` (each a failed attempt); returns how many timed out."""
        return self._expire(now_ms)

    def _expire(self, now_ms: int) -> int:
        expired = self._deadlines.pop_due(now_ms)
        for offset in expired:
            self._totals["timeouts"] += 1
            self._fail(self._entries[offset], now_ms, None, ACK_TIMEOUT_REASON)
        return len(expired)

    def _fail(self, entry: Entry, now_ms: int, delay_ms: int | None, reason: str | None) -> None:
        self._leave_flight(entry)
        entry.failures += 1
        entry.reason = reason
        if not self.policy.is_exhausted(entry.failures):
            entry.retry_at = now_ms + self.policy.retry_delay_ms(entry.failures, delay_ms)
            self._set_state(entry, _RETRY)
            self._retries.push(entry.retry_at, entry.offset, entry.gen)
        elif self.policy.poison_policy == DROP:
            self._totals["dropped"] += 1
            self._resolve(entry)
        else:
            self._set_state(entry, _EXHAUSTED)
            if self.policy.poison_policy == DEAD_LETTER:
                entry.reported = False
                self._dead_letters.append(entry.offset)

    def take_dead_letters(self) -> list[DeadLetter]:
        """Exhausted messages to publish to the dead-letter topic, each returned once, in offset order."""
        out: list[DeadLetter] = []
        while self._dead_letters:
            entry = self._entries.get(self._dead_letters.popleft())
            if entry is not None and entry.state is _EXHAUSTED and not entry.reported:
                entry.reported = True
                out.append(DeadLetter(entry.offset, entry.deliveries, entry.reason))
        out.sort(key=lambda d: d.offset)
        return out

    def resolve_dead_letter(self, offset: int) -> bool:
        """The dead letter was published: the offset is resolved and the cursor may pass it."""
        entry = self._entries.get(offset)
        if entry is None or entry.state is not _EXHAUSTED:
            return False
        if self.policy.poison_policy != DEAD_LETTER:
            return False
        self._totals["dead_lettered"] += 1
        self._resolve(entry)
        return True

    def dead_letter_failed(self, offset: int) -> bool:
        """Publishing failed: the next `take_dead_letters` returns this offset again."""
        entry = self._entries.get(offset)
        if entry is None or entry.state is not _EXHAUSTED or not entry.reported:
            return False
        entry.reported = False
        self._dead_letters.append(offset)
        return True

    # -- bookkeeping -------------------------------------------------------------------------------------
    def _is_current(self, offset: int, gen: int) -> bool:
        entry = self._entries.get(offset)
        return entry is not None and entry.gen == gen

    def _set_state(self, entry: Entry, state: EntryState) -> None:
        self._counts[entry.state] -= 1
        self._counts[state] += 1
        entry.state = state
        entry.gen += 1

    def _leave_flight(self, entry: Entry) -> None:
        if entry.state is _IN_FLIGHT and entry.consumer is not None:
            held = self._by_consumer.get(entry.consumer)
            if held is not None:
                held.discard(entry.offset)
                if not held:
                    del self._by_consumer[entry.consumer]
        entry.consumer = None

    def _resolve(self, entry: Entry) -> None:
        self._leave_flight(entry)
        offset = entry.offset
        self._counts[entry.state] -= 1
        entry.gen += 1
        del self._entries[offset]
        self._parked.discard(offset)
        self._cursor.mark(offset)
        if not self._key_shared:
            return
        queue = self._keys[entry.key]
        if queue[0] == offset:
            queue.popleft()
        else:  # cannot happen: only a key's head is ever delivered; kept for safety
            queue.remove(offset)
        if not queue:
            del self._keys[entry.key]
            return
        head = self._entries[queue[0]]
        if head.state is _PENDING and head.offset not in self._parked:
            heapq.heappush(self._heads, head.offset)

    # -- queries -----------------------------------------------------------------------------------------
    def next_wakeup(self) -> int | None:
        """The earliest time at which tick/poll would change something (an ack deadline or a retry)."""
        times = [self._deadlines.earliest()]
        if self._selector.has_attached:
            times.append(self._retries.earliest())
        present = [t for t in times if t is not None]
        return min(present) if present else None

    @property
    def cursor(self) -> int | None:
        return self._cursor.cursor

    @property
    def start_offset(self) -> int:
        return self._cursor.start_offset

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def in_flight_count(self) -> int:
        return self._counts[_IN_FLIGHT]

    def lag(self, head_offset: int) -> int:
        """Messages not yet contiguously resolved; `head_offset` is the log's next offset (its length)."""
        return max(0, head_offset - self._cursor.first_unresolved)

    def active_consumer(self) -> int | None:
        """Exclusive/Failover: the consumer receiving messages now; None for the other types."""
        return self._selector.active()

    def attached_consumers(self) -> list[int]:
        return self._selector.attached_ids()

    def held_offsets(self) -> Set[int]:
        """Offsets in the window (offered and not yet acked or resolved); a live view."""
        return self._entries.keys()

    def in_flight(self) -> dict[int, int]:
        """Offset -> consumer for every message awaiting an ack."""
        return {o: cid for cid, offsets in self._by_consumer.items() for o in offsets}

    def state_of(self, offset: int) -> EntryState | None:
        entry = self._entries.get(offset)
        return None if entry is None else entry.state

    def stats(self) -> SubscriptionStats:
        t = self._totals
        return SubscriptionStats(
            window=self.window,
            held=len(self._entries),
            pending=self._counts[_PENDING],
            in_flight=self._counts[_IN_FLIGHT],
            waiting_retry=self._counts[_RETRY],
            exhausted=self._counts[_EXHAUSTED],
            blocked=self._counts[_EXHAUSTED] if self.policy.poison_policy == BLOCK else 0,
            next_offset=self._next_offset,
            cursor=self._cursor.cursor,
            delivered_total=t["delivered"],
            redelivered_total=t["redelivered"],
            acked_total=t["acked"],
            nacked_total=t["nacked"],
            ack_timeouts_total=t["timeouts"],
            dead_lettered_total=t["dead_lettered"],
            dropped_total=t["dropped"],
        )
