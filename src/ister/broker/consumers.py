"""Subscriptions and their consumers: subscribing, opening a subscription at its cursor, streams, acks,
dead letters, named cursors, and forgetting consumers that went away."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NoReturn

from ister.broker import metrics
from ister.broker.nonreliable import NonReliableSubscription
from ister.broker.partition_groups import PartitionGroups
from ister.broker.reliable import ReliableSubscription
from ister.broker.sessions import ConsumerSession, ConsumerStream
from ister.broker.subscription import Subscription
from ister.broker.topic import RELIABLE, Topic
from ister.broker.topics import TopicRegistry
from ister.clock import REAL_CLOCK, Clock
from ister.config import BrokerConfig
from ister.core.dispatch import DeadLetter, FailurePolicy, SubType
from ister.core.dispatch.selector import MAX_KEY_FILTERS
from ister.core.record import StoredMessage, repair_for_wire
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, new_id, shown, validate_client_name
from ister.limits import NON_RELIABLE_CONSUMER_BUFFER, RELIABLE_CONSUMER_BUFFER
from ister.metadata import keys
from ister.metadata.records import (
    ConsumerIndexRecord,
    DispatchConfigRecord,
    NamespacePolicy,
    SubscriptionRecord,
)
from ister.metadata.store import MetadataStore
from ister.storage.objects.tiered import TieredReader
from ister.storage.topic_storage import TopicStorage

log = logging.getLogger(__name__)

# Consumers with no stream and no health check for this long are forgotten (there is no unsubscribe RPC).
CONSUMER_IDLE_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    session: ConsumerSession
    subscription: Subscription


class Consumers:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        storage: TopicStorage,
        topics: TopicRegistry,
        broker_url: str,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.storage = storage
        self.topics = topics
        self.broker_url = broker_url
        self.refs: dict[int, ConsumerRef] = {}
        self._started_at = clock.monotonic()
        d = config.dispatch
        self.partition_groups = PartitionGroups(d.rebalance_delay_seconds, d.max_handoff_seconds)

    def forget(self, topic: Topic) -> None:
        """Its consumers are no longer served here: their calls get UNAVAILABLE, health checks CLOSE."""
        for cid, ref in list(self.refs.items()):
            if ref.session.topic == topic.name.full:
                del self.refs[cid]

    # -- subscribing --------------------------------------------------------------------------------------
    async def subscribe(
        self,
        topic_name: str,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        key_filters: list[str],
        earliest: bool = False,
    ) -> int:
        """The consumer's id. `earliest`: a subscription created now starts at the earliest stored offset
        instead of the head (an existing one keeps its cursor)."""
        name = TopicName.parse(topic_name)
        validate_client_name(subscription, "subscription name")
        validate_client_name(consumer_name, "consumer name")
        filters = tuple(key_filters)
        if len(filters) > MAX_KEY_FILTERS:
            raise InvalidArgument(f"too many key filters: {len(filters)} > {MAX_KEY_FILTERS}")
        for f in filters:
            if not f or len(f) > 1024:
                raise InvalidArgument(f"invalid key filter {shown(f)}: 1-1024 characters")
        topic = await self.topics.get(name)
        async with topic.lock:  # subscribe and restore check-then-insert across awaits
            return await self._subscribe_locked(
                topic, subscription, consumer_name, sub_type, filters, earliest
            )

    async def _subscribe_locked(
        self,
        topic: Topic,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        filters: tuple[str, ...],
        earliest: bool = False,
    ) -> int:
        name = topic.name
        sub = topic.subscriptions.get(subscription)
        policy = await self.topics.namespace_policy(name.namespace)
        if sub is not None:
            existing = sub.find_consumer(consumer_name)
            if existing is not None and sub.sub_type == sub_type:
                existing.key_filters = filters
                existing.touch()
                return existing.id
            for stale in sub.admit(consumer_name, sub_type):
                await self._drop(stale, sub)
            if existing is not None:
                await self._drop(existing, sub)
            if sub.sub_type != sub_type:
                await sub.close()
                del topic.subscriptions[subscription]
                sub = None
        _check_limits(topic, sub, subscription, policy)
        if sub is None:
            topic.untrack_cursor(subscription)  # consumed again: its own lag gauge takes over
            sub = await self._open(topic, subscription, sub_type, consumer_name, filters, earliest)
            topic.subscriptions[subscription] = sub
        session = ConsumerSession(
            new_id(), consumer_name, name.full, subscription, sub_type, filters, clock=self.clock
        )
        sub.add_consumer(session)
        self.refs[session.id] = ConsumerRef(session, sub)
        index = ConsumerIndexRecord(
            topic=name.full,
            subscription=subscription,
            consumer_name=consumer_name,
            subscription_type=int(sub_type),
            key_filters=list(filters),
        )
        await self.store.put(keys.consumer_index(session.id), index.to_json())
        return session.id

    async def _drop(self, session: ConsumerSession, sub: Subscription) -> None:
        sub.remove_consumer(session)
        self.refs.pop(session.id, None)
        await self.store.delete(keys.consumer_index(session.id))

    async def _open(
        self,
        topic: Topic,
        name: str,
        sub_type: SubType,
        consumer_name: str,
        filters: tuple[str, ...],
        earliest: bool = False,
    ) -> Subscription:
        t = topic.name.full
        record_key = keys.subscription(t, name)
        kv = await self.store.get(record_key)
        record = SubscriptionRecord.parse(kv.value) if kv is not None else None
        wal = topic.wal
        if wal is None:
            await self.store.put(record_key, _sub_record(name, sub_type, consumer_name, filters, None))
            return NonReliableSubscription(t, name, sub_type)
        cursor = await self.store.get(keys.subscription_cursor(t, name))
        if cursor is not None and isinstance(cursor.value, int) and not isinstance(cursor.value, bool):
            start = cursor.value + 1
        elif record is not None and record.start_offset is not None:
            start = record.start_offset
        elif earliest:  # a new subscription at the earliest record retention keeps: nothing is lost
            start = max(await self.storage.earliest(topic.name, wal), topic.start_offset)
        else:
            # A new subscription starts at the latest offset (as Danube): what this broker holds, not what it
            # shows yet (a replicated topic's new leader shows nothing until its epoch's start commits;
            # from there a "latest" subscription would get the whole topic).
            start = wal.durable_offset
        if start > wal.durable_offset:
            # The WAL holds less than the cursor says (its files were lost): resume at its head. Measured
            # against what this broker holds, not what it shows: a replicated topic's new leader shows
            # nothing until its epoch's start commits, yet holds everything a consumer acknowledged (a
            # chaos run found cursors reset to 0 that way: every message delivered again).
            log.warning("%s/%s: cursor start %d is past the WAL head %d", t, name, start, wal.durable_offset)
            start = wal.durable_offset
        if self.storage.objects is None:
            start = max(start, wal.first_offset)  # older records exist nowhere else
        if start < topic.start_offset:
            lost = topic.start_offset - start
            metrics.retention_skipped.inc(lost)
            log.warning(
                "%s/%s: retention deleted offsets %d..%d before this subscription read them; it starts at %d",
                t,
                name,
                start,
                topic.start_offset - 1,
                topic.start_offset,
            )
            start = topic.start_offset
        await self.store.put(record_key, _sub_record(name, sub_type, consumer_name, filters, start))
        policy = await self._failure_policy(topic, name)
        window = self.config.dispatch.max_unacked_messages
        dc = await self.store.get(keys.subscription_dispatch_config(t, name))
        dispatch = DispatchConfigRecord.parse(dc.value) if dc is not None else None
        if dispatch is not None and dispatch.max_unacked_messages is not None:
            window = dispatch.max_unacked_messages
        cursor_key = keys.subscription_cursor(t, name)

        async def write_cursor(value: int) -> None:
            await topic.claim.guarded_put(cursor_key, value)

        async def publish_dead_letter(message: StoredMessage, dead: DeadLetter) -> None:
            await self._publish_dead_letter(topic, name, policy, message, dead)

        reader = self.storage.reader(topic.name, wal, start)
        if isinstance(reader, TieredReader):
            reader.start_floor = lambda: topic.start_offset
        sub = ReliableSubscription(
            t,
            name,
            sub_type,
            reader=reader,
            report_gap=topic.report_gap,
            retention_start=lambda: topic.start_offset,
            wal=wal,
            start_offset=start,
            window=window,
            policy=policy,
            write_cursor=write_cursor,
            publish_dead_letter=publish_dead_letter,
            clock=self.clock,
            throttle=topic.limits.dispatch_throttle() if topic.limits is not None else None,
        )
        sub.start()
        part = topic.name.partition
        if part is not None and sub_type is SubType.FAILOVER:
            base = f"/{topic.name.namespace}/{part[0]}"
            self.partition_groups.join(
                base, part[1], sub, dispatch
            )  # spread the partitions over the consumers
        return sub

    async def _failure_policy(self, topic: Topic, sub: str) -> FailurePolicy:
        key = keys.subscription_failure_policy(topic.name.full, sub)
        kv = await self.store.get(key)
        if kv is not None and isinstance(kv.value, dict):
            try:
                return FailurePolicy.from_json(kv.value)
            except InvalidArgument as exc:
                log.warning("stored failure policy %s is invalid (%s); using defaults", key, exc)
        d = self.config.dispatch
        return FailurePolicy(  # config defaults stay config: only an explicitly stored policy is persisted
            max_redelivery_count=d.max_redelivery_count,
            ack_timeout_ms=d.ack_timeout_ms,
            base_redelivery_delay_ms=d.base_redelivery_delay_ms,
            max_redelivery_delay_ms=d.max_redelivery_delay_ms,
            backoff=d.backoff_strategy,
            poison_policy=d.poison_policy,
            dead_letter_topic=topic.name.dlq().full if d.poison_policy == "DeadLetter" else None,
        )

    async def _publish_dead_letter(
        self, topic: Topic, sub: str, policy: FailurePolicy, message: StoredMessage, dead: DeadLetter
    ) -> None:
        target = TopicName.parse(policy.dead_letter_topic or topic.name.dlq().full)
        message = repair_for_wire(message)  # a record stored before publishes were checked
        attrs = dict(message.attributes)
        attrs.update(
            {
                "x-original-topic": topic.name.full,
                "x-original-subscription": sub,
                "x-original-topic-offset": str(dead.offset),
                "x-original-producer-id": str(message.producer_id),
                "x-original-broker-addr": self.broker_url,
                "x-poison-policy": "dead_letter",
                "x-delivery-attempt": str(dead.attempts),
            }
        )
        if dead.reason:
            attrs["x-failure-reason"] = dead.reason
        dlq = await self.topics.get(target, create_as=RELIABLE, internal=True)
        if not dlq.reliable:
            raise FailedPrecondition(f"dead-letter topic {target} is NonReliable; it must be Reliable")
        await dlq.publish(
            StoredMessage(
                payload=message.payload,
                publish_time=message.publish_time,
                producer_id=message.producer_id,
                producer_name=message.producer_name,
                attributes=attrs,
                routing_key=message.routing_key,
                schema_id=message.schema_id,
                schema_version=message.schema_version,
            )
        )

    # -- closing and cursors ------------------------------------------------------------------------------
    async def close_idle_subscription(self, topic: Topic, subscription: str) -> None:
        """Take a loaded subscription out of memory (its metadata stays). FailedPrecondition while a
        consumer is attached; consumers that are not (reconnecting or waiting to be reaped) are dropped.
        The caller holds `topic.lock`."""
        sub = topic.subscriptions.get(subscription)
        if sub is None:
            return
        active = [c.name for c in sub.consumers.values() if c.attached]
        if active:
            raise FailedPrecondition(
                f"subscription {shown(subscription)} on {topic.name} has active consumers: "
                + ", ".join(sorted(active))
            )
        for session in list(sub.consumers.values()):
            await self._drop(session, sub)
        del topic.subscriptions[subscription]
        await sub.close()

    async def set_cursor(self, topic: Topic, subscription: str, next_offset: int) -> int:
        """Move a subscription's cursor so that `next_offset` is the first offset it has not consumed,
        creating the subscription if needed; returns its lag (head - next_offset).

        For readers that keep their own position (Spark's checkpoint) and want their lag visible on the
        broker: the `danube_subscription_lag_messages` gauge and the load report's backlog count it, and a
        consumer that later subscribes under this name starts at `next_offset`. Refused while consumers
        are attached (their acks move the cursor)."""
        validate_client_name(subscription, "subscription name")
        wal = topic.wal
        assert wal is not None
        t = topic.name.full
        async with topic.lock:  # against a consumer subscribing under the same name meanwhile
            head = wal.committed_offset
            if next_offset > head:
                raise InvalidArgument(f"{t}: offset {next_offset} is past the head {head}")
            await self.close_idle_subscription(topic, subscription)  # reopens from the new cursor
            record_key = keys.subscription(t, subscription)
            if await self.store.get(record_key) is None:
                record = _sub_record(subscription, SubType.EXCLUSIVE, "", (), next_offset)
                await topic.claim.guarded_put(record_key, record)
            # The cursor is the last consumed offset (-1: nothing yet), as consumers' acks leave it.
            await topic.claim.guarded_put(keys.subscription_cursor(t, subscription), next_offset - 1)
            topic.track_cursor(subscription, next_offset)
        return head - next_offset

    # -- consumers and streams ----------------------------------------------------------------------------
    async def find(self, consumer_id: int) -> ConsumerRef:
        ref = self.refs.get(consumer_id)
        if ref is not None:
            return ref
        # A consumer from before a restart: re-create its session with the same id.
        kv = await self.store.get(keys.consumer_index(consumer_id))
        rec = ConsumerIndexRecord.parse(kv.value) if kv is not None else None
        try:
            if rec is None:
                raise InvalidArgument("no index record")
            name = TopicName.parse(rec.topic)
            sub_type = SubType(rec.subscription_type)
        except (ValueError, InvalidArgument):
            raise NotFound(f"consumer {consumer_id} does not exist on this broker") from None
        filters = tuple(rec.key_filters)
        topic = await self.topics.get(name)
        async with topic.lock:
            ref = self.refs.get(consumer_id)
            if ref is not None:
                return ref
            sub = topic.subscriptions.get(rec.subscription)
            if sub is None:
                sub = await self._open(topic, rec.subscription, sub_type, rec.consumer_name, filters)
                topic.subscriptions[rec.subscription] = sub
            if sub.sub_type != sub_type or sub.find_consumer(rec.consumer_name) is not None:
                raise NotFound(f"consumer {consumer_id} was replaced")
            session = ConsumerSession(
                consumer_id,
                rec.consumer_name,
                name.full,
                rec.subscription,
                sub_type,
                filters,
                clock=self.clock,
            )
            sub.add_consumer(session)
            ref = ConsumerRef(session, sub)
            self.refs[consumer_id] = ref
            return ref

    async def open_stream(self, consumer_id: int) -> tuple[ConsumerRef, ConsumerStream]:
        ref = await self.find(consumer_id)
        loaded = self.topics.topics.get(ref.session.topic)
        if loaded is None or loaded.closing:
            raise Unavailable(f"topic {ref.session.topic} is moving; subscribe again")
        size = RELIABLE_CONSUMER_BUFFER if ref.subscription.reliable else NON_RELIABLE_CONSUMER_BUFFER
        stream = ConsumerStream(size)
        ref.subscription.attach(ref.session, stream)
        return ref, stream

    async def subscription_for(self, topic_name: str, subscription: str) -> Subscription | None:
        """The open subscription; None when it exists only in metadata (not reopened since a restart: its
        unacknowledged messages will be delivered again, so an ack or nack for them changes nothing)."""
        topic = self.topics.topics.get(topic_name) or await self.topics.get(TopicName.parse(topic_name))
        sub = topic.subscriptions.get(subscription)
        if sub is not None:
            return sub
        validate_client_name(subscription, "subscription name")
        if await self.store.get(keys.subscription(topic.name.full, subscription)) is None:
            raise NotFound(f"subscription {shown(subscription)} does not exist on {topic_name}")
        return None

    async def reap(self, seen_before: float) -> int:
        """Forget consumers with no stream that were last seen before `seen_before` (monotonic seconds).

        The official client has no unsubscribe: without this, every consumer name ever used would stay in
        memory and in the consumer index. A reaped consumer that comes back simply subscribes again.
        """
        stale = [
            ref
            for ref in self.refs.values()
            if not ref.session.attached and ref.session.last_seen < seen_before
        ]
        for ref in stale:
            await self._drop(ref.session, ref.subscription)
        if self.clock.monotonic() - self._started_at > CONSUMER_IDLE_SECONDS:
            # Index entries of consumers from before a restart that never came back.
            for kv in await self.store.list(keys.CONSUMER_INDEX_PREFIX, limit=10_000):
                cid = kv.key[len(keys.CONSUMER_INDEX_PREFIX) :]
                if cid.isdigit() and int(cid) not in self.refs:
                    await self.store.delete(kv.key)
        if stale:
            log.info("forgot %d idle consumers", len(stale))
        return len(stale)


def _check_limits(topic: Topic, sub: Subscription | None, subscription: str, policy: NamespacePolicy) -> None:
    """Namespace policies (0 = unlimited), checked before a new consumer or subscription is added."""
    if sub is None and (n := policy.max_subscriptions_per_topic) and (held := len(topic.subscriptions)) >= n:
        _refuse(topic, "max_subscriptions_per_topic", n, "subscriptions", held)
    if sub is not None and (n := policy.max_consumers_per_subscription) and (held := len(sub.consumers)) >= n:
        _refuse(
            topic,
            "max_consumers_per_subscription",
            n,
            f"consumers of subscription {shown(subscription)}",
            held,
        )
    total = sum(len(s.consumers) for s in topic.subscriptions.values())
    if (n := policy.max_consumers_per_topic) and total >= n:
        _refuse(topic, "max_consumers_per_topic", n, "consumers", total)


def _refuse(topic: Topic, limit: str, value: int, what: str, held: int) -> NoReturn:
    # Named as docs/limits.md says every refusal is: the limit, its value and whose it is.
    metrics.limit_refusals.labels(limit).inc()
    raise FailedPrecondition(
        f"{topic.name}: namespace {topic.name.namespace} allows {limit}={value} {what}; it has {held}"
    )


def _sub_record(
    name: str, sub_type: SubType, consumer_name: str, filters: tuple[str, ...], start: int | None
) -> dict[str, Any]:
    return SubscriptionRecord(
        subscription_name=name,
        subscription_type=int(sub_type),
        consumer_name=consumer_name,
        key_filters=list(filters),
        start_offset=start,
    ).to_json()
