"""Moving a subscription's cursor to a position (earliest, latest, an offset, a publish time), consumers
attached or not, on the topic's owner (docs/admin.md, reset-cursor).

A loaded subscription is rebuilt at the new position (`ReliableSubscription.reset`): its consumers'
streams end, they reconnect and receive from there; acks sent on the old streams are ignored. A
subscription that is not loaded here has its cursor written; it opens there next time. Invariant 4 (a
cursor never moves backwards) holds for acknowledgements; a reset is the operator's explicit exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from ister.broker.consumers import Consumers, _sub_record
from ister.broker.reliable import ReliableSubscription
from ister.broker.topic import Topic
from ister.core.dispatch import SubType
from ister.errors import InvalidArgument, NotFound
from ister.ids import shown, validate_client_name
from ister.limits import U64_MAX
from ister.metadata import keys
from ister.storage.topic_storage import TopicStorage

log = logging.getLogger(__name__)

# Publish times a position may name: Unix ms from 1970 to the year 9999.
MAX_TIME_MS = 253_402_300_799_999

PositionKind = Literal["earliest", "latest", "offset", "time"]


@dataclass(frozen=True, slots=True)
class Position:
    kind: PositionKind
    value: int = 0  # the offset, or the time in Unix ms

    def __post_init__(self) -> None:
        if self.kind == "offset" and not 0 <= self.value <= U64_MAX:
            raise InvalidArgument(f"offset {self.value} is not an unsigned 64-bit integer")
        if self.kind == "time" and not 0 <= self.value <= MAX_TIME_MS:
            raise InvalidArgument(f"time {self.value} ms is not between 1970 and the year 9999")

    def __str__(self) -> str:
        return self.kind if self.kind in ("earliest", "latest") else f"{self.kind} {self.value}"


@dataclass(frozen=True, slots=True)
class CursorMove:
    topic: str
    next: int  # the first offset delivered from now on
    head: int  # the topic's next offset when the cursor moved
    consumers: int  # attached consumers moved with it
    epoch: int = 0  # the subscription's cursor epoch from now on


class Cursors:
    def __init__(self, consumers: Consumers, storage: TopicStorage) -> None:
        self.consumers = consumers
        self.storage = storage

    async def resolve(self, topic: Topic, position: Position) -> int:
        """The offset a position names on a reliable topic: earliest..head. An offset past the head is
        INVALID_ARGUMENT; one below the earliest stored offset is the earliest."""
        wal = topic.wal
        if wal is None:
            raise InvalidArgument(f"topic {topic.name} is NonReliable: it has no offsets to move to")
        head = wal.committed_offset
        if position.kind == "latest":
            return head
        if position.kind == "time":
            return max(
                await self.storage.offset_for_time(topic.name, wal, position.value), topic.start_offset
            )
        earliest = max(await self.storage.earliest(topic.name, wal), topic.start_offset)  # retention's
        if position.kind == "earliest":
            return earliest
        if position.value > head:
            raise InvalidArgument(f"{topic.name}: offset {position.value} is past the head {head}")
        return max(position.value, earliest)

    async def exists(self, topic: Topic, subscription: str) -> bool:
        if subscription in topic.subscriptions:
            return True
        return await self.consumers.store.get(keys.subscription(topic.name.full, subscription)) is not None

    async def seek(
        self, topic: Topic, subscription: str, position: Position, *, create: bool, dry_run: bool = False
    ) -> CursorMove:
        """Move `subscription` of the reliable `topic` (served here) to `position`. `create`: a missing
        subscription is created (Exclusive) at the position; else NOT_FOUND. `dry_run`: check and resolve
        only."""
        validate_client_name(subscription, "subscription name")
        wal = topic.wal
        if wal is None:
            raise InvalidArgument(f"topic {topic.name} is NonReliable: its subscriptions have no cursor")
        target = await self.resolve(topic, position)
        t = topic.name.full
        async with topic.lock:  # against a consumer subscribing or a subscription closing meanwhile
            head = wal.committed_offset
            target = min(target, head)
            sub = topic.subscriptions.get(subscription)
            if dry_run:
                if not create and not await self.exists(topic, subscription):
                    raise NotFound(f"subscription {shown(subscription)} does not exist on {t}")
                attached = sum(1 for c in sub.consumers.values() if c.attached) if sub is not None else 0
                return CursorMove(t, target, head, attached, sub.epoch if sub is not None else 0)
            if isinstance(sub, ReliableSubscription):
                reader = self.storage.reader(topic.name, wal, target)
                moved = await sub.reset(target, reader)
                return CursorMove(t, target, head, moved, sub.epoch)
            if not create and not await self.exists(topic, subscription):
                raise NotFound(f"subscription {shown(subscription)} does not exist on {t}")
            record_key = keys.subscription(t, subscription)
            if await self.consumers.store.get(record_key) is None:
                record = _sub_record(subscription, SubType.EXCLUSIVE, "", (), target)
                await topic.claim.guarded_put(record_key, record)
            await topic.claim.guarded_put(keys.subscription_cursor(t, subscription), target - 1)
            if sub is None:
                topic.track_cursor(subscription, target)
        log.info("%s/%s: cursor set to %d (%s; not loaded)", t, subscription, target, position)
        return CursorMove(t, target, head, 0)
