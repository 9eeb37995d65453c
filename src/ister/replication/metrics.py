"""Prometheus series of replicated topics (docs/replication.md, deploy/grafana)."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import Counter, Gauge

from ister.histogram import histogram

replica_lag = Gauge(
    "ister_replica_lag_messages",
    "Records a follower lacks, as the topic's leader sees it",
    ("topic", "follower"),
)
replica_lag_seconds = Gauge(
    "ister_replica_lag_seconds",
    "Seconds since a follower last held the leader's whole log",
    ("topic", "follower"),
)
under_replicated = Gauge(
    "ister_under_replicated_topics",
    "Replicated topics led by this broker whose in-sync set lacks a replica",
)
under_min_isr = Gauge(
    "ister_under_min_isr_topics",
    "Replicated topics led by this broker that refuse publishes (too few in-sync replicas)",
)
without_live_isr = Gauge(
    "ister_topics_without_live_isr",
    "Replicated topics none of whose in-sync replicas' brokers is registered (they cannot fail over); "
    "counted by the cluster leader only (0 on other brokers)",
)
isr_shrinks = Counter(
    "ister_isr_shrinks", "Replicas that left the in-sync set of a topic this broker leads (lagging or gone)"
)
isr_expands = Counter(
    "ister_isr_expands", "Replicas that joined the in-sync set of a topic this broker leads"
)
round_trip = histogram(
    "ister_replication_round_trip_seconds",
    "From the leader sending a follower records to that follower acknowledging them (written and fsync'd "
    "there), once per fetch response",
)


class RoundTrips:
    """One follower stream's send times, for `round_trip`: a response with records ending at `end` is
    timed from its send to the first acknowledgement reaching `end` (bounded: the oldest are dropped)."""

    __slots__ = ("_sent",)

    def __init__(self, keep: int = 1024) -> None:
        self._sent: deque[tuple[int, float]] = deque(maxlen=keep)

    def sent(self, end: int) -> None:
        self._sent.append((end, time.monotonic()))

    def acked(self, end: int) -> None:
        sent_at = None
        pending = self._sent
        while pending and pending[0][0] <= end:
            sent_at = pending.popleft()[1]
        if sent_at is not None:
            round_trip.observe(time.monotonic() - sent_at)
