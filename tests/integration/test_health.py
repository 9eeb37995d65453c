"""`GET /healthz` and `GET /readyz` on the metrics port of real brokers: at start (standalone and a
3-broker cluster), through an outage of the cluster's etcd, and through a drain (`ister admin brokers
drain --wait`, whose progress bar shows on a terminal) and the activation after it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ister.client import Client
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = pytest.mark.integration

WAIT = 30.0


def probe(broker: BrokerProcess, path: str) -> tuple[int, dict[str, Any]]:
    url = broker.metrics_url.removesuffix("/metrics") + path
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def ready(broker: BrokerProcess) -> bool:
    return probe(broker, "/readyz")[0] == 200


def not_ready_because(broker: BrokerProcess, prefix: str) -> dict[str, Any] | None:
    status, body = probe(broker, "/readyz")
    if status == 503 and any(r.startswith(prefix) for r in body.get("reasons", [])):
        return body
    return None


def test_a_standalone_broker_is_live_and_ready_once_started(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        status, body = probe(broker, "/healthz")
        assert status == 200 and body["status"] == "ok" and body["event_loop_lag_seconds"] < 10
        assert probe(broker, "/readyz") == (
            200,
            {"status": "ready", "checks": {"metadata": {"ok": True, "detail": "the metadata store answers"}}},
        )
    finally:
        broker.stop()


@pytest.fixture
async def own_etcd_cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, EtcdServer]]:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    cluster = Cluster(tmp_path, etcd.endpoint, 3)
    try:
        await cluster.start()
        yield cluster, etcd
    finally:
        await cluster.stop()
        etcd.stop()


async def admin(
    broker: BrokerProcess, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        run_ister,
        ["admin", *args, "--admin-addr", broker.admin_addr],
        timeout=120,
        env={**os.environ, **(env or {})},
    )


async def test_cluster_readiness_through_start_an_etcd_outage_and_a_drain(
    own_etcd_cluster: tuple[Cluster, EtcdServer],
) -> None:
    cluster, etcd = own_etcd_cluster
    brokers = cluster.brokers
    for b in brokers:
        body = await until(lambda b=b: ready(b) and probe(b, "/readyz")[1], f"{b.url} ready", WAIT)
        assert set(body["checks"]) == {"metadata", "lease", "state", "topics"}
    topics = [f"/default/health_{i}" for i in range(6)]
    for topic in topics:
        assert (await admin(brokers[0], "topics", "create", topic)).returncode == 0

    async def all_assigned() -> dict[str, int] | None:
        found = await cluster.assignments()
        return found if set(topics) <= set(found) else None

    owners = await cluster.until(all_assigned, "every topic assigned")
    for b in brokers:  # what is assigned to each is loaded there
        await until(lambda b=b: ready(b), f"{b.url} ready with its topics", WAIT)

    # etcd goes away: every broker is still live, none is ready, and each says the metadata store is why.
    etcd.stop()
    for b in brokers:
        body = await until(lambda b=b: not_ready_because(b, "metadata:"), f"{b.url} not ready", WAIT)
        assert body["checks"]["metadata"]["ok"] is False
        assert probe(b, "/healthz")[0] == 200
    etcd.start()
    for b in brokers:
        await until(lambda b=b: ready(b), f"{b.url} ready again after etcd returned", WAIT)

    # A drain: the broker holding the most topics empties (a progress bar on a terminal), then is not
    # ready (drained) while the others are; activated, it is ready again.
    victim_id = max(set(owners.values()), key=lambda bid: sum(1 for o in owners.values() if o == bid))
    victim = cluster.process_of(victim_id)
    done = await admin(victim, "brokers", "drain", str(victim_id), "--wait", env={"TTY_COMPATIBLE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"broker {victim_id} drained:"), done.stdout
    assert f"draining broker {victim_id}" in done.stderr  # the progress bar
    assert not any(o == victim_id for o in (await cluster.assignments()).values())
    # (its own readiness checks run every second: "draining" until they see the state change)
    body = await until(
        lambda: not_ready_because(victim, "state: drained"), "the drained broker not ready", WAIT
    )
    assert body["checks"]["state"]["ok"] is False
    for b in brokers:
        if b is not victim:
            await until(lambda b=b: ready(b), f"{b.url} ready with the moved topics", WAIT)
    assert (await admin(victim, "brokers", "activate", str(victim_id))).returncode == 0
    await until(lambda: ready(victim), "the activated broker ready", WAIT)


async def test_drain_wait_in_json_and_when_a_move_cannot_complete(
    own_etcd_cluster: tuple[Cluster, EtcdServer],
) -> None:
    """`--wait -o json` ends with one JSON document (ids as strings). A topic that cannot move (a reliable
    topic with records and no durable tier to hand them over through) keeps --wait from completing: after
    --timeout it exits 1 naming the topic, and the topic stays where it is. A drain refused for lack of
    another active broker is one line."""
    cluster, _ = own_etcd_cluster
    first = cluster.brokers[0]
    ids = [str(cluster.broker_id(b)) for b in cluster.brokers]
    done = await admin(first, "brokers", "drain", ids[1], "--wait", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "broker_id": ids[1],
        "started": True,
        "total": 0,
        "pending": 0,
        "drained": True,
    }
    assert (await admin(first, "brokers", "activate", ids[1])).returncode == 0

    topic = "/default/health_stuck"
    async with Client(first.url) as c:
        producer = await c.producer(topic)  # reliable by default
        await producer.send_batch([b"kept"])
    owner = (await cluster.assignments())[topic]
    stuck = await admin(first, "brokers", "drain", str(owner), "--wait", "--timeout", "3")
    assert stuck.returncode == 1, (stuck.stdout, stuck.stderr)
    lines = stuck.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: broker {owner} still holds 1 topic(s) after 3 s")
    assert topic in lines[0]
    assert (await cluster.assignments())[topic] == owner  # nothing moved "best effort"
    assert (await admin(first, "brokers", "activate", str(owner))).returncode == 0

    for other in ids[1:]:  # draining (or drained): no longer active
        assert (await admin(first, "brokers", "drain", other)).returncode == 0
    refused = await admin(first, "brokers", "drain", ids[0], "--wait")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "FAILED_PRECONDITION" in refused.stderr
