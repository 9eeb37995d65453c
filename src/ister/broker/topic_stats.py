"""What the admin API's stats report of a topic loaded here, measured from its live state (docs/admin.md,
"Stats"): rates (`RateKeeper`), offsets, storage, replicas, producers and subscriptions.

Only the topic's owner measures it (the server forwards a request to the owner). A subscription open here
reports its dispatch state; one that is not open (no consumer since the topic loaded) its stored cursor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ister.broker.reliable import ReliableSubscription
from ister.broker.stats_rates import TopicRates
from ister.broker.subscription import Subscription
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.core.dispatch import SubType
from ister.core.record import decode_message
from ister.core.replication import ReplicaRecord
from ister.core.stats import range_bytes
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import SubscriptionRecord
from ister.metadata.store import KeyValue, list_all
from ister.storage.objects import catalog, topic_object_prefix

if TYPE_CHECKING:
    from ister.broker.service import BrokerService

log = logging.getLogger(__name__)

PARQUET_SUFFIX = ".parquet"


@dataclass(frozen=True, slots=True)
class ConsumerView:
    consumer_id: int
    name: str
    address: str
    connected_since_ms: int
    connected: bool
    unacked: int


@dataclass(slots=True)
class SubscriptionView:
    topic: str
    subscription: str
    type: str
    delivery: str
    cursor: int | None
    next_offset: int
    backlog_messages: int = 0
    backlog_bytes: int = 0
    lag_ms: int = 0
    unacked_in_flight: int = 0
    waiting_redelivery: int = 0
    redeliveries_total: int = 0
    dead_lettered_total: int = 0
    msg_rate_out: float = 0.0
    byte_rate_out: float = 0.0
    consumers: list[ConsumerView] = field(default_factory=list)
    live: bool = False
    owner: int | None = None


@dataclass(frozen=True, slots=True)
class ProducerView:
    producer_id: int
    name: str
    address: str
    connected_since_ms: int
    msg_rate_in: float
    byte_rate_in: float
    messages_total: int
    bytes_total: int


@dataclass(slots=True)
class StorageView:
    wal_bytes: int = 0
    wal_segments: int = 0
    object_bytes: int = 0
    objects: int = 0
    parquet_bytes: int = 0
    parquet_files: int = 0


@dataclass(frozen=True, slots=True)
class ReplicationView:
    replicas: list[int]
    in_sync: list[int]
    min_insync: int
    epoch: int
    follower_lag: dict[int, int]


@dataclass(slots=True)
class TopicStatsView:
    topic: str
    delivery: str
    owner: int | None
    rates: TopicRates
    messages_in_total: int
    bytes_in_total: int
    messages_out_total: int
    bytes_out_total: int
    start_offset: int
    end_offset: int
    storage: StorageView
    replication: ReplicationView | None
    producers: list[ProducerView]
    subscriptions: list[SubscriptionView]
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoredSubscription:
    """A subscription as the metadata store holds it: its type and where it stands."""

    type: int
    cursor: int | None
    start_offset: int | None


def _type_name(value: int) -> str:
    try:
        return SubType(value).name.title().replace("_", "")
    except ValueError:
        return f"Unknown({value})"


def _ms(seconds: float) -> int:
    return int(seconds * 1000) if seconds else 0


def stored_subscriptions(listing: Iterable[KeyValue], prefix: str) -> dict[str, StoredSubscription]:
    """Parse `…/subscriptions/{sub}` records and their `cursor` children under `prefix`."""
    types: dict[str, int] = {}
    cursors: dict[str, int] = {}
    starts: dict[str, int | None] = {}
    for kv in listing:
        sub, _, leaf = kv.key[len(prefix) :].partition("/")
        if not sub:
            continue
        if leaf == "cursor" and isinstance(kv.value, int) and not isinstance(kv.value, bool):
            cursors[sub] = kv.value
        elif not leaf:
            record = SubscriptionRecord.parse(kv.value)
            types[sub] = record.subscription_type if record is not None else 0
            starts[sub] = record.start_offset if record is not None else None
    return {s: StoredSubscription(types[s], cursors.get(s), starts.get(s)) for s in types}


class StatsCollector:
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.store = broker.store

    # -- one topic ----------------------------------------------------------------------------------------
    async def topic(self, topic: Topic) -> TopicStatsView:
        name = topic.name
        owner = await self.broker.placement_admin.owner(name)
        rates = self.broker.rates.rates(topic)
        end = topic.wal.committed_offset if topic.wal is not None else topic.volatile_next
        start = min(topic.start_offset, end) if topic.wal is not None else end
        stored = await self.stored_subscriptions(name)
        warnings: list[str] = []
        view = TopicStatsView(
            topic=name.full,
            delivery=topic.delivery,
            owner=owner,
            rates=rates,
            messages_in_total=topic.messages_in,
            bytes_in_total=topic.bytes_in,
            messages_out_total=sum(s.messages_out for s in topic.subscriptions.values()),
            bytes_out_total=sum(s.bytes_out for s in topic.subscriptions.values()),
            start_offset=start,
            end_offset=end,
            storage=await self._storage(topic, warnings),
            replication=await self._replication(name),
            producers=[
                ProducerView(
                    p.id,
                    p.name,
                    p.address,
                    _ms(p.connected_at),
                    *rates.producers.get(p.id, (0.0, 0.0)),
                    p.messages,
                    p.bytes,
                )
                for p in sorted(topic.producers.values(), key=lambda p: p.name)
            ],
            subscriptions=await self.subscriptions(topic, stored, owner, rates),
            warnings=warnings,
        )
        return view

    async def stored_subscriptions(self, name: TopicName) -> dict[str, StoredSubscription]:
        prefix = keys.subscriptions_prefix(name)
        return stored_subscriptions(await list_all(self.store, prefix), prefix)

    async def _storage(self, topic: Topic, warnings: list[str]) -> StorageView:
        out = StorageView()
        if topic.wal is not None:
            segments = topic.wal.segments_snapshot()
            out.wal_segments = len(segments)
            out.wal_bytes = sum(s.size for s in segments)
        objects = self.broker.objects
        if objects is None or topic.wal is None:
            return out
        descriptors = await catalog.list_descriptors(self.store, topic.name)
        out.objects = len(descriptors)
        out.object_bytes = sum(d.size for d in descriptors)
        prefix = (
            topic.exporter.key_prefix
            if topic.exporter is not None
            else topic_object_prefix(topic.name.namespace, topic.name.topic)
        ).strip("/")
        try:
            listing = await objects.list(prefix)
        except Exception as exc:  # the store is down or slow: the rest of the stats still stand
            warnings.append(f"parquet copies not counted: the object store's listing failed: {exc}")
            return out
        for info in listing:
            rest = info.key[len(prefix) + 1 :] if prefix else info.key
            if "/" not in rest and rest.endswith(PARQUET_SUFFIX):
                out.parquet_files += 1
                out.parquet_bytes += info.size
        return out

    async def _replication(self, name: TopicName) -> ReplicationView | None:
        kv = await self.store.get(keys.replicas(name))
        record = ReplicaRecord.parse(kv.value) if kv is not None else None
        if record is None:
            return None
        lag = self.broker.placement_admin.replica_lag(name.full) or {}
        return ReplicationView(list(record.replicas), list(record.isr), record.min_insync, record.epoch, lag)

    # -- subscriptions ------------------------------------------------------------------------------------
    async def subscriptions(
        self,
        topic: Topic,
        stored: dict[str, StoredSubscription],
        owner: int | None,
        rates: TopicRates | None = None,
    ) -> list[SubscriptionView]:
        rates = rates if rates is not None else self.broker.rates.rates(topic)
        out = []
        for sub_name in sorted(set(stored) | set(topic.subscriptions)):
            sub = topic.subscriptions.get(sub_name)
            if sub is not None:
                view = await self._live(topic, sub)
                view.msg_rate_out, view.byte_rate_out = rates.subscriptions.get(sub_name, (0.0, 0.0))
            else:
                view = await self._stored(topic, sub_name, stored[sub_name])
            view.owner = owner
            out.append(view)
        return out

    async def _live(self, topic: Topic, sub: Subscription) -> SubscriptionView:
        reliable = isinstance(sub, ReliableSubscription)
        consumers = [
            ConsumerView(
                c.id,
                c.name,
                c.address,
                _ms(c.connected_at) if c.attached else 0,
                c.attached,
                sub.in_flight_of(c.id) if isinstance(sub, ReliableSubscription) else 0,
            )
            for c in sorted(sub.consumers.values(), key=lambda c: c.name)
        ]
        view = SubscriptionView(
            topic=topic.name.full,
            subscription=sub.name,
            type=_type_name(int(sub.sub_type)),
            delivery=RELIABLE if reliable else NON_RELIABLE,
            cursor=None,
            next_offset=0,
            consumers=consumers,
            live=True,
        )
        if isinstance(sub, ReliableSubscription):
            st = sub.stats()
            view.cursor = st.cursor
            view.unacked_in_flight = st.in_flight
            view.waiting_redelivery = st.waiting_retry
            view.redeliveries_total = st.redelivered_total
            view.dead_lettered_total = st.dead_lettered_total
            await self._backlog(topic, view, sub.first_open)
        else:
            view.next_offset = topic.volatile_next
        return view

    async def _stored(self, topic: Topic, sub: str, stored: StoredSubscription) -> SubscriptionView:
        view = SubscriptionView(
            topic=topic.name.full,
            subscription=sub,
            type=_type_name(stored.type),
            delivery=topic.delivery,
            cursor=stored.cursor,
            next_offset=0,
        )
        if topic.wal is None:
            view.next_offset = topic.volatile_next
            return view
        if stored.cursor is not None:
            first_open = stored.cursor + 1
        elif stored.start_offset is not None:
            first_open = stored.start_offset
        else:
            first_open = topic.wal.committed_offset
        await self._backlog(topic, view, first_open)
        return view

    async def _backlog(self, topic: Topic, view: SubscriptionView, first_open: int) -> None:
        """Backlog in messages and bytes and its age, from `first_open` (the oldest unacknowledged) to the
        topic's end; offsets below the start offset are gone and do not count."""
        wal = topic.wal
        assert wal is not None
        head = wal.committed_offset
        first = max(first_open, min(topic.start_offset, head))
        view.next_offset = first
        view.backlog_messages = max(0, head - first)
        if view.backlog_messages == 0:
            return
        units: list[tuple[int, int, int]] = [
            (s.first_offset, s.end_offset, s.size) for s in wal.segments_snapshot()
        ]
        if first < wal.first_offset and self.broker.objects is not None:
            try:
                descriptors = await catalog.list_descriptors(self.store, topic.name)
            except Exception as exc:
                log.debug("%s: backlog bytes without the durable tier: %s", topic.name, exc)
                descriptors = []
            units.extend(
                (d.start_offset, d.end_offset + 1, d.size)
                for d in descriptors
                if d.end_offset < wal.first_offset
            )
        view.backlog_bytes = range_bytes(units, first, head)
        published = await self._publish_time(topic, first)
        if published is not None:
            view.lag_ms = max(0, int(time.time() * 1000) - published)

    async def _publish_time(self, topic: Topic, offset: int) -> int | None:
        """Publish time (Unix ms) of the oldest stored record at or after `offset`; None if none reads."""
        wal = topic.wal
        assert wal is not None
        reader = self.broker.storage.reader(topic.name, wal, offset)
        try:
            records: Any = await reader.read(max_records=1, timeout=0)
        except Exception as exc:
            log.debug("%s: no publish time at %d: %s", topic.name, offset, exc)
            return None
        finally:
            reader.close()
        if not records:
            return None
        try:
            return int(decode_message(records[0][1]).publish_time)
        except Exception:
            return None

    # -- this broker's subscriptions ----------------------------------------------------------------------
    async def local_subscriptions(self, namespace: str | None) -> list[SubscriptionView]:
        """Every subscription of the topics this broker owns (standalone: of every topic, loading those
        that have subscriptions and are not loaded yet, as a consumer would)."""
        prefix = keys.TOPICS_PREFIX + (f"{namespace}/" if namespace else "")
        by_topic: dict[str, list[KeyValue]] = {}
        for kv in await list_all(self.store, prefix):
            parts = kv.key[len(keys.TOPICS_PREFIX) :].split("/", 3)
            if len(parts) >= 4 and parts[2] == "subscriptions":
                by_topic.setdefault(f"/{parts[0]}/{parts[1]}", []).append(kv)
        if self.broker.config.mode != "cluster":
            for full in by_topic:
                if full not in self.broker.topics:
                    try:
                        await self.broker.get_topic(TopicName.parse(full))
                    except Exception as exc:
                        log.warning("stats: could not load %s: %s", full, exc)
        out: list[SubscriptionView] = []
        me = self.broker.placement.broker_id
        for full, topic in list(self.broker.topics.items()):
            if namespace and topic.name.namespace != namespace:
                continue
            if topic.closing or not self.broker.placement.serves(full):
                continue
            sub_prefix = keys.subscriptions_prefix(topic.name)
            stored = stored_subscriptions(by_topic.get(full, []), sub_prefix)
            out.extend(await self.subscriptions(topic, stored, me))
        return out
