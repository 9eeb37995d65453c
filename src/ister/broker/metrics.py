"""Prometheus metrics with Danube's names where Danube has one (docs/architecture.md §9).

Broker-wide metrics are plain prometheus_client metrics. Per-topic and per-subscription series (labels
`topic`, `subscription`) are kept here instead, in `TopicFamily`s: an increment is an integer add on the
event loop (no lock), and a scrape exports them for a bounded set of topics only (`TopicSeries`): none
with `metrics.per_topic: false`, else the `metrics.max_topics` topics with the largest backlog, then the
most traffic. Broker totals (`ister_broker_*`) always cover every topic, exported or not.

Threads: only the event loop changes the families; the metrics server thread reads them. It copies a
family's children with one `dict.copy()` (atomic under the GIL: the keys are tuples of str) and reads
integers, so a scrape never waits for the loop, and the loop waits for a scrape only when it removes a
series (a topic or subscription closing) during that copy.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ister.histogram import histogram

SUB_LABELS = ("topic", "subscription")
TOPIC_LABELS = ("topic",)


class Child:
    """One series: a number the event loop sets or adds to."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float = 0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class Snapshot(NamedTuple):
    children: dict[tuple[str, ...], Child]
    removed: float


class TopicFamily:
    """A metric family with a `topic` label (first) and maybe more; exported by `TopicSeries`.

    `labels(...)` and `remove(...)` work as prometheus_client's. A counter remembers what removed series
    had counted, so its broker total (`total_name`) never goes backwards when a topic unloads.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        kind: Literal["counter", "gauge"],
        labelnames: tuple[str, ...],
        total_name: str | None = None,
        total_documentation: str = "",
        rank: Literal["backlog", "traffic"] | None = None,
    ) -> None:
        if labelnames[0] != "topic":
            raise ValueError("the first label of a topic family is `topic`")
        self.name = name  # a counter's name without `_total`, as prometheus_client takes it
        self.documentation = documentation
        self.kind = kind
        self.labelnames = labelnames
        self.total_name = total_name
        self.total_documentation = total_documentation
        self.rank = rank  # what this family adds to a topic's rank when series are bounded (TopicSeries)
        self._children: dict[tuple[str, ...], Child] = {}
        self._removed = 0.0  # what removed counter series had counted (for the broker total)
        # Taken by `remove` and `snapshot` only (both rare): a scrape never sees a removed series' count
        # in neither or both of `_children` and `_removed`, so the broker total never dips.
        self._lock = threading.Lock()

    def labels(self, *values: str) -> Child:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = Child()
        return child

    def remove(self, *values: str) -> None:
        """Drop a series (KeyError when there is none, as prometheus_client)."""
        with self._lock:
            child = self._children.pop(values)
            if self.kind == "counter":
                self._removed += child.value

    def clear(self) -> None:
        for values in list(self._children):
            self.remove(*values)

    def snapshot(self) -> Snapshot:
        """The children as they are now and what removed ones counted (safe from another thread)."""
        with self._lock:
            return Snapshot(self._children.copy(), self._removed)

    def value(self, *values: str) -> float | None:
        child = self._children.get(values)
        return None if child is None else child.value

    @staticmethod
    def total(snapshot: Snapshot) -> float:
        """The broker total: every series summed, plus (a counter) what removed ones had counted."""
        return sum(c.value for c in snapshot.children.values()) + snapshot.removed

    def family(self, children: Iterable[tuple[tuple[str, ...], Child]]) -> Metric:
        metric: Metric
        if self.kind == "counter":
            metric = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        else:
            metric = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in children:
            metric.add_metric(values, child.value)
        return metric


subscription_lag = TopicFamily(
    "danube_subscription_lag_messages",
    "Messages published but not yet acknowledged by the subscription",
    "gauge",
    SUB_LABELS,
    "ister_broker_subscription_lag_messages",
    "Messages published but not yet acknowledged, summed over every subscription on this broker",
    rank="backlog",
)
heartbeat_polls = TopicFamily(
    "danube_dispatcher_heartbeat_polls",
    "Dispatcher wake-ups by the heartbeat lag monitor",
    "counter",
    SUB_LABELS,
)
notifier_polls = TopicFamily(
    "danube_dispatcher_notifier_polls", "Dispatcher wake-ups by the publish notifier", "counter", SUB_LABELS
)
redeliveries = TopicFamily(
    "danube_subscription_redelivery", "Messages delivered again", "counter", SUB_LABELS
)
nacks = TopicFamily("danube_subscription_nack", "Negative acknowledgements received", "counter", SUB_LABELS)
dlq_total = TopicFamily(
    "danube_subscription_dlq", "Messages moved to the dead-letter topic", "counter", SUB_LABELS
)
messages_out = TopicFamily(
    "danube_consumer_messages_out",
    "Messages sent to consumers",
    "counter",
    SUB_LABELS,
    "ister_broker_messages_out",
    "Messages sent to consumers of every topic on this broker",
    rank="traffic",
)
bytes_out = TopicFamily(
    "danube_consumer_bytes_out",
    "Payload bytes sent to consumers",
    "counter",
    SUB_LABELS,
    "ister_broker_bytes_out",
    "Payload bytes sent to consumers of every topic on this broker",
)
dropped = TopicFamily(
    "ister_nonreliable_dropped",
    "Non-reliable messages dropped (no consumer or buffer full)",
    "counter",
    SUB_LABELS,
)
messages_in = TopicFamily(
    "danube_topic_messages_in",
    "Messages published",
    "counter",
    TOPIC_LABELS,
    "ister_broker_messages_in",
    "Messages published to every topic on this broker",
    rank="traffic",
)
bytes_in = TopicFamily(
    "danube_topic_bytes_in",
    "Payload bytes published",
    "counter",
    TOPIC_LABELS,
    "ister_broker_bytes_in",
    "Payload bytes published to every topic on this broker",
)
offsets_skipped = TopicFamily(
    "ister_offsets_skipped",
    "Offsets readers skipped because no copy of them exists (a lost tail, unused reservations, damage)",
    "counter",
    TOPIC_LABELS,
)
# Storage of each reliable topic this broker owns (broker/topic_meter.py, refreshed by the export walk)
wal_bytes = TopicFamily(
    "ister_topic_wal_bytes",
    "Bytes of the topic's WAL segment files on this broker's disk",
    "gauge",
    TOPIC_LABELS,
    "ister_broker_wal_bytes",
    "Bytes of the WAL segment files of every topic this broker owns",
)
object_bytes = TopicFamily(
    "ister_topic_object_bytes",
    "Bytes of the topic's objects in the durable tier (as of its last export pass)",
    "gauge",
    TOPIC_LABELS,
    "ister_broker_object_bytes",
    "Bytes of the durable-tier objects of every topic this broker owns",
)
start_offset = TopicFamily(
    "ister_topic_start_offset",
    "The topic's first offset kept (retention moves it forward)",
    "gauge",
    TOPIC_LABELS,
)
end_offset = TopicFamily(
    "ister_topic_end_offset",
    "The offset the topic's next message gets (committed end; end - start = messages kept)",
    "gauge",
    TOPIC_LABELS,
)
export_backlog_bytes = TopicFamily(
    "ister_topic_export_backlog_bytes",
    "Bytes of the WAL files that hold records not yet exported to the durable tier",
    "gauge",
    TOPIC_LABELS,
    "ister_broker_export_backlog_bytes",
    "Bytes of WAL files holding records not yet exported, over every topic this broker owns",
)
export_backlog_age = TopicFamily(
    "ister_topic_export_backlog_age_seconds",
    "Age of the topic's oldest record not yet exported to the durable tier (0: none)",
    "gauge",
    TOPIC_LABELS,
)
export_backlog_oldest = Gauge(
    "ister_export_backlog_oldest_seconds",
    "Age of the oldest record not yet exported to the durable tier, over every topic this broker owns",
)
STORAGE_FAMILIES = (
    wal_bytes,
    object_bytes,
    start_offset,
    end_offset,
    export_backlog_bytes,
    export_backlog_age,
)

# Latency histograms (ister/histogram.py): observed once per batch, delivery or ack call
publish_durable = histogram(
    "ister_publish_durable_seconds",
    "Reliable publish batches: from the broker taking the batch to its records being fsync'd to the local "
    "WAL",
)
publish_committed = histogram(
    "ister_publish_committed_seconds",
    "Reliable publish batches: from the broker taking the batch to its acknowledgement (committed: durable "
    "here and, on a replicated topic, on min_insync_replicas)",
)
dispatch_delay = histogram(
    "ister_dispatch_delay_seconds",
    "First deliveries: from the oldest record's publish time (the producer's clock) to its delivery to a "
    "consumer stream, once per delivered batch",
)
ack_latency = histogram(
    "ister_ack_latency_seconds",
    "Acknowledgements: from the delivery of the acknowledged message to its ack (millisecond clock), once "
    "per ack request",
)

# Retention (broker/retention.py): broker totals
retention_deleted_units = Counter(
    "ister_retention_deleted_units", "Whole units (objects or WAL files) retention deleted on this broker"
)
retention_failures = Counter(
    "ister_retention_failures", "Retention passes that failed (the metadata or object store was down)"
)
retention_skipped = Counter(
    "ister_retention_skipped_messages",
    "Messages subscriptions never received because retention deleted them first (the cursor moved to the "
    "topic's start offset)",
)
quota_refusals = Counter(
    "ister_backlog_quota_refusals",
    "Publishes refused because a topic's slowest subscription is past its quota",
)
quota_evicted = Counter(
    "ister_backlog_quota_evicted_messages",
    "Unacknowledged messages subscriptions skipped because the backlog quota's consumer_eviction moved "
    "them on",
)
ttl_expired = Counter(
    "ister_message_ttl_expired",
    "Unacknowledged messages acknowledged on their subscription's behalf because they outlived the TTL",
)
# Failover subscriptions on partitioned topics (broker/partition_groups.py): broker totals, bounded.
publishes_refused = Counter(
    "ister_publishes_refused",
    "Messages refused at publish, by reason (disk_full: the data disk is below its headroom, or full)",
    ("reason",),
)
publishes_refused.labels("disk_full")  # exported as 0 from the start
# Enforced limits (docs/limits.md): refusals by the limit's name, and the time rate limits held work back.
LIMIT_NAMES = (
    "max_publish_rate",
    "max_publish_rate_bytes",
    "max_producers_per_topic",
    "max_subscriptions_per_topic",
    "max_consumers_per_topic",
    "max_consumers_per_subscription",
    "max_topics_per_namespace",
)
limit_refusals = Counter(
    "ister_limit_refusals", "Requests refused by a namespace or topic limit, by the limit's name", ("limit",)
)
for _name in LIMIT_NAMES:
    limit_refusals.labels(_name)  # exported as 0 from the start
publish_throttled = Counter(
    "ister_publish_throttled", "Publishes (batches or single messages) a publish rate limit held back"
)
publish_throttled_seconds = Counter(
    "ister_publish_throttled_seconds", "Seconds publishes waited for a publish rate limit, summed"
)
dispatch_throttled_seconds = Counter(
    "ister_dispatch_throttled_seconds",
    "Seconds subscriptions' dispatch paused for max_subscription_dispatch_rate, summed",
)
idempotent_duplicates = Counter(
    "ister_publish_duplicates",
    "Messages of retried idempotent batches answered with their original offsets, not stored again",
)
idempotent_refused = Counter(
    "ister_publish_sequence_refusals",
    "Idempotent batches refused for their sequence (a gap, or a duplicate no longer remembered)",
)
idempotent_evicted = Counter(
    "ister_idempotence_evicted_producers",
    "Producer keys a topic's idempotence table forgot (idle past the window, or least recently used past "
    "max_producers): their retries would be stored again",
)
partition_handoffs = Counter("ister_partition_handoffs", "Partitions switched to another consumer")
partition_handoff_seconds = Histogram(
    "ister_partition_handoff_seconds",
    "How long a moving partition paused before it switched",
    buckets=(0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
)
partition_handoff_redelivered = Counter(
    "ister_partition_handoff_redelivered",
    "Delivered, unacknowledged messages a switch sent to the new consumer",
)
partition_spread = Gauge(
    "ister_partitions_per_consumer",
    "Over the partition groups of this broker (cluster: those it coordinates, all their partitions): the "
    "most and the fewest partitions one consumer has",
    ("bound",),
)
# broker_id: the cluster broker id ("0" in standalone mode)
topics_loaded = Gauge("danube_broker_topics_owned", "Topics loaded on this broker", ("broker_id",))

SUBSCRIPTION_FAMILIES = (
    subscription_lag,
    heartbeat_polls,
    notifier_polls,
    redeliveries,
    nacks,
    dlq_total,
    messages_out,
    bytes_out,
    dropped,
)
TOPIC_OWN_FAMILIES = (messages_in, bytes_in, offsets_skipped, *STORAGE_FAMILIES)
TOPIC_FAMILIES = (*SUBSCRIPTION_FAMILIES, *TOPIC_OWN_FAMILIES)


def forget_subscription(topic: str, subscription: str) -> None:
    """Drop a subscription's series so gauges of gone subscriptions do not linger."""
    for family in SUBSCRIPTION_FAMILIES:
        with contextlib.suppress(KeyError):
            family.remove(topic, subscription)


def forget_topic(topic: str) -> None:
    """Drop a topic's own series (its subscriptions drop theirs when they close)."""
    for family in TOPIC_OWN_FAMILIES:
        with contextlib.suppress(KeyError):
            family.remove(topic)


class TopicSeries:
    """The prometheus_client collector of every `TopicFamily`, bounded to `max_topics` topics.

    A topic's rank: its backlog (summed subscription lag), then messages in plus out, then its name (so
    the choice is stable while nothing changes). `per_topic=False` exports no per-topic series at all.
    Broker totals and `ister_metrics_topics` (exported/omitted) are always exported.
    """

    def __init__(
        self,
        families: tuple[TopicFamily, ...] = TOPIC_FAMILIES,
        *,
        per_topic: bool = True,
        max_topics: int = 0,
    ) -> None:
        self.families = families
        self.per_topic = per_topic
        self.max_topics = max_topics

    def describe(self) -> list[Metric]:
        return []  # no fixed description: registering does not run a collection

    def collect(self) -> Iterator[Metric]:
        snapshots = [(family, family.snapshot()) for family in self.families]
        topics: set[str] = set()
        for _, snap in snapshots:
            topics.update(values[0] for values in snap.children)
        chosen = self.choose(topics, [(family, snap.children) for family, snap in snapshots])
        for family, snap in snapshots:
            if chosen:
                yield family.family((v, c) for v, c in snap.children.items() if v[0] in chosen)
            if family.total_name is not None:
                total_cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                yield total_cls(family.total_name, family.total_documentation, value=family.total(snap))
        shown = GaugeMetricFamily(
            "ister_metrics_topics",
            "Topics with metric series on this broker: exported in full, or omitted (metrics.max_topics)",
            labels=("series",),
        )
        shown.add_metric(("exported",), len(chosen))
        shown.add_metric(("omitted",), len(topics) - len(chosen))
        yield shown

    def choose(
        self, topics: set[str], snapshots: list[tuple[TopicFamily, dict[tuple[str, ...], Child]]]
    ) -> set[str]:
        if not self.per_topic or self.max_topics <= 0:
            return set()
        if len(topics) <= self.max_topics:
            return topics
        backlog: dict[str, float] = dict.fromkeys(topics, 0.0)
        traffic: dict[str, float] = dict.fromkeys(topics, 0.0)
        for family, children in snapshots:
            if family.rank is not None:
                into = backlog if family.rank == "backlog" else traffic
                for values, child in children.items():
                    into[values[0]] += child.value
        ranked = heapq.nsmallest(self.max_topics, topics, key=lambda t: (-backlog[t], -traffic[t], t))
        return set(ranked)


collector = TopicSeries()
REGISTRY.register(collector)


def configure(*, per_topic: bool, max_topics: int) -> None:
    """Apply the `metrics` settings (at broker start)."""
    collector.per_topic = per_topic
    collector.max_topics = max_topics
