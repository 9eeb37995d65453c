"""What consumers answer, applied to a subscription's reliable state: acks (one, a range, cumulative),
nacks, poison, ack timeouts and dead letters. Each resolves or fails offsets and lets the cursor move."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import not_

from ister.core.dispatch.stateparts import StateParts
from ister.core.dispatch.types import DeadLetter

ACK_TIMEOUT_REASON = "ack timeout"


class Outcomes(StateParts):
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
