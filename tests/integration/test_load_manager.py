"""Load manager with real processes: drain a broker to empty; new brokers get topics by rebalancing.

3 brokers on etcd, aggressive test-sized rebalancing, the official danube-client producing and consuming
throughout; every move goes through the unload path (nothing lost, offsets dense).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.etcd_server import EtcdServer
from tests.integration.cluster import WAIT, Cluster
from tests.integration.harness import client, consumer, producer

pytestmark = pytest.mark.timeout(240)
ISTER = [sys.executable, "-m", "ister.cli"]
TOPICS = [f"/default/lm{i}" for i in range(6)]


def config(path: Path, rebalancing: bool) -> Path:
    """Test-sized load manager settings; the brokers share a file:// durable tier (one machine), so reliable
    topics with records may move."""
    path.write_text(
        yaml.safe_dump(
            {
                "storage": {"durable": {"url": f"file://{path.parent / 'objects'}"}},
                "load_manager": {
                    "assignment_strategy": "fair",
                    "load_report_interval_seconds": 0.5,
                    "rebalancing": {
                        "enabled": rebalancing,
                        "aggressiveness": "aggressive",
                        "check_interval_seconds": 1,
                        "max_moves_per_hour": 100,
                        "cooldown_seconds": 1,
                        "min_brokers_for_rebalance": 2,
                        "min_topic_age_seconds": 1,
                        "blacklist_topics": [],
                    },
                },
            }
        )
    )
    return path


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    """3 brokers (not started yet) with rebalancing configured but disabled."""
    cfg = config(tmp_path / "ister.yml", rebalancing=False)
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(cfg))
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def rebalancing_cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    """3 brokers (not started yet) with aggressive, test-sized rebalancing enabled."""
    cfg = config(tmp_path / "ister.yml", rebalancing=True)
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(cfg))
    try:
        yield c
    finally:
        await c.stop()


async def owners(cluster: Cluster) -> dict[str, int] | None:
    found = await cluster.assignments()
    return found if all(t in found for t in TOPICS) else None


async def exchange(p: object, queue: asyncio.Queue, cons: object, label: str) -> None:  # type: ignore[type-arg]
    await p.send(label.encode(), {})  # type: ignore[attr-defined]
    while True:
        msg = await asyncio.wait_for(queue.get(), WAIT)
        await cons.ack(msg)  # type: ignore[attr-defined]
        if msg.payload == label.encode():
            return


async def test_drain_moves_every_topic_away(cluster: Cluster) -> None:
    await cluster.start()
    c = await client(cluster.brokers[0].url)
    for t in TOPICS:
        await producer(c, t, "setup", reliable=True)
    before = await cluster.until(lambda: owners(cluster), "topics assigned")
    victim = before[TOPICS[0]]
    p = await producer(c, TOPICS[0], "p", reliable=True)
    cons, queue = await consumer(c, TOPICS[0], "c", "s")
    await exchange(p, queue, cons, "before-drain")
    proc = cluster.process_of(victim)
    done = await asyncio.to_thread(
        subprocess.run,
        [*ISTER, "admin", "brokers", "drain", str(victim), "--admin-addr", proc.admin_addr],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def drained() -> bool:
        found = await cluster.assignments()
        assert cluster.store is not None
        state = await cluster.store.get(f"/cluster/brokers/{victim}/state")
        return (
            all(t in found for t in TOPICS)
            and victim not in found.values()
            and state is not None
            and state.value.get("mode") == "drained"
        )

    await cluster.until(drained, "the broker drained", 90)
    await exchange(p, queue, cons, "after-drain")  # the clients followed the topic
    # A drained broker gets no new topics.
    for i in range(4):
        await producer(c, f"/default/after_drain{i}", "p", reliable=True)
    found = await cluster.assignments()
    assert victim not in {found[f"/default/after_drain{i}"] for i in range(4)}
    await cons.close()


async def test_new_brokers_receive_topics_by_rebalancing(rebalancing_cluster: Cluster) -> None:
    cluster = rebalancing_cluster
    await cluster.start(1)
    c = await client(cluster.brokers[0].url)
    for t in TOPICS:
        await producer(c, t, "setup", reliable=True)
    first = await cluster.until(lambda: owners(cluster), "topics assigned")
    assert len(set(first.values())) == 1
    p = await producer(c, TOPICS[0], "p", reliable=True)
    cons, queue = await consumer(c, TOPICS[0], "c", "s")
    await exchange(p, queue, cons, "before")
    await cluster.start_more()

    async def spread() -> dict[str, int] | None:
        found = await owners(cluster)
        if found is None:
            return None
        counts = Counter(found.values())
        return found if len(counts) == 3 and max(counts.values()) - min(counts.values()) <= 1 else None

    final = await cluster.until(spread, "topics spread over the new brokers", 120)
    assert sorted(Counter(final.values()).values()) == [2, 2, 2]
    await exchange(p, queue, cons, "after")  # producing and consuming went on through the moves
    assert cluster.store is not None
    history = await cluster.store.list("/cluster/rebalancing_history/")
    assert len(history) >= 4
    await cons.close()
