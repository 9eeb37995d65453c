"""Cluster metrics with Danube's names (docs/architecture.md §9, §13). Balance gauges are set by the leader
only."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

balance_cv = Gauge("danube_cluster_balance_cv", "Coefficient of variation of the active brokers' loads")
balance_mean = Gauge("danube_cluster_balance_mean_load", "Mean load score of the active brokers")
balance_max = Gauge("danube_cluster_balance_max_load", "Highest load score among the active brokers")
balance_min = Gauge("danube_cluster_balance_min_load", "Lowest load score among the active brokers")
balance_std = Gauge("danube_cluster_balance_std_dev", "Population standard deviation of the load scores")
active_brokers = Gauge("danube_cluster_active_brokers", "Registered brokers in state active")

rebalancing_checks = Counter("danube_rebalancing_checks_total", "Rebalancing cycles run by the leader")
rebalancing_moves = Counter("danube_rebalancing_moves_total", "Topic moves started by rebalancing")
rebalancing_failures = Counter("danube_rebalancing_failures_total", "Rebalancing moves that failed to start")
rebalancing_cycle = Histogram(
    "danube_rebalancing_cycle_duration_seconds", "Duration of one rebalancing cycle on the leader"
)

topic_assignments = Counter(
    "danube_topic_assignments_total", "Topic assignment changes made by the leader", ("broker_id", "action")
)
# danube_broker_topics_owned{broker_id} is ister.broker.metrics.topics_loaded (set in standalone mode too)
# Seed 002 named these danube_broker_cpu_usage / memory_usage (percent) and danube_broker_throughput_mbps
# (a MB/s gauge); Danube itself neither exports nor queries them (its console reads danube_topic_* and
# danube_consumer_* counters), so they carry units here: ratios 0-1, and the bytes counter
# ister_broker_bytes_in_total instead of a throughput gauge (docs/metrics.md).
cpu_usage = Gauge(
    "ister_broker_cpu_usage_ratio",
    "CPU usage of this broker's host (0-1), as in its last load report",
    ("broker_id",),
)
memory_usage = Gauge(
    "ister_broker_memory_usage_ratio",
    "Memory usage of this broker's host (0-1), as in its last load report",
    ("broker_id",),
)
failed_moves = Counter(
    "ister_failed_moves_total", "Moves of a topic off this broker that failed (the topic stayed here)"
)
