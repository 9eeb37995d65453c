"""Prometheus series of replicated topics (docs/replication.md, deploy/grafana)."""

from __future__ import annotations

from prometheus_client import Gauge

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
