"""deploy/grafana/ister-cluster.json: valid dashboard JSON that queries every metric it is meant to show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.exported_metrics import exported, metrics_in

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ister-cluster.json"

METRICS = (
    # cluster balance (leader only)
    "danube_cluster_balance_cv",
    "danube_cluster_balance_mean_load",
    "danube_cluster_balance_max_load",
    "danube_cluster_balance_min_load",
    "danube_cluster_balance_std_dev",
    "danube_cluster_active_brokers",
    # rebalancing
    "danube_rebalancing_checks_total",
    "danube_rebalancing_moves_total",
    "danube_rebalancing_failures_total",
    "danube_rebalancing_cycle_duration_seconds_bucket",
    # assignments
    "danube_topic_assignments_total",
    # per broker
    "danube_broker_topics_owned",
    "ister_broker_cpu_usage_ratio",
    "ister_broker_memory_usage_ratio",
    "ister_event_loop_stalls_total",
    "ister_gc_pauses_total",
    "ister_broker_bytes_in_total",
    # produce and consume (names as in ister.broker.metrics)
    "danube_topic_messages_in_total",
    "danube_topic_bytes_in_total",
    "danube_consumer_messages_out_total",
    "ister_broker_messages_out_total",
    "ister_metrics_topics",
    # lag
    "danube_subscription_lag_messages",
    "ister_broker_subscription_lag_messages",
    # latency
    "ister_publish_committed_seconds_bucket",
    "ister_publish_durable_seconds_bucket",
    "ister_wal_fsync_seconds_bucket",
    "ister_replication_round_trip_seconds_bucket",
    "ister_dispatch_delay_seconds_bucket",
    "ister_ack_latency_seconds_bucket",
    # redeliveries and dead letters
    "danube_subscription_redelivery_total",
    "danube_subscription_nack_total",
    "danube_subscription_dlq_total",
    # replication
    "ister_under_replicated_topics",
    "ister_under_min_isr_topics",
    "ister_isr_shrinks_total",
    "ister_replica_lag_messages",
    # storage and export
    "ister_broker_wal_bytes",
    "ister_broker_object_bytes",
    "ister_data_disk_free_bytes",
    "ister_data_disk_headroom_bytes",
    "ister_broker_export_backlog_bytes",
    "ister_export_backlog_oldest_seconds",
    "ister_object_store_errors_total",
    "ister_retention_failures_total",
)
ROWS = (
    "Cluster balance",
    "Rebalancing",
    "Brokers",
    "Produce and consume",
    "Lag",
    "Latency",
    "Redeliveries and dead letters",
    "Replication",
    "Storage and export",
)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _graphs(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(dashboard) if p["type"] != "row"]


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _graphs(dashboard) for t in p["targets"]]


def test_top_level(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"].strip()
    assert dashboard["uid"] == "ister-cluster"
    assert len(dashboard["uid"]) <= 40
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["panels"]


def test_panels_have_ids_and_grid(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in _panels(dashboard)]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert {"x", "y", "w", "h"} <= grid.keys(), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def test_no_overlapping_panels(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_panels_have_targets(dashboard: dict[str, Any]) -> None:
    for panel in _graphs(dashboard):
        assert panel["title"].strip()
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["expr"].strip(), panel["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert t["datasource"]["uid"] == "${datasource}", panel["title"]


def test_rows(dashboard: dict[str, Any]) -> None:
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == list(ROWS)


def test_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource"
    assert ds["query"] == "prometheus"
    broker = variables["broker_id"]
    assert broker["type"] == "query"
    assert broker["multi"] is True
    assert broker["datasource"]["uid"] == "${datasource}"
    query = broker["query"]
    text = query["query"] if isinstance(query, dict) else query
    assert text == "label_values(danube_broker_topics_owned, broker_id)"


@pytest.mark.parametrize("metric", METRICS)
def test_metric_is_queried(dashboard: dict[str, Any], metric: str) -> None:
    assert any(metric in expr for expr in _exprs(dashboard)), metric


def test_cv_thresholds(dashboard: dict[str, Any]) -> None:
    cv = [
        p for p in _graphs(dashboard) if any("danube_cluster_balance_cv" in t["expr"] for t in p["targets"])
    ]
    assert cv
    for panel in cv:
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["value"] for s in steps] == [None, 0.2, 0.3, 0.4]
        assert len({s["color"] for s in steps}) == 4


def test_topic_metric_names_match_the_broker() -> None:
    from ister.broker import metrics

    names = {m.name for m in (metrics.subscription_lag, metrics.messages_in, metrics.bytes_in)}
    # a counter family's name is without the `_total` of its samples, as in prometheus_client
    assert names == {"danube_subscription_lag_messages", "danube_topic_messages_in", "danube_topic_bytes_in"}


def test_every_series_a_panel_reads_is_exported_by_the_broker(dashboard: dict[str, Any]) -> None:
    names = exported()
    for panel in _graphs(dashboard):
        for target in panel["targets"]:
            missing = metrics_in(target["expr"]) - names
            assert not missing, f"{panel['title']}: {sorted(missing)} not exported by the broker"


def test_latency_panels_are_quantiles_of_histograms(dashboard: dict[str, Any]) -> None:
    rows = _rows_of(dashboard)
    latency = [p for p in _graphs(dashboard) if rows[p["id"]] == "Latency"]
    assert len(latency) == 6
    for panel in latency:
        assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]
        for target in panel["targets"]:
            assert target["expr"].startswith("histogram_quantile("), target["expr"]
            assert "_seconds_bucket[$__rate_interval]" in target["expr"], target["expr"]


def _rows_of(dashboard: dict[str, Any]) -> dict[int, str]:
    """Panel id -> the title of the row above it (rows are not collapsed)."""
    out: dict[int, str] = {}
    current = ""
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if panel["type"] == "row":
            current = panel["title"]
        else:
            out[panel["id"]] = current
    return out
