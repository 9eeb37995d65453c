"""The reliable (at-least-once) dispatch state machine of one subscription.

The broker feeds it messages from the log in offset order (`offer`/`offer_batch`, bounded by `capacity`),
asks what to send (`poll`), and reports acks (`on_ack`, `ack_range`, `ack_upto`), nacks and consumer
changes. Every offered message stays in the window until it is acknowledged or resolved by the poison
policy; the cursor only passes resolved offsets.

Choices where Danube differs (deliberately):
- Failover promotes the next attached standby as soon as the active consumer detaches.
- A detached or removed consumer's in-flight messages are redelivered (immediately, not counted as a
  failure) to another consumer or to the same one when it returns; nothing is ever treated as acked.
- A late ack (the message already timed out, or is exhausted) is accepted: the consumer did process it.
- Key-Shared: several messages of a key in flight to its one consumer, in order, up to the window (Danube
  sends one per key and waits for its ack). A key's later messages wait behind a message of it that must be
  sent again (also while that one is exhausted and blocked or waiting for its dead-letter publish), and a
  key that moves to another consumer starts there only once its old consumer's messages are resolved or
  handed back (`keyqueue.py` has the rule). A message whose
  key no attached consumer's filters accept is held, never skipped (Danube skips it: it is lost for the
  subscription), until a matching consumer attaches; meanwhile it takes no window slot, so the other keys keep
  flowing. Up to `unmatched_limit` such messages wait outside the window (their records stay in memory);
  beyond that they take window slots again.
- Attaching a consumer that is already attached (a new stream taking over) resends its in-flight messages.

Gaps (they never wedge a subscription: docs/architecture.md §12): offers are strict (each must be
`next_offset`). Where the log has no records
(a dead broker's unexported tail, a damaged WAL range) the broker calls `skip(first, end)` for the range
instead; `split_runs` (`gaps.py`) splits a read into record runs and gaps. A skipped offset is never held,
never delivered and takes no window slot; the cursor passes it as soon as everything below it is resolved.
The rule for late fills: a record of a skipped range that turns up later is not offered to this state again
(an offer below `next_offset` is refused). Such a record reaches only subscriptions that have not passed the
range yet: the broker reads from the persisted cursor + 1 when it loads a subscription, so one whose cursor
is still below the range reads the record then.

Cost (what keeps a 10,000-message window cheap): a message only offered is a bare offset (`window.py`); a
message in flight is one dict item pointing at its delivery batch, which carries consumer and deadline
(`flight.py`); only a message that failed or was handed back gets a record (`entries.py`). Timers are heaps
validated on pop, so a poll with nothing due scans nothing, and the cursor passes each offset once (a
skipped range in one step, whatever its length).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from ister.core.dispatch.entries import EntryState
from ister.core.dispatch.policy import BLOCK
from ister.core.dispatch.sending import Sending
from ister.core.dispatch.stateparts import check_window
from ister.core.dispatch.types import SubscriptionStats


class ReliableSubscriptionState(Sending):
    """One subscription's at-least-once dispatch (the module's docstring); its parts: stateparts.py."""

    # -- consumers ---------------------------------------------------------------------------------------
    def attach(self, consumer_id: int, key_filters: Iterable[str] = (), now_ms: int = 0) -> None:
        """A consumer's stream opened. Re-attaching an attached consumer resends its in-flight messages."""
        was_attached = self._selector.is_attached(consumer_id)
        self._selector.attach(consumer_id, key_filters)
        if was_attached:
            self._requeue(consumer_id, now_ms)
        for cid in self._flight.consumers():
            if not self._selector.is_attached(cid):
                self._requeue(cid, now_ms)

    def detach(self, consumer_id: int, now_ms: int) -> int:
        """The stream is gone; its in-flight messages become ready now. Returns how many were requeued."""
        self._selector.detach(consumer_id)
        return self._requeue(consumer_id, now_ms)

    def remove(self, consumer_id: int, now_ms: int) -> int:
        """Forget the consumer; its in-flight messages become ready now. Returns how many were requeued."""
        self._selector.remove(consumer_id)
        return self._requeue(consumer_id, now_ms)

    def designate(self, consumer_id: int | None) -> None:
        """Failover, partitioned: only this consumer receives (None: deliveries pause). What others hold in
        flight stays theirs until they ack it or `requeue` hands it back (a handoff decides when)."""
        self._selector.designate(consumer_id)

    def undesignate(self) -> None:
        self._selector.undesignate()

    @property
    def designation(self) -> tuple[bool, int | None]:
        return self._selector.designation

    def requeue(self, consumer_id: int, now_ms: int) -> int:
        """Hand back a still-attached consumer's in-flight messages (a partition switching away from it);
        they go to whoever receives next, not counted as failures. Returns how many."""
        return self._requeue(consumer_id, now_ms)

    def in_flight_of(self, consumer_id: int) -> int:
        return sum(1 for _, cid in self._flight.items() if cid == consumer_id)

    def _requeue(self, consumer_id: int, now_ms: int) -> int:
        offsets = self._flight.take_consumer(consumer_id)
        for offset in offsets:
            self._failures.hand_back(offset, consumer_id, now_ms)
        return len(offsets)

    # -- feeding -----------------------------------------------------------------------------------------
    def capacity(self) -> int:
        """How many more messages `offer`/`offer_batch` accept.

        Key-Shared: held messages of keys no attached consumer accepts (found by the last `poll`, for the
        current consumer set) do not count, up to `unmatched_limit` of them.
        """
        free = self.window - self._w.held
        kq = self._kq
        if kq.n_unmatched and kq.parked_version == self._selector.version:
            free += min(kq.n_unmatched, self._unmatched_limit)
        return max(0, free)

    def set_window(self, window: int) -> None:
        """Change the window (1..MAX_WINDOW). Shrinking drops nothing: capacity is 0 until enough resolve."""
        self.window = check_window(window)

    def offer(self, offset: int, key: str, now_ms: int) -> None:
        """Add the next message of the log. Raises ValueError if out of order or the window is full."""
        w = self._w
        if offset != w.next_offset:
            raise ValueError(f"offer of offset {offset}, expected {w.next_offset}")
        if self.capacity() <= 0:
            raise ValueError(f"dispatch window full ({self.window}); offer of offset {offset} refused")
        w.next_offset = offset + 1
        w.held += 1
        if self._key_shared:
            self._kq.add(offset, key)

    def offer_batch(self, first_offset: int, keys: Sequence[str], now_ms: int) -> None:
        """Add the next len(keys) messages of the log: offsets first_offset, first_offset + 1, ...

        Raises ValueError (and adds nothing) unless first_offset is `next_offset` and len(keys) <= capacity.
        """
        w = self._w
        n = len(keys)
        if first_offset != w.next_offset:
            raise ValueError(f"offer of offset {first_offset}, expected {w.next_offset}")
        if n > self.capacity():
            raise ValueError(f"dispatch window: {n} messages offered, capacity {self.capacity()}")
        if not n:
            return
        if self._key_shared:
            self._kq.add_run(first_offset, keys)
        w.next_offset = first_offset + n
        w.held += n

    def skip(self, first: int, end: int, now_ms: int) -> int:
        """The log has no records at offsets [first, end): move `next_offset` to `end` without holding them.

        `first` must be `next_offset` and `end >= first` (ValueError otherwise; nothing changes). Takes no
        window capacity and works in any state (pending, in-flight, retrying or blocked messages). The
        skipped offsets are never delivered, and the cursor passes them as soon as everything below them is
        resolved. Returns how many offsets were skipped (counted in `stats().skipped_total`).
        """
        w = self._w
        if first != w.next_offset:
            raise ValueError(f"skip from offset {first}, expected {w.next_offset}")
        if end < first:
            raise ValueError(f"skip of [{first}, {end}): end is below first")
        if end > first:
            w.skip(first, end)
        return end - first

    # -- queries -----------------------------------------------------------------------------------------
    def next_wakeup(self) -> int | None:
        """The earliest time at which tick/poll would change something (an ack deadline or a retry)."""
        times = [self._flight.earliest()]
        if self._can_receive():
            times.append(self._retries.earliest())
        present = [t for t in times if t is not None]
        return min(present) if present else None

    @property
    def cursor(self) -> int | None:
        return self._w.cursor

    @property
    def first_open(self) -> int:
        """The lowest offset not yet resolved (the cursor + 1)."""
        return self._w.first_open

    @property
    def start_offset(self) -> int:
        return self._w.start

    @property
    def next_offset(self) -> int:
        return self._w.next_offset

    @property
    def in_flight_count(self) -> int:
        return len(self._holder)

    def lag(self, head_offset: int) -> int:
        """Messages not yet contiguously resolved; `head_offset` is the log's next offset (its length)."""
        return max(0, head_offset - self._w.first_open)

    def active_consumer(self) -> int | None:
        """Exclusive/Failover: the consumer receiving messages now; None for the other types."""
        return self._selector.active()

    def attached_consumers(self) -> list[int]:
        return self._selector.attached_ids()

    def held_offsets(self) -> Set[int]:
        """Offsets in the window (offered and not yet acked or resolved); a live view.

        Membership is O(1); iterating copies. To free payloads, prefer `take_resolved`.
        """
        return self._w

    def in_flight(self) -> dict[int, int]:
        """Offset -> consumer for every message awaiting an ack."""
        return dict(self._flight.items())

    def state_of(self, offset: int) -> EntryState | None:
        return self._w.state_of(offset)

    def stats(self) -> SubscriptionStats:
        w = self._w
        in_flight = len(self._holder)
        return SubscriptionStats(
            window=self.window,
            held=w.held,
            pending=w.held - in_flight - w.n_retry - w.n_exhausted,
            in_flight=in_flight,
            waiting_retry=w.n_retry,
            exhausted=w.n_exhausted,
            blocked=w.n_exhausted if self.policy.poison_policy == BLOCK else 0,
            next_offset=w.next_offset,
            cursor=w.cursor,
            delivered_total=self._delivered,
            redelivered_total=self._redelivered,
            acked_total=self._acked,
            nacked_total=self._nacked,
            ack_timeouts_total=self._timeouts,
            dead_lettered_total=self._failures.dead_lettered,
            dropped_total=self._failures.dropped,
            skipped_total=w.skipped,
        )
