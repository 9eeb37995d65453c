"""Enforced limits with real broker processes (issue 43 item 4, docs/limits.md): limits set from the CLI,
applied at run time; the publish rate through the official danube client (the Danube wire) and the Ister
batch API; max_topics_per_namespace at, just over and raised. No upper time bounds (the machine is loaded):
throttling shows as a lower bound on elapsed time and in the metrics."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ister.client import Client
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess, broker_metric, client, consumer, producer, take

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def cli(broker: BrokerProcess, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = run_ister([*args, "--admin-addr", broker.admin_addr], timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("limits") / "data")
    b.start()
    yield b
    b.stop()


def _metric(broker: BrokerProcess, name: str, **labels: str) -> float:
    value = broker_metric(broker.metrics_url, name, **labels)
    assert value is not None, f"{name} not exported"
    return value


async def test_danube_client_publish_rate_is_back_pressure_and_a_raise_applies(broker: BrokerProcess) -> None:
    cli(broker, "admin", "namespaces", "create", "rated")
    out = cli(broker, "admin", "namespaces", "set-limits", "rated", "--publish-rate", "10").stdout
    assert "max_publish_rate" in out and "10" in out
    c = await client(broker.url)
    p = await producer(c, "/rated/danube", "p", reliable=True)
    throttled = _metric(broker, "ister_publish_throttled_total")
    started = time.monotonic()
    for i in range(30):  # 3 s worth at 10/s: the first 10 go at once, the other 20 take >= 2 s
        await p.send(b"m%d" % i)
    assert time.monotonic() - started >= 1.8
    after = _metric(broker, "ister_publish_throttled_total")
    assert after >= throttled + 15  # most sends after the burst waited their turn; none was refused
    assert _metric(broker, "ister_limit_refusals_total", limit="max_publish_rate") == 0
    cli(broker, "admin", "namespaces", "set-limits", "rated", "--publish-rate", "0")  # lifted at run time
    for i in range(30, 40):  # the broker's mirror follows its watch: a late one only waits, never fails
        await p.send(b"m%d" % i)


async def test_ister_batch_publish_rate_holds_the_stream(broker: BrokerProcess) -> None:
    cli(broker, "admin", "namespaces", "create", "batched")
    cli(broker, "admin", "namespaces", "set-limits", "batched", "--publish-rate", "100")
    async with Client(broker.url) as c:
        p = await c.producer("/batched/t", max_batch_messages=50)
        started = time.monotonic()
        offsets: list[int] = []
        for i in range(6):  # 300 messages at 100/s: >= 2 s after the first second's burst
            offsets += await p.send_batch([b"b%d-%d" % (i, j) for j in range(50)])
        assert time.monotonic() - started >= 1.8
        assert offsets == list(range(300))  # each stored once, in order: held back, nothing dropped
        await p.close()


async def test_dispatch_rate_paces_a_danube_consumer_and_drops_nothing(broker: BrokerProcess) -> None:
    cli(broker, "admin", "namespaces", "create", "paced")
    cli(broker, "admin", "namespaces", "set-limits", "paced", "--dispatch-rate", "5")
    c = await client(broker.url)
    p = await producer(c, "/paced/t", "p", reliable=True)
    cons, queue = await consumer(c, "/paced/t", "c", "s")
    paused = _metric(broker, "ister_dispatch_throttled_seconds_total")
    started = time.monotonic()
    for i in range(15):
        await p.send(b"d%d" % i)
    got = await take(queue, 15, within=60, ack=cons)  # 3 s worth at 5/s: >= 2 s after the first second's
    assert time.monotonic() - started >= 1.8
    assert [m.payload for m in got] == [b"d%d" % i for i in range(15)]  # all of them, in order
    assert _metric(broker, "ister_dispatch_throttled_seconds_total") > paused


async def test_producer_count_at_over_and_raised(broker: BrokerProcess) -> None:
    cli(broker, "admin", "namespaces", "create", "few")
    cli(broker, "admin", "namespaces", "set-limits", "few", "--max-producers-per-topic", "1")
    c = await client(broker.url)
    await producer(c, "/few/t", "p1", reliable=True)  # at the limit
    with pytest.raises(Exception, match="max_producers_per_topic=1"):
        await producer(c, "/few/t", "p2", reliable=True)
    cli(broker, "admin", "namespaces", "set-limits", "few", "--max-producers-per-topic", "2")
    await producer(c, "/few/t", "p2", reliable=True)  # read at each creation: allowed at once


async def test_max_topics_per_namespace_at_over_and_raised(broker: BrokerProcess) -> None:
    cli(broker, "admin", "namespaces", "create", "counted")
    cli(broker, "admin", "namespaces", "set-limits", "counted", "--max-topics", "2")
    cli(broker, "admin", "topics", "create", "/counted/a")
    c = await client(broker.url)
    await producer(c, "/counted/b", "p", reliable=True)  # at the limit: allowed
    before = _metric(broker, "ister_limit_refusals_total", limit="max_topics_per_namespace")
    refused = cli(broker, "admin", "topics", "create", "/counted/c", ok=False)
    assert refused.returncode != 0
    assert "namespace counted allows max_topics_per_namespace=2 topics" in refused.stderr + refused.stdout
    with pytest.raises(Exception, match="max_topics_per_namespace=2"):
        await producer(c, "/counted/d", "p", reliable=True)
    assert _metric(broker, "ister_limit_refusals_total", limit="max_topics_per_namespace") == before + 2
    assert "/counted/c" not in cli(broker, "admin", "namespaces", "topics", "counted").stdout
    cli(broker, "admin", "namespaces", "set-limits", "counted", "--max-topics", "3")
    cli(broker, "admin", "topics", "create", "/counted/c")
    out = cli(broker, "admin", "namespaces", "limits", "counted", "-o", "json").stdout
    assert '"max_topics_per_namespace": 3' in out


async def test_cluster_counts_topics_in_etcd_whichever_broker_creates(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """Two brokers, each creating one topic: the third is refused by both, as both count etcd's listing."""
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2)
    await cluster.start()
    try:
        await cluster.until(cluster.leader, "a leader")
        one, two = cluster.brokers
        cli(one, "admin", "namespaces", "create", "shared")
        cli(two, "admin", "namespaces", "set-limits", "shared", "--max-topics", "2")
        cli(one, "admin", "topics", "create", "/shared/a")
        cli(two, "admin", "topics", "create", "/shared/b")
        for b in (one, two):
            refused = cli(b, "admin", "topics", "create", "/shared/c", ok=False)
            assert "namespace shared allows max_topics_per_namespace=2 topics and holds 2" in refused.stderr
        cli(one, "admin", "namespaces", "set-limits", "shared", "--max-topics", "0")  # lifted
        cli(two, "admin", "topics", "create", "/shared/c")
    finally:
        await cluster.stop()
