"""What happens to a delivery that failed (nack, ack timeout) or was handed back (detach): it waits and is
retried, or, once redeliveries are exhausted, the poison policy applies (dead letter, drop or block).

Every message here is already out of flight; it gets a record in the window (`HeldWindow.record`).
"""

from __future__ import annotations

from collections import deque

from ister.core.dispatch.entries import Entry, EntryState, LateIndex, RetryQueue
from ister.core.dispatch.policy import BLOCK, DEAD_LETTER, DROP, FailurePolicy
from ister.core.dispatch.types import DeadLetter
from ister.core.dispatch.window import HeldWindow

_RETRY, _EXHAUSTED = EntryState.RETRY, EntryState.EXHAUSTED


class Failures:
    __slots__ = ("_dead_letters", "_w", "dead_lettered", "dropped", "late", "policy", "retries")

    def __init__(self, policy: FailurePolicy, window: HeldWindow) -> None:
        self.policy = policy
        self._w = window
        self.retries = RetryQueue(window.entries)
        self.late = LateIndex(window.entries)  # for cumulative acks of waiting messages
        self._dead_letters: deque[int] = deque()  # exhausted offsets not yet handed to the broker
        self.dead_lettered = 0
        self.dropped = 0

    @property
    def blocked(self) -> bool:
        """Block policy with an exhausted message: no new messages may be sent (Key-Shared: that key)."""
        return self._w.n_exhausted > 0 and self.policy.poison_policy == BLOCK

    def hand_back(self, offset: int, consumer: int, now_ms: int) -> None:
        """The consumer's stream is gone: send the message again now (not a failure)."""
        self._to_retry(offset, self._w.record(offset, consumer), now_ms)

    def fail(
        self,
        offset: int,
        consumer: int,
        now_ms: int,
        delay_ms: int | None,
        reason: str | None,
        *,
        poison: bool = False,
    ) -> None:
        """A delivery failed: retry after the backoff, or apply the poison policy once exhausted.

        `poison`: no delivery can ever succeed (the record cannot be sent): the policy applies at once."""
        w = self._w
        entry = w.record(offset, consumer)
        entry.failures += 1
        entry.reason = reason
        policy = self.policy
        if not poison and not policy.is_exhausted(entry.failures):
            self._to_retry(offset, entry, now_ms + policy.retry_delay_ms(entry.failures, delay_ms))
        elif policy.poison_policy == DROP:
            self.dropped += 1
            w.resolve(offset)
        else:
            entry.state = _EXHAUSTED
            w.n_exhausted += 1
            self.late.push(consumer, offset, w.n_retry + w.n_exhausted)
            if policy.poison_policy == DEAD_LETTER:
                entry.reported = False
                self._dead_letters.append(offset)

    def _to_retry(self, offset: int, entry: Entry, retry_at: int) -> None:
        w = self._w
        entry.state = _RETRY
        entry.retry_at = retry_at
        entry.gen += 1
        w.n_retry += 1
        self.retries.push(entry, offset, w.n_retry)
        self.late.push(entry.consumer, offset, w.n_retry + w.n_exhausted)

    def requeue_parked(self, offset: int, entry: Entry) -> None:
        """A waiting message that was held for lack of a consumer may go again (same retry time)."""
        self.retries.push(entry, offset, self._w.n_retry)

    # -- dead letters ------------------------------------------------------------------------------------
    def take_dead_letters(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        entries = self._w.entries
        while self._dead_letters:
            offset = self._dead_letters.popleft()
            entry = entries.get(offset)
            if entry is not None and entry.state is _EXHAUSTED and not entry.reported:
                entry.reported = True
                out.append(DeadLetter(offset, entry.deliveries, entry.reason))
        out.sort(key=lambda d: d.offset)
        return out

    def resolve_dead_letter(self, offset: int) -> bool:
        entry = self._w.entries.get(offset)
        if entry is None or entry.state is not _EXHAUSTED or self.policy.poison_policy != DEAD_LETTER:
            return False
        self.dead_lettered += 1
        self._w.resolve(offset)
        self._w.advance()
        return True

    def dead_letter_failed(self, offset: int) -> bool:
        entry = self._w.entries.get(offset)
        if entry is None or entry.state is not _EXHAUSTED or not entry.reported:
            return False
        entry.reported = False
        self._dead_letters.append(offset)
        return True
