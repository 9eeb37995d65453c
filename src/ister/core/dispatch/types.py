"""Value types shared by the dispatch state machines."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import NamedTuple


class SubType(IntEnum):
    """Subscription types, numbered as on the Danube wire."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3

    @property
    def single_active(self) -> bool:
        """True for the types that deliver to one active consumer at a time (Exclusive, Failover)."""
        return self in (SubType.EXCLUSIVE, SubType.FAILOVER)


class Delivery(NamedTuple):
    """One message to send now: `attempt` is the 1-based delivery count, `redelivery` is `attempt > 1`.

    A named tuple: polls return thousands of these, and a tuple is the cheapest immutable record.
    """

    consumer_id: int
    offset: int
    attempt: int
    redelivery: bool


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An exhausted message the broker must publish to the dead-letter topic.

    `attempts` is how many times it was delivered; `reason` is the last failure reason (a nack's reason,
    "ack timeout", or None when a nack gave none).
    """

    offset: int
    attempts: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """A snapshot of a reliable subscription's window, for metrics and admin output."""

    window: int
    held: int
    pending: int
    in_flight: int
    waiting_retry: int
    exhausted: int
    blocked: int
    next_offset: int
    cursor: int | None
    delivered_total: int
    redelivered_total: int
    acked_total: int
    nacked_total: int
    ack_timeouts_total: int
    dead_lettered_total: int
    dropped_total: int
    skipped_total: int = 0  # offsets the log did not have (`skip`): never delivered, passed by the cursor

    def as_dict(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
