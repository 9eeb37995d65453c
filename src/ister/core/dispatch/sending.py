"""What a poll sends from a subscription's reliable state: due retries first, then never-sent messages,
each to the consumer the subscription type picks (Key-Shared: behind its key's gate, or held while no
consumer accepts its key)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from heapq import heappop, heappush
from itertools import repeat
from operator import itemgetter

from ister.core.dispatch.entries import EntryState
from ister.core.dispatch.flight import SendPhase
from ister.core.dispatch.outcomes import Outcomes
from ister.core.dispatch.types import Delivery

_IN_FLIGHT, _RETRY = EntryState.IN_FLIGHT, EntryState.RETRY

# Delivery((consumer, offset, attempt, redelivery)) without the Python-level __new__ of a named tuple.
_delivery: Callable[[tuple[int, int, int, bool]], Delivery] = partial(tuple.__new__, Delivery)
_offset_of = itemgetter(1)

# (consumer, ascending offsets, redelivery): one consumer's share of one poll phase (`poll_groups`).
Group = tuple[int, Sequence[int], bool]


class Sending(Outcomes):
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
