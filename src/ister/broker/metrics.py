"""Prometheus metrics with Danube's names where Danube has one (reference §9, storage-dispatch §3.18)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge

SUB_LABELS = ("topic", "subscription")

subscription_lag = Gauge(
    "danube_subscription_lag_messages",
    "Messages published but not yet acknowledged by the subscription",
    SUB_LABELS,
)
heartbeat_polls = Counter(
    "danube_dispatcher_heartbeat_polls_total", "Dispatcher wake-ups by the heartbeat lag monitor", SUB_LABELS
)
notifier_polls = Counter(
    "danube_dispatcher_notifier_polls_total", "Dispatcher wake-ups by the publish notifier", SUB_LABELS
)
redeliveries = Counter("danube_subscription_redelivery_total", "Messages delivered again", SUB_LABELS)
nacks = Counter("danube_subscription_nack_total", "Negative acknowledgements received", SUB_LABELS)
dlq_total = Counter("danube_subscription_dlq_total", "Messages moved to the dead-letter topic", SUB_LABELS)
messages_out = Counter("danube_consumer_messages_out_total", "Messages sent to consumers", SUB_LABELS)
bytes_out = Counter("danube_consumer_bytes_out_total", "Payload bytes sent to consumers", SUB_LABELS)
dropped = Counter(
    "ister_nonreliable_dropped_total",
    "Non-reliable messages dropped (no consumer or buffer full)",
    SUB_LABELS,
)
messages_in = Counter("danube_topic_messages_in_total", "Messages published", ("topic",))
bytes_in = Counter("danube_topic_bytes_in_total", "Payload bytes published", ("topic",))
# broker_id: the cluster broker id ("0" in standalone mode)
offsets_skipped = Counter(
    "ister_offsets_skipped_total",
    "Offsets readers skipped because no copy of them exists (a lost tail, unused reservations, damage)",
    ("topic",),
)
topics_loaded = Gauge("danube_broker_topics_owned", "Topics loaded on this broker", ("broker_id",))


def forget_subscription(topic: str, subscription: str) -> None:
    """Drop a subscription's series so gauges of gone subscriptions do not linger."""
    series = (subscription_lag, heartbeat_polls, notifier_polls, redeliveries, nacks, dlq_total)
    for metric in (*series, messages_out, bytes_out, dropped):
        with contextlib.suppress(KeyError):
            metric.remove(topic, subscription)
