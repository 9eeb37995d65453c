"""A reliable subscription's dead letters: exhausted messages published to the dead-letter topic, with a
back-off while publishing fails (the state machine hands them out again until each is published)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec

from ister.broker.held import HeldRecords
from ister.broker.sessions import Record
from ister.clock import Clock
from ister.core.backoff import Backoff, Retries
from ister.core.dispatch import DeadLetter, ReliableSubscriptionState
from ister.core.record import StoredMessage, decode_message

log = logging.getLogger(__name__)

DeadLetterPublisher = Callable[[StoredMessage, DeadLetter], Awaitable[None]]

DLQ_BACKOFF_MIN_SECONDS = 0.5
DLQ_BACKOFF_MAX_SECONDS = 30.0
DLQ_BACKOFF = Backoff(first=DLQ_BACKOFF_MIN_SECONDS, cap=DLQ_BACKOFF_MAX_SECONDS)


def dead_letter_message(record: Record) -> StoredMessage:
    """The message to dead-letter for a stored record; a record that does not decode travels whole as the
    payload, so that the dead letter can be published (and delivered) and nothing is lost."""
    try:
        return decode_message(record)
    except msgspec.DecodeError:
        return StoredMessage(payload=bytes(record), publish_time=0, producer_id=0, producer_name="")


class DeadLetters:
    """Publishes what the state machine dead-letters; one per subscription."""

    def __init__(
        self,
        publish: DeadLetterPublisher,
        clock: Clock,
        counter: Callable[[], None],
        warn: Callable[..., None],
    ) -> None:
        self._publish = publish
        self._clock = clock
        self._published = counter  # counts one dead letter published
        self._warn = warn  # the subscription's rate-limited warning
        self._retry_at = 0.0
        self._retries = Retries(DLQ_BACKOFF)

    async def send(self, state: ReliableSubscriptionState, held: HeldRecords) -> None:
        if self._clock.monotonic() < self._retry_at:
            return  # the last dead-letter publish failed: back off instead of retrying every heartbeat
        for dead in state.take_dead_letters():
            record = held.get(dead.offset)
            if record is None:
                state.resolve_dead_letter(dead.offset)
                continue
            try:
                await self._publish(dead_letter_message(record), dead)
            except Exception as exc:
                wait = self._retries.next()
                self._warn(
                    "dead-letter publish of offset %d failed (retry in %.1f s): %s", dead.offset, wait, exc
                )
                state.dead_letter_failed(dead.offset)
                self._retry_at = self._clock.monotonic() + wait
                continue
            self._retries.reset()
            state.resolve_dead_letter(dead.offset)
            held.records.pop(dead.offset, None)
            self._published()
