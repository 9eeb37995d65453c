"""IsterAdmin.GetClusterHealth on a real 3-broker cluster (its own etcd, broker processes), as
`ister admin cluster health` and the console's overview and rebalancing page show it: rebalancing moves
with their reason, a failed move, an under-replicated and an under-min-ISR topic; then etcd down.

The story: one broker starts with six non-reliable topics and one reliable topic holding records. Two more
brokers join and the load manager (aggressive, test-sized) moves topics to them: history entries. The
cluster has no durable tier, so the reliable topic cannot move (its records exist only on its owner): the
unload asked for it fails and the owner records why. Two topics with 3 replicas (minimum in sync 2 and 3)
lose one broker: one is under-replicated, the other below its minimum in-sync set.
"""

from __future__ import annotations

import asyncio
import html
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from ister.client import Client
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.console.console_support import console, get
from tests.etcd_server import EtcdServer, etcd_binary
from tests.integration.cluster import Cluster
from tests.integration.replication_support import replica_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ISTER = [sys.executable, "-m", "ister.cli"]
SPREAD = [f"/default/spread{i}" for i in range(6)]
STUCK = "/default/stuck"  # reliable, with records, no durable tier: cannot move
REP2 = "/default/rep_min2"  # 3 replicas, min 2 in sync: under-replicated with one broker gone
REP3 = "/default/rep_min3"  # 3 replicas, min 3 in sync: under min in-sync with one broker gone


def config(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "load_manager": {
                    "assignment_strategy": "fair",
                    "load_report_interval_seconds": 0.5,
                    "rebalancing": {
                        "enabled": True,
                        "aggressiveness": "aggressive",
                        "check_interval_seconds": 1,
                        "max_moves_per_hour": 100,
                        "cooldown_seconds": 1,
                        "min_brokers_for_rebalance": 2,
                        "min_topic_age_seconds": 1,
                        # Only the operator's unload moves it: its failure is the test's, not a race.
                        "blacklist_topics": [STUCK],
                    },
                },
            }
        )
    )
    return path


def cli(admin_addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*ISTER, "admin", *args, "--admin-addr", admin_addr]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)


async def publish(url: str, topic: str, count: int) -> None:
    async with Client(url) as ister:
        pub = await ister.producer(topic)
        await pub.send_batch([f"m{i}".encode() for i in range(count)])
        await pub.flush()


def topics_of(rows: Any) -> list[str]:
    return [r.topic for r in rows]


@pytest.fixture
def etcd(tmp_path: Path) -> Any:
    """An etcd of this test alone: it is stopped while the cluster runs."""
    if etcd_binary() is None:
        pytest.skip(
            "etcd is not installed: run `make test` (installs etcd-server) or apt-get install etcd-server"
        )
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    yield server
    server.stop()


async def test_moves_failed_moves_and_replication_on_a_cluster(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = Cluster(tmp_path, etcd.endpoint, 3, 2, "--config-file", str(config(tmp_path / "ister.yml")))
    try:
        await cluster.start(1)
        entry = cluster.brokers[0]
        async with grpc.aio.insecure_channel(entry.admin_addr) as channel:
            topics = apb_grpc.TopicAdminStub(channel)
            ister = ipb_grpc.IsterAdminStub(channel)
            for t in SPREAD:
                await topics.CreateTopic(apb.NewTopicRequest(name=t, dispatch_strategy=apb.NonReliable))
            await topics.CreateTopic(apb.NewTopicRequest(name=STUCK, dispatch_strategy=apb.Reliable))
            await publish(entry.url, STUCK, 10)
            await cluster.until(
                lambda: _assigned(cluster, [*SPREAD, STUCK]), "the topics assigned to the first broker"
            )
            await cluster.start_more()
            await cluster.until(cluster.all_registered, "three brokers registered")

            # The unload an operator asks for fails: the owner keeps the topic and says why.
            refused = await asyncio.to_thread(cli, entry.admin_addr, "topics", "unload", STUCK)
            assert refused.returncode == 1 and "no durable tier" in refused.stderr, refused.stderr

            for name, least in ((REP2, 2), (REP3, 3)):
                await topics.CreateTopic(
                    apb.NewTopicRequest(
                        name=name,
                        dispatch_strategy=apb.Reliable,
                        replication_factor=3,
                        min_insync_replicas=least,
                    )
                )
                await publish(entry.url, name, 10)

            async def all_in_sync() -> bool:
                records = [await replica_record(cluster, t) for t in (REP2, REP3)]
                return all(r is not None and len(r.isr) == 3 for r in records)

            await cluster.until(all_in_sync, "both replicated topics with 3 in sync", 60)

            async def moved_and_failed() -> Any:
                h = await ister.GetClusterHealth(ipb.ClusterHealthRequest(), timeout=10)
                return h if h.moves and STUCK in topics_of(h.failed_moves) else None

            h = await cluster.until(moved_and_failed, "a rebalancing move and the failed move", 90)
            assert h.mode == "cluster" and not h.note and h.replicated_topics == 2
            assert not h.under_replicated and not h.under_min_isr  # every replica is in sync
            assert all(m.reason == "LoadImbalance" and m.from_broker != m.to_broker for m in h.moves)
            assert h.moves_total >= len(h.moves) >= 1
            failed = next(f for f in h.failed_moves if f.topic == STUCK)
            assert "no durable tier" in failed.cause and failed.code == "failed_precondition"
            assert failed.from_broker == cluster.broker_id(entry) and failed.failures >= 1

            # One broker goes: both replicated topics lose a live in-sync replica.
            victim = cluster.brokers[1]
            victim_id = cluster.broker_id(victim)
            victim.kill9()

            async def degraded() -> Any:
                h = await ister.GetClusterHealth(ipb.ClusterHealthRequest(), timeout=10)
                return (
                    h
                    if topics_of(h.under_replicated) == [REP2] and topics_of(h.under_min_isr) == [REP3]
                    else None
                )

            h = await cluster.until(degraded, "one under-replicated and one under-min-ISR topic", 60)
            for issue in (h.under_replicated[0], h.under_min_isr[0]):
                assert len(issue.replicas) == 3 and victim_id not in issue.live_in_sync
            assert h.under_replicated[0].state == "under-replicated"
            assert (
                h.under_min_isr[0].state == "under min in-sync"
                and h.under_min_isr[0].min_insync_replicas == 3
            )

        # The command line: JSON for scripts, tables for people.
        shown = await asyncio.to_thread(cli, entry.admin_addr, "cluster", "health", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        answer = json.loads(shown.stdout)
        assert answer["mode"] == "cluster"
        assert [i["topic"] for i in answer["under_replicated"]] == [REP2]
        assert [i["topic"] for i in answer["under_min_isr"]] == [REP3]
        assert STUCK in [f["topic"] for f in answer["failed_moves"]] and answer["moves"]
        assert all(isinstance(m["from"], str) for m in answer["moves"])  # u64 ids as strings
        table = await asyncio.to_thread(cli, entry.admin_addr, "cluster", "health")
        assert table.returncode == 0 and "Under-replicated:" in table.stdout
        for name in (REP2, REP3, STUCK, "LoadImbalance"):
            assert name in table.stdout, table.stdout

        # The console: the overview lists them, the rebalancing page the moves with their reasons.
        with console(entry.admin_addr) as base:
            status, body = await asyncio.to_thread(get, base + "/")
            assert status == 200
            assert REP2 in _table(body, "under-replicated") and REP3 in _table(body, "under-min-isr")
            assert STUCK in _table(body, "failed-moves") and "no durable tier" in _table(body, "failed-moves")
            assert 'id="count-under-replicated">1<' in body and 'id="count-failed-moves">1<' in body
            # The topics page on a cluster: the broker's page, with the owners.
            status, body = await asyncio.to_thread(get, base + "/topics?sort=broker&size=500")
            assert status == 200 and "9 topics match" in body
            owner = cluster.broker_id(entry)
            assert f'<a href="/topic{STUCK}">{STUCK}</a></td><td>{owner}</td>' in body
            status, body = await asyncio.to_thread(get, base + "/rebalancing")
            assert status == 200 and "LoadImbalance" in _table(body, "recent-moves")
            assert STUCK in _table(body, "failed-moves")

            # etcd down: a clear error, not a stale picture and not a traceback.
            etcd.stop()
            down = await asyncio.to_thread(cli, entry.admin_addr, "cluster", "health")
            assert down.returncode == 1 and down.stderr.startswith("error:"), down.stderr
            assert "etcd" in down.stderr and "Traceback" not in down.stderr, down.stderr
            status, body = await asyncio.to_thread(get, base + "/rebalancing")
            assert 'id="health-note"' in body and "could not read the cluster&#39;s health" in body, body
            assert "Traceback" not in html.unescape(body)
    finally:
        await cluster.stop()


async def _assigned(cluster: Cluster, names: list[str]) -> bool:
    found = await cluster.assignments()
    return all(t in found for t in names)


def _table(body: str, table_id: str) -> str:
    start = body.index(f'<table id="{table_id}">')
    return html.unescape(body[start : body.index("</table>", start)])
