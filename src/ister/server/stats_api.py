"""`IsterAdmin.GetTopicStats` and `IsterAdmin.ListSubscriptionStats` (docs/admin.md, "Stats").

Any broker answers: a topic's stats come from its owner (measured here when this broker owns it, else asked
of the owner's admin port), a partitioned topic's are summed over its partitions, and the cluster's
subscription listing is gathered from every live broker. Conversion to the wire is here; what is measured
is `broker/topic_stats.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from ister.broker.admin_ops import AdminOps
from ister.broker.stats_totals import SubscriptionTotals, local_totals
from ister.broker.topic_stats import StatsCollector, SubscriptionView, TopicStatsView
from ister.errors import Unavailable
from ister.ids import TopicName
from ister.server.stats_forward import PeerAdmin, admin_peer_credentials, forwarded_metadata
from ister.wire.gen import ister_v1_pb2 as pb

FAN_OUT = 16  # partitions or brokers asked at once


def _id(value: int | None) -> str:
    return "" if value is None else str(value)


def subscription_pb(v: SubscriptionView) -> pb.SubscriptionStatsEntry:
    out = pb.SubscriptionStatsEntry(
        topic=v.topic,
        subscription=v.subscription,
        type=v.type,
        next_offset=v.next_offset,
        backlog_messages=v.backlog_messages,
        backlog_bytes=v.backlog_bytes,
        lag_ms=v.lag_ms,
        unacked_in_flight=v.unacked_in_flight,
        waiting_redelivery=v.waiting_redelivery,
        redeliveries_total=v.redeliveries_total,
        dead_lettered_total=v.dead_lettered_total,
        msg_rate_out=v.msg_rate_out,
        byte_rate_out=v.byte_rate_out,
        consumers=[
            pb.ConsumerStats(
                consumer_id=str(c.consumer_id),
                name=c.name,
                address=c.address,
                connected_since_ms=c.connected_since_ms,
                connected=c.connected,
                unacked=c.unacked,
            )
            for c in v.consumers
        ],
        live=v.live,
        owner_broker_id=_id(v.owner),
        delivery=v.delivery,
    )
    if v.cursor is not None and v.cursor >= 0:  # a stored cursor of -1: nothing acknowledged yet
        out.cursor = v.cursor
    return out


def topic_pb(v: TopicStatsView) -> pb.TopicStats:
    r, s = v.rates, v.storage
    out = pb.TopicStats(
        topic=v.topic,
        delivery=v.delivery,
        owner_broker_id=_id(v.owner),
        msg_rate_in=r.msg_in,
        byte_rate_in=r.byte_in,
        msg_rate_out=r.msg_out,
        byte_rate_out=r.byte_out,
        rate_window_seconds=r.window,
        messages_in_total=v.messages_in_total,
        bytes_in_total=v.bytes_in_total,
        messages_out_total=v.messages_out_total,
        bytes_out_total=v.bytes_out_total,
        start_offset=v.start_offset,
        end_offset=v.end_offset,
        message_count=max(0, v.end_offset - v.start_offset),
        storage=pb.StorageStats(
            wal_bytes=s.wal_bytes,
            wal_segments=s.wal_segments,
            object_bytes=s.object_bytes,
            objects=s.objects,
            parquet_bytes=s.parquet_bytes,
            parquet_files=s.parquet_files,
            total_bytes=s.wal_bytes + s.object_bytes + s.parquet_bytes,
        ),
        producers=[
            pb.ProducerStats(
                producer_id=str(p.producer_id),
                name=p.name,
                address=p.address,
                connected_since_ms=p.connected_since_ms,
                msg_rate_in=p.msg_rate_in,
                byte_rate_in=p.byte_rate_in,
                messages_total=p.messages_total,
                bytes_total=p.bytes_total,
            )
            for p in v.producers
        ],
        subscriptions=[subscription_pb(x) for x in v.subscriptions],
        warnings=v.warnings,
    )
    if v.replication is not None:
        rep = v.replication
        out.replication.replicas.extend(str(b) for b in rep.replicas)
        out.replication.in_sync.extend(str(b) for b in rep.in_sync)
        out.replication.min_insync = rep.min_insync
        out.replication.leader_epoch = rep.epoch
        for follower, lag in rep.follower_lag.items():
            out.replication.follower_lag[str(follower)] = lag
    return out


_SUMMED_TOPIC = (
    "msg_rate_in",
    "byte_rate_in",
    "msg_rate_out",
    "byte_rate_out",
    "messages_in_total",
    "bytes_in_total",
    "messages_out_total",
    "bytes_out_total",
    "start_offset",
    "end_offset",
    "message_count",
)
_SUMMED_STORAGE = (
    "wal_bytes",
    "wal_segments",
    "object_bytes",
    "objects",
    "parquet_bytes",
    "parquet_files",
    "total_bytes",
)
_SUMMED_SUB = (
    "backlog_messages",
    "backlog_bytes",
    "unacked_in_flight",
    "waiting_redelivery",
    "redeliveries_total",
    "dead_lettered_total",
    "msg_rate_out",
    "byte_rate_out",
)


def sum_partitions(name: str, parts: Sequence[pb.TopicStats]) -> pb.TopicStats:
    """A partitioned topic's total: counts, rates, sizes and offsets summed; a subscription's backlog summed
    and its lag the largest; producers of one name (one per partition) as one."""
    total = pb.TopicStats(topic=name)
    deliveries = {p.delivery for p in parts}
    total.delivery = deliveries.pop() if len(deliveries) == 1 else "Mixed"
    owners = {p.owner_broker_id for p in parts}
    total.owner_broker_id = owners.pop() if len(owners) == 1 else ""
    total.rate_window_seconds = max((p.rate_window_seconds for p in parts), default=0.0)
    subs: dict[str, pb.SubscriptionStatsEntry] = {}
    producers: dict[str, pb.ProducerStats] = {}
    for p in parts:
        for f in _SUMMED_TOPIC:
            setattr(total, f, getattr(total, f) + getattr(p, f))
        for f in _SUMMED_STORAGE:
            setattr(total.storage, f, getattr(total.storage, f) + getattr(p.storage, f))
        total.warnings.extend(f"{p.topic}: {w}" for w in p.warnings)
        for s in p.subscriptions:
            into = subs.get(s.subscription)
            if into is None:
                into = subs[s.subscription] = pb.SubscriptionStatsEntry(
                    topic=name, subscription=s.subscription, type=s.type, delivery=s.delivery, live=True
                )
            for f in _SUMMED_SUB:
                setattr(into, f, getattr(into, f) + getattr(s, f))
            into.lag_ms = max(into.lag_ms, s.lag_ms)
            into.live = into.live and s.live
            into.consumers.extend(s.consumers)
        for pr in p.producers:
            if pr.name not in producers:
                producers[pr.name] = pb.ProducerStats(
                    producer_id=pr.producer_id,
                    name=pr.name,
                    address=pr.address,
                    connected_since_ms=pr.connected_since_ms,
                )
            into_p = producers[pr.name]
            for f in ("msg_rate_in", "byte_rate_in", "messages_total", "bytes_total"):
                setattr(into_p, f, getattr(into_p, f) + getattr(pr, f))
    total.subscriptions.extend(subs[k] for k in sorted(subs))
    total.producers.extend(producers[k] for k in sorted(producers))
    return total


def lag_order(entries: Iterable[pb.SubscriptionStatsEntry]) -> list[pb.SubscriptionStatsEntry]:
    """Most lagging first: the oldest unacknowledged message, then the backlog, then by name."""
    return sorted(entries, key=lambda e: (-e.lag_ms, -e.backlog_messages, e.topic, e.subscription))


class StatsService:
    def __init__(self, ops: AdminOps, peers: PeerAdmin | None = None) -> None:
        self.ops = ops
        self.broker = ops.broker
        self.collector = StatsCollector(ops.broker)
        self.peers = peers if peers is not None else PeerAdmin(admin_peer_credentials(ops.broker.config))

    @property
    def _cluster(self) -> bool:
        return self.broker.config.mode == "cluster"

    async def _local_topic(self, name: TopicName) -> pb.TopicStats:
        topic = self.broker.topics.get(name.full)
        if topic is None and not self._cluster:
            topic = await self.broker.get_topic(name)  # standalone serves every topic: load it
        if topic is None or topic.closing or not self.broker.placement.serves(name.full):
            raise Unavailable(
                f"{name} is not served by broker {self.ops.broker_id} now (loading or moving); retry"
            )
        return topic_pb(await self.collector.topic(topic))

    async def _one(self, name: TopicName, local: bool, metadata: Sequence[tuple[str, str]]) -> pb.TopicStats:
        if local or not self._cluster:
            return await self._local_topic(name)
        owner = await self.ops.placement_admin.owner(name)
        if owner is None:
            raise Unavailable(f"{name} is waiting for an owner; retry")
        if owner == self.ops.broker_id:
            return await self._local_topic(name)
        addr = await self.ops.placement_admin.admin_addr_of(owner)
        answer = await self.peers.topic_stats(owner, addr, name.full, metadata)
        return answer.total

    async def topic_stats(self, request: pb.TopicStatsRequest, context: Any) -> pb.TopicStatsResponse:
        name, targets = await self.ops.resolve_topic(request.topic)
        metadata = forwarded_metadata(context)
        slots = asyncio.Semaphore(FAN_OUT)

        async def one(t: TopicName) -> pb.TopicStats:
            async with slots:
                return await self._one(t, request.local, metadata)

        parts = list(await asyncio.gather(*(one(t) for t in targets)))
        if targets == [name]:
            return pb.TopicStatsResponse(total=parts[0])
        return pb.TopicStatsResponse(total=sum_partitions(name.full, parts), partitions=parts)

    async def list_subscriptions(
        self, request: pb.ListSubscriptionStatsRequest, context: Any
    ) -> pb.ListSubscriptionStatsResponse:
        namespace = request.namespace.strip("/")
        if namespace:
            await self.ops.namespace_policies(namespace)  # checks the name; NotFound for an unknown one
        out = pb.ListSubscriptionStatsResponse()
        if request.totals_only:
            await self._totals(namespace, request.local, context, out)
            return out
        found: list[pb.SubscriptionStatsEntry] = []
        if request.local or not self._cluster:
            views = await self.collector.local_subscriptions(namespace or None)
            found = [subscription_pb(v) for v in views]
        else:
            found = await self._gather(namespace, forwarded_metadata(context), out)
        if request.lagging:
            found = [e for e in found if e.backlog_messages > 0]
        out.subscriptions.extend(lag_order(found))
        return out

    async def _totals(
        self, namespace: str, local: bool, context: Any, out: pb.ListSubscriptionStatsResponse
    ) -> None:
        """This broker's totals, or (cluster) every live broker's summed; a broker that fails is listed
        in `out.failed_brokers` and left out of the sums."""
        if local or not self._cluster:
            _add(out.totals, local_totals(self.broker, namespace or None))
            return
        brokers = await self.ops.list_brokers()
        metadata = forwarded_metadata(context)
        slots = asyncio.Semaphore(FAN_OUT)
        me = self.ops.broker_id

        async def part(broker_id: int, addr: str) -> SubscriptionTotals | pb.SubscriptionTotals:
            async with slots:
                if broker_id == me:
                    return local_totals(self.broker, namespace or None)
                return (await self.peers.totals(broker_id, addr, namespace, metadata)).totals

        results = await asyncio.gather(
            *(part(b.broker_id, b.admin_addr) for b in brokers), return_exceptions=True
        )
        for b, got in zip(brokers, results, strict=True):
            if isinstance(got, BaseException):
                if not isinstance(got, Exception):
                    raise got
                out.failed_brokers.append(pb.BrokerFailure(broker_id=str(b.broker_id), error=str(got)))
            else:
                _add(out.totals, got)

    async def _gather(
        self,
        namespace: str,
        metadata: Sequence[tuple[str, str]],
        out: pb.ListSubscriptionStatsResponse,
    ) -> list[pb.SubscriptionStatsEntry]:
        """Every live broker's part; one that fails is listed in `out.failed_brokers`."""
        brokers = await self.ops.list_brokers()
        slots = asyncio.Semaphore(FAN_OUT)
        me = self.ops.broker_id

        async def part(broker_id: int, addr: str) -> list[pb.SubscriptionStatsEntry]:
            async with slots:
                if broker_id == me:
                    views = await self.collector.local_subscriptions(namespace or None)
                    return [subscription_pb(v) for v in views]
                answer = await self.peers.subscriptions(broker_id, addr, namespace, metadata)
                return list(answer.subscriptions)

        results = await asyncio.gather(
            *(part(b.broker_id, b.admin_addr) for b in brokers), return_exceptions=True
        )
        seen: dict[tuple[str, str], pb.SubscriptionStatsEntry] = {}
        for b, got in zip(brokers, results, strict=True):
            if isinstance(got, BaseException):
                if not isinstance(got, Exception):
                    raise got
                out.failed_brokers.append(pb.BrokerFailure(broker_id=str(b.broker_id), error=str(got)))
                continue
            for e in got:
                key = (e.topic, e.subscription)
                if key not in seen or (e.live and not seen[key].live):  # a topic caught mid-move
                    seen[key] = e
        return list(seen.values())


def _add(into: pb.SubscriptionTotals, part: SubscriptionTotals | pb.SubscriptionTotals) -> None:
    into.msg_rate_out += part.msg_rate_out
    into.byte_rate_out += part.byte_rate_out
    into.subscriptions += part.subscriptions
    into.lagging += part.lagging
