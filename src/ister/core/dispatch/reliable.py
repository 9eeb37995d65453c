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

from collections.abc import Callable, Iterable, Sequence, Set
from functools import partial
from heapq import heappop, heappush
from itertools import compress, repeat
from operator import itemgetter, not_

from ister.core.dispatch.entries import EntryState
from ister.core.dispatch.failures import Failures
from ister.core.dispatch.flight import FlightTable, SendPhase
from ister.core.dispatch.keyqueue import KeyQueues
from ister.core.dispatch.policy import BLOCK, FailurePolicy
from ister.core.dispatch.selector import ConsumerSelector
from ister.core.dispatch.types import DeadLetter, Delivery, SubscriptionStats, SubType
from ister.core.dispatch.window import HeldWindow
from ister.errors import InvalidArgument
from ister.limits import KEY_SHARED_UNMATCHED_LIMIT, MAX_WINDOW, MIN_WINDOW

ACK_TIMEOUT_REASON = "ack timeout"

_IN_FLIGHT, _RETRY = EntryState.IN_FLIGHT, EntryState.RETRY

# Delivery((consumer, offset, attempt, redelivery)) without the Python-level __new__ of a named tuple.
_delivery: Callable[[tuple[int, int, int, bool]], Delivery] = partial(tuple.__new__, Delivery)
_offset_of = itemgetter(1)

# (consumer, ascending offsets, redelivery): one consumer's share of one poll phase (`poll_groups`).
Group = tuple[int, Sequence[int], bool]


def _check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or not MIN_WINDOW <= window <= MAX_WINDOW:
        raise InvalidArgument(f"dispatch window must be in {MIN_WINDOW}..{MAX_WINDOW}, got {window!r}")
    return window


class ReliableSubscriptionState:
    def __init__(
        self,
        sub_type: SubType,
        *,
        start_offset: int,
        window: int,
        policy: FailurePolicy,
        track_resolved: bool = False,
        unmatched_limit: int = KEY_SHARED_UNMATCHED_LIMIT,
    ) -> None:
        """`track_resolved`: record resolved offsets for `take_resolved` (then call it regularly).
        `unmatched_limit`: Key-Shared messages of keys no consumer accepts that may wait outside the window.
        """
        self.window = _check_window(window)
        self._unmatched_limit = max(0, unmatched_limit)
        if isinstance(start_offset, bool) or not isinstance(start_offset, int) or start_offset < 0:
            raise InvalidArgument(f"start offset must be a non-negative integer, got {start_offset!r}")
        self.sub_type = SubType(sub_type)
        self._key_shared = self.sub_type is SubType.KEY_SHARED
        self._shared = self.sub_type is SubType.SHARED
        self._selector = ConsumerSelector(self.sub_type)
        self._flight = FlightTable()
        self._holder = self._flight.holder
        self._kq = KeyQueues()  # used by Key-Shared only
        self._w = HeldWindow(
            start_offset, self._holder, self._kq if self._key_shared else None, track_resolved
        )
        self._entries = self._w.entries
        self._failures = Failures(policy, self._w)
        self._retries = self._failures.retries
        self._delivered = self._redelivered = self._acked = self._nacked = self._timeouts = 0

    @property
    def policy(self) -> FailurePolicy:
        return self._failures.policy

    @policy.setter
    def policy(self, policy: FailurePolicy) -> None:
        self._failures.policy = policy

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
        self.window = _check_window(window)

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

    # -- dispatching -------------------------------------------------------------------------------------
    def poll(self, now_ms: int) -> list[Delivery]:
        """Everything to send now: due retries first, then new messages, each in offset order.

        Applies due ack timeouts first (as `tick`). Call it after offer, attach, ack, nack and dead-letter
        resolution, and at `next_wakeup`.
        """
        retries: list[Delivery] = []
        new: list[Delivery] = []
        entries = self._entries
        for cid, offsets, redelivery in self.poll_groups(now_ms):
            if redelivery:
                retries.extend(_delivery((cid, o, entries[o].deliveries, True)) for o in offsets)
            else:
                new.extend(map(_delivery, zip(repeat(cid), offsets, repeat(1), repeat(False))))
        retries.sort(key=_offset_of)
        new.sort(key=_offset_of)
        return retries + new if retries else new

    def poll_groups(self, now_ms: int) -> list[Group]:
        """What `poll` returns, grouped: (consumer, ascending offsets, redelivery) per consumer and phase
        (due retries first, then new messages). New messages to one consumer are a `range` when they are
        consecutive, so a driver can send a run of them as one piece; redelivered ones have their attempt
        count in the state (`poll` spells it out)."""
        if self._flight.is_due(now_ms):
            self._expire(now_ms)
        if not self._can_receive():
            return []
        out: list[Group] = []
        kq = self._kq
        if (kq.parked or kq.unmatched) and kq.parked_version != self._selector.version:
            self._unpark()
        if self._key_shared and kq.seen_version != self._selector.version:
            kq.consumers_changed(self._selector.version)
        if kq.woken:
            self._wake_held_retries()
        if self._retries.is_due(now_ms):
            self._send_retries(now_ms, out)
        if self._key_shared:
            if kq.heads:
                self._send_heads(now_ms, out)
        elif self._w.fresh < self._w.next_offset and not self._failures.blocked:
            self._send_new(now_ms, out)
        return out

    def _send_new(self, now_ms: int, out: list[Group]) -> None:
        """All types but Key-Shared: send the whole never-sent run [fresh, next_offset), minus skipped ranges.

        `run` is a range (a list when a skipped range lies inside it); slicing keeps its type, so a Shared
        consumer's share is a strided range in the common case.
        """
        w = self._w
        deadline = now_ms + self.policy.ack_timeout_ms
        run = w.unsent()
        n = len(run)
        if self._shared:
            ring = self._selector.round_robin_order()
            k = len(ring)
            for j in range(min(k, n)):
                share = run[j::k]
                self._flight.add_run(ring[j], deadline, share)
                out.append((ring[j], share, False))
            self._selector.skip_round_robin(n)
        else:
            cid = self._selector.active()
            if cid is None:  # cannot happen with a consumer attached
                return
            if n:
                self._flight.add_run(cid, deadline, run)
                out.append((cid, run, False))
        w.fresh = w.next_offset
        self._delivered += n

    def _target(self, offset: int) -> int | None:
        if self._key_shared:
            return self._selector.for_key(self._kq.key_of[offset])
        if self._shared:
            return self._selector.next_round_robin()
        return self._selector.active()

    def _can_receive(self) -> bool:
        """Someone may be sent a message now: an attached consumer and, for Exclusive/Failover, an active
        one (a partition handing off has none while it waits for its old consumer's acks)."""
        selector = self._selector
        if not selector.has_attached:
            return False
        return self._key_shared or self._shared or selector.active() is not None

    def _park(self, offset: int) -> None:
        """Key-Shared: nobody accepts this key now; hold it until the consumer set changes."""
        self._kq.park(offset, self._selector.version)

    def _send_retries(self, now_ms: int, out: list[Group]) -> None:
        phase = SendPhase(self._flight, now_ms + self.policy.ack_timeout_ms)
        entries, kq = self._entries, self._kq
        due = self._retries.pop_due(now_ms)
        while due:
            for offset in due:
                cid = self._target(offset)
                if cid is None:
                    self._park(offset)
                    continue
                if self._key_shared:
                    if not kq.may_resend(offset, cid):
                        kq.hold_retry(offset)  # behind an earlier message of its key, or it is moving
                        continue
                    kq.resent(offset, cid)
                phase.add(cid, offset)
                entry = entries[offset]
                entry.state = _IN_FLIGHT
                entry.deliveries += 1
                entry.consumer = cid
            if not kq.woken:
                break
            self._wake_held_retries()  # a retry sent above lets a held one of its key go in this poll
            due = self._retries.pop_due(now_ms)
        phase.close()
        out.extend((cid, offsets, True) for cid, offsets in phase.groups())
        self._w.n_retry -= phase.sent
        self._delivered += phase.sent
        self._redelivered += phase.sent

    def _send_heads(self, now_ms: int, out: list[Group]) -> None:
        """Key-Shared: send the never-sent messages of every key whose gate is open."""
        kq = self._kq
        heads, key_of, fresh, take = kq.heads, kq.key_of, kq.fresh, kq.take_fresh
        owners, route = self._selector.key_owners, self._selector.for_key
        by_consumer: dict[int, list[int]] = {}
        previous = -1
        while heads:
            offset = heappop(heads)
            if offset == previous:
                continue  # a duplicate item
            previous = offset
            key = key_of.get(offset)
            if key is None or fresh.get(key) != offset:
                continue  # sent already
            cid = owners[key] if key in owners else route(key)
            if cid is None:
                self._park(offset)
                continue
            run = take(key, cid)
            if run is None:
                continue  # its key waits; pushed again when its gate opens
            mine = by_consumer.get(cid)
            if mine is None:
                by_consumer[cid] = run
            else:
                mine.extend(run)
        deadline = now_ms + self.policy.ack_timeout_ms
        for cid, offsets in by_consumer.items():
            offsets.sort()  # several keys' runs: a batch's members ascend
            self._flight.add_run(cid, deadline, offsets)
            self._delivered += len(offsets)
            out.append((cid, offsets, False))

    def _wake_held_retries(self) -> None:
        """Key-Shared: retries held behind their key's gate may go again (their time has come already)."""
        entries = self._entries
        for offset in self._kq.take_woken():
            entry = entries.get(offset)
            if entry is not None and entry.state is _RETRY:
                self._failures.requeue_parked(offset, entry)

    def _unpark(self) -> None:
        kq = self._kq
        for offset in kq.clear_parked():
            entry = self._entries.get(offset)
            if entry is None:
                heappush(kq.heads, offset)
            elif entry.state is _RETRY:
                self._failures.requeue_parked(offset, entry)

    # -- outcomes ----------------------------------------------------------------------------------------
    def delivered_at(self, offset: int) -> int | None:
        """When the in-flight `offset` was last sent (ms, the clock of `now_ms`), None when not in flight:
        its batch's ack deadline less the ack timeout."""
        batch = self._holder.get(offset)
        return None if batch is None else batch.deadline - self.policy.ack_timeout_ms

    def on_ack(self, offset: int, now_ms: int) -> bool:
        """Accept an ack of a delivered, unresolved offset (also late: after a timeout or exhaustion).

        An ack of an offset never delivered, or already resolved, is ignored and returns False.
        """
        w = self._w
        if self._flight.pop(offset) is None and offset not in self._entries:
            return False
        self._acked += 1
        w.resolve(offset)
        if offset == w.first_open:
            w.advance()
        return True

    def on_nack(
        self, offset: int, now_ms: int, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """A consumer gave the message back; only an in-flight offset counts (late nacks are ignored)."""
        batch = self._flight.pop(offset)
        if batch is None:
            return False
        self._nacked += 1
        self._failures.fail(offset, batch.consumer, now_ms, delay_ms, reason)
        self._w.advance()
        return True

    def on_poison(self, offset: int, now_ms: int, reason: str) -> bool:
        """An in-flight message can never be delivered (its record cannot be sent to the consumer): the
        poison policy (dead letter, drop or block) applies now, without retries. False when not in flight."""
        batch = self._flight.pop(offset)
        if batch is None:
            return False
        self._failures.fail(offset, batch.consumer, now_ms, None, reason, poison=True)
        self._w.advance()
        return True

    def tick(self, now_ms: int) -> int:
        """Apply ack timeouts due at `now_ms` (each a failed attempt); returns how many timed out."""
        return self._expire(now_ms)

    def _expire(self, now_ms: int) -> int:
        expired = self._flight.expire(now_ms)
        for offset, consumer in expired:
            self._failures.fail(offset, consumer, now_ms, None, ACK_TIMEOUT_REASON)
        if expired:
            self._timeouts += len(expired)
            self._w.advance()
        return len(expired)

    def take_dead_letters(self) -> list[DeadLetter]:
        """Exhausted messages to publish to the dead-letter topic, each returned once, in offset order."""
        return self._failures.take_dead_letters()

    def resolve_dead_letter(self, offset: int) -> bool:
        """The dead letter was published: the offset is resolved and the cursor may pass it."""
        return self._failures.resolve_dead_letter(offset)

    def dead_letter_failed(self, offset: int) -> bool:
        """Publishing failed: the next `take_dead_letters` returns this offset again."""
        return self._failures.dead_letter_failed(offset)

    # -- batch outcomes ----------------------------------------------------------------------------------
    def ack_range(self, first: int, last: int, now_ms: int) -> int:
        """Ack every delivered, unresolved offset in [first, last] (late ones too, as `on_ack`).

        Offsets never delivered, already resolved or never offered are ignored. Returns how many were acked.
        """
        candidates = self._w.span(first, last, late=True)
        if not candidates:
            return 0
        got = list(map(self._holder.pop, candidates, repeat(None)))
        missing = got.count(None)
        acked: Sequence[int] = candidates
        if missing:
            acked = list(compress(candidates, got))
            if self._entries:  # late acks of waiting messages
                entries = self._entries
                acked.extend(o for o in compress(candidates, map(not_, got)) if o in entries)
            if not acked:
                return 0
        if missing < len(got):
            self._flight.release_all(got)
        w = self._w
        w.resolve_all(acked)
        self._acked += len(acked)
        if not missing and isinstance(candidates, range) and candidates[0] == w.first_open:
            w.first_open = candidates[-1] + 1  # the whole run resolved: jump over it
        w.advance()
        return len(acked)

    def ack_upto(self, offset: int, consumer_id: int, now_ms: int) -> int:
        """Cumulative ack: every unresolved offset <= `offset` last delivered to `consumer_id`.

        Covers that consumer's in-flight messages and its late ones (timed out, nacked or handed back since,
        and not redelivered to anybody else). Returns how many were acked.
        """
        acked = self._flight.take_upto(consumer_id, offset)
        if self._entries:
            acked.extend(self._failures.late.take_upto(consumer_id, offset))
        if not acked:
            return 0
        self._w.resolve_all(acked)
        self._acked += len(acked)
        self._w.advance()
        return len(acked)

    def nack_range(
        self,
        first: int,
        last: int,
        now_ms: int,
        delay_ms: int | None = None,
        reason: str | None = None,
    ) -> int:
        """Nack every in-flight offset in [first, last] (as `on_nack`); returns how many were nacked."""
        count = 0
        pop = self._flight.pop
        for offset in self._w.span(first, last, late=False):
            batch = pop(offset)
            if batch is not None:
                self._failures.fail(offset, batch.consumer, now_ms, delay_ms, reason)
                count += 1
        if count:
            self._nacked += count
            self._w.advance()
        return count

    def take_resolved(self) -> list[int]:
        """Offsets resolved (acked, dropped, dead-lettered) since the last call; needs `track_resolved`.

        Lets the broker free payloads in O(resolved) instead of diffing against `held_offsets`.
        """
        return self._w.take_resolved()

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
