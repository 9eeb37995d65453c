"""`ister admin` against a real standalone broker process, with the official danube-client as the traffic."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import danube
import grpc
import pytest

from tests.integration.forkserver import run_ister
from tests.integration.harness import (
    BrokerProcess,
    attached,
    client,
    consumer,
    nothing_within,
    producer,
    take,
)
from tests.support import until

pytestmark = pytest.mark.integration
S = danube.SubType


def admin_addr(broker: BrokerProcess) -> str:
    return str(broker.admin_addr)


def require_admin(broker: BrokerProcess) -> None:
    """Skip when this broker build does not serve the admin API yet (app.py not wired)."""
    with grpc.insecure_channel(admin_addr(broker)) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=5)
        except grpc.FutureTimeoutError:
            pytest.skip(f"the broker does not serve the admin API on {admin_addr(broker)} (app.py not wired)")


@pytest.fixture(scope="module")
def admin_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("admin") / "data")
    broker.start()
    require_admin(broker)
    yield broker
    broker.stop()


def run_admin(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ister(["admin", *args, "--admin-addr", admin_addr(broker)], timeout=60)


async def admin(broker: BrokerProcess, *args: str, code: int = 0) -> str:
    done = await asyncio.to_thread(run_admin, broker, *args)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout if code == 0 else done.stderr


async def test_created_topic_serves_danube_clients(admin_broker: BrokerProcess, topic: str) -> None:
    await admin(admin_broker, "topics", "create", topic, "--reliable")
    c = await client(admin_broker.url)
    cons, q = await consumer(c, topic, "c1", "audit", S.EXCLUSIVE)
    p = await producer(c, topic, "p1", reliable=True)
    for i in range(5):
        await p.send(f"m{i}".encode())
    got = await take(q, 5, ack=cons)
    assert [m.msg_id.topic_offset for m in got] == list(range(5))
    described = json.loads(await admin(admin_broker, "topics", "describe", topic, "-o", "json"))
    assert described == {
        "name": topic,
        "broker_id": "0",
        "delivery": "Reliable",
        "subscriptions": ["audit"],
        "attached_consumers": [{"subscription": "audit", "consumer": "c1"}],
        "compression": "none",  # no policy: records stored as sent
        "compression_source": "default",
        # no table policy: the table it would have (docs/tables.md)
        # (with where the format comes from and the interval, as the table output shows them)
        "table": {
            "format": "none",
            "format_from": "default",
            "partition": "day",
            "interval_ms": 10_000,
            "tables": [f"default.{topic.rsplit('/', 1)[1]}"],
        },
    }
    # The consumer is connected: the subscription stays.
    err = await admin(admin_broker, "topics", "unsubscribe", topic, "-s", "audit", code=1)
    assert "active consumers" in err and "FAILED_PRECONDITION" in err
    await cons.close()

    async def stream_closed() -> bool:
        return not await attached(admin_broker.admin_addr, topic)

    await until(stream_closed, "the consumer's stream closed")
    await admin(admin_broker, "topics", "unsubscribe", topic, "-s", "audit")
    assert json.loads(await admin(admin_broker, "topics", "subscriptions", topic, "-o", "json")) == []


async def test_delete_then_recreate_starts_empty(admin_broker: BrokerProcess, topic: str) -> None:
    c = await client(admin_broker.url)
    p = await producer(c, topic, "p-old", reliable=True)
    for i in range(3):
        await p.send(f"old{i}".encode())
    await p.close()
    await admin(admin_broker, "topics", "delete", topic)
    err = await admin(admin_broker, "topics", "describe", topic, code=1)
    assert "NOT_FOUND" in err
    await admin(admin_broker, "topics", "create", topic, "--reliable")
    cons, q = await consumer(c, topic, "c", "fresh", S.EXCLUSIVE)
    p2 = await producer(c, topic, "p-new", reliable=True)
    await p2.send(b"new")
    got = await take(q, 1, ack=cons)
    assert got[0].payload == b"new" and got[0].msg_id.topic_offset == 0
    assert await nothing_within(q, 0.5)
    await cons.close()


async def test_partitioned_topic_created_by_admin(admin_broker: BrokerProcess, topic: str) -> None:
    await admin(admin_broker, "topics", "create", topic, "--partitions", "3", "--non-reliable")
    ns = topic.split("/")[1]
    listed = json.loads(await admin(admin_broker, "topics", "list", "--namespace", ns, "-o", "json"))
    assert [t["name"] for t in listed if t["name"].startswith(topic + "-part-")] == [
        f"{topic}-part-{i}" for i in range(3)
    ]
    c = await client(admin_broker.url)
    cons, q = await consumer(c, topic, "c", "psub", S.SHARED)
    p = await producer(c, topic, "pp", partitions=3)  # non-reliable: consumer() waited for every stream
    for i in range(9):
        await p.send(f"m{i}".encode())
    got = await take(q, 9, ack=cons)
    assert {m.msg_id.topic_name for m in got} == {f"{topic}-part-{i}" for i in range(3)}
    await cons.close()
    await admin(admin_broker, "topics", "delete", topic)
    listed = json.loads(await admin(admin_broker, "topics", "list", "--namespace", ns, "-o", "json"))
    assert not [t for t in listed if t["name"].startswith(topic + "-part-")]


async def test_unload_reloads_where_it_left_off(admin_broker: BrokerProcess, topic: str) -> None:
    c = await client(admin_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    for i in range(3):
        await p.send(f"a{i}".encode())
    await p.close()
    await admin(admin_broker, "topics", "unload", topic)
    p2 = await producer(c, topic, "p2", reliable=True)
    cons, q = await consumer(c, topic, "c", "after", S.EXCLUSIVE)
    await p2.send(b"b")
    got = await take(q, 1, ack=cons)
    assert got[0].payload == b"b" and got[0].msg_id.topic_offset == 3
    await cons.close()


async def test_namespaces_brokers_and_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        require_admin(broker)
        await admin(broker, "namespaces", "create", "team")
        await admin(broker, "topics", "create", "/team/kept", "--reliable")
        brokers = json.loads(await admin(broker, "brokers", "list", "-o", "json"))
        assert [(b["broker_id"], b["broker_addr"]) for b in brokers] == [("0", broker.url)]
        assert (await admin(broker, "brokers", "leader")).strip() == "0"
        assert broker.terminate() == 0
        broker.start()
        require_admin(broker)
        assert json.loads(await admin(broker, "namespaces", "list", "-o", "json")) == ["default", "team"]
        kept = json.loads(await admin(broker, "topics", "list", "--namespace", "team", "-o", "json"))
        assert kept == [{"name": "/team/kept", "broker_id": "0", "delivery": "Reliable"}]
        err = await admin(broker, "namespaces", "delete", "team", code=1)
        assert "FAILED_PRECONDITION" in err
    finally:
        broker.stop()
