"""Topic and subscription stats (issue 38 item 1, docs/admin.md "Stats") on a real standalone broker: each
field against what the test did (messages sent, acknowledged, bytes written, consumers attached), and the
two CLI commands' tables and JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from ister.client import Client
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def stats(broker: BrokerProcess | str, topic: str) -> pb.TopicStatsResponse:
    addr = broker if isinstance(broker, str) else broker.admin_addr
    async with grpc.aio.insecure_channel(addr) as channel:
        answer: pb.TopicStatsResponse = await pb_grpc.IsterAdminStub(channel).GetTopicStats(
            pb.TopicStatsRequest(topic=topic), timeout=30
        )
        return answer


async def listing(addr: str, namespace: str = "", lagging: bool = False) -> pb.ListSubscriptionStatsResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        answer: pb.ListSubscriptionStatsResponse = await pb_grpc.IsterAdminStub(
            channel
        ).ListSubscriptionStats(
            pb.ListSubscriptionStatsRequest(namespace=namespace, lagging=lagging), timeout=30
        )
        return answer


def sub_of(t: pb.TopicStats, name: str) -> pb.SubscriptionStatsEntry:
    found = [s for s in t.subscriptions if s.subscription == name]
    assert len(found) == 1, t
    return found[0]


def cli(addr: str, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_ister(["admin", *args, "--admin-addr", addr], timeout=60)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done


async def test_each_field_counts_what_was_done(shared_broker: BrokerProcess, topic: str) -> None:
    started = time.time()
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "p1")
        consumer = await client.consumer(topic, "work", type="shared", name="c1", window=10)
        await producer.send_batch([b"x" * 100 for _ in range(20)])
        sent = time.time()
        got = []
        async for m in consumer:
            got.append(m)
            if len(got) == 5:
                break
        for m in got[:3]:
            await m.ack()

        async def settled() -> pb.TopicStatsResponse | None:
            s = await stats(shared_broker, topic)
            w = sub_of(s.total, "work")
            return s if w.HasField("cursor") and w.cursor == 2 and w.unacked_in_flight == 10 else None

        asked = time.time()
        r = await until(settled, "the cursor at 2 and 10 messages in flight")
        answered = time.time()
        t = r.total
        assert not r.partitions
        assert (t.topic, t.delivery, t.owner_broker_id) == (topic, "Reliable", "0")
        assert (t.start_offset, t.end_offset, t.message_count) == (0, 20, 20)
        assert (t.messages_in_total, t.bytes_in_total) == (20, 2000)
        assert t.messages_out_total >= 10
        s = t.storage
        assert s.wal_segments >= 1 and s.wal_bytes > 2000
        assert s.total_bytes == s.wal_bytes + s.object_bytes + s.parquet_bytes
        assert not t.HasField("replication")  # one copy
        [p] = t.producers
        assert (p.name, p.messages_total, p.bytes_total) == ("p1", 20, 2000)
        assert p.producer_id.isdigit() and p.address.startswith("ipv4:127.0.0.1:")
        assert started * 1000 - 1000 <= p.connected_since_ms <= sent * 1000 + 1000
        w = sub_of(t, "work")
        assert (w.type, w.cursor, w.next_offset, w.backlog_messages) == ("Shared", 2, 3, 17)
        assert w.live and w.owner_broker_id == "0" and w.delivery == "Reliable"
        # one WAL segment holds offsets 0..19: 17 of them are its bytes * 17 / 20
        assert s.wal_segments == 1
        assert w.backlog_bytes == round(s.wal_bytes * 17 / 20)
        # the oldest unacknowledged message (offset 3) was published between `started` and `sent`
        assert (asked - sent) * 1000 - 100 <= w.lag_ms <= (answered - started) * 1000 + 100
        assert (w.unacked_in_flight, w.redeliveries_total, w.dead_lettered_total) == (10, 0, 0)
        [c] = w.consumers
        assert (c.name, c.connected, c.unacked) == ("c1", True, 10)
        assert c.consumer_id.isdigit() and c.address.startswith("ipv4:127.0.0.1:")
        assert started * 1000 - 1000 <= c.connected_since_ms <= answered * 1000 + 1000
        await consumer.close()


async def test_rates_follow_traffic_and_fall_to_zero(shared_broker: BrokerProcess, topic: str) -> None:
    stop = asyncio.Event()
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "pump")
        consumer = await client.consumer(topic, "reader", type="exclusive", name="r1")

        async def pump() -> None:
            while not stop.is_set():
                await producer.send_batch([b"y" * 50 for _ in range(20)])
                await asyncio.sleep(0.05)

        async def drain() -> None:
            async for m in consumer:
                await m.ack()

        tasks = [asyncio.create_task(pump()), asyncio.create_task(drain())]
        try:

            async def flowing() -> pb.TopicStats | None:
                t = (await stats(shared_broker, topic)).total
                moving = t.msg_rate_in > 0 and t.msg_rate_out > 0 and t.producers[0].msg_rate_in > 0
                return t if moving and sub_of(t, "reader").msg_rate_out > 0 else None

            t = await until(flowing, "rates in and out above 0", within=30)
            assert 1.0 <= t.rate_window_seconds <= 11.0
            assert t.msg_rate_in <= 20 / 0.05 * 1.5  # the pump's pace at most
            assert t.byte_rate_in / t.msg_rate_in == pytest.approx(50)  # payload bytes: 50 per message
            p = t.producers[0]
            assert p.byte_rate_in / p.msg_rate_in == pytest.approx(50)
            assert t.byte_rate_out / t.msg_rate_out >= 50  # records as stored: payload and headers
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

        async def quiet() -> bool:
            t = (await stats(shared_broker, topic)).total
            return t.msg_rate_in == 0 and t.msg_rate_out == 0 and t.producers[0].msg_rate_in == 0

        await until(quiet, "rates back to 0 once traffic stopped", within=30)


async def test_redeliveries_and_dead_letters(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "p")
        await asyncio.to_thread(
            cli,
            shared_broker.admin_addr,
            "topics",
            "set-failure-policy",
            topic,
            "-s",
            "dl",
            "--max-redelivery-count",
            "1",
            "--ack-timeout-ms",
            "30000",
            "--base-redelivery-delay-ms",
            "10",
            "--max-redelivery-delay-ms",
            "10",
            "--poison-policy",
            "dead_letter",
            "--dead-letter-topic",
            f"{topic}-DLQ",
        )
        consumer = await client.consumer(topic, "dl", type="shared", name="n1")
        await producer.send_batch([b"poison"])

        async def nack_all() -> None:
            async for m in consumer:
                await m.nack()

        task = asyncio.create_task(nack_all())
        try:

            async def dead() -> pb.SubscriptionStatsEntry | None:
                w = sub_of((await stats(shared_broker, topic)).total, "dl")
                return w if w.dead_lettered_total == 1 else None

            w = await until(dead, "the message dead-lettered")
            assert w.redeliveries_total == 1  # delivered twice: once, then once again after the nack
            assert w.backlog_messages == 0 and w.cursor == 0
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def test_partitioned_topic_sums_its_partitions(shared_broker: BrokerProcess, topic: str) -> None:
    await asyncio.to_thread(
        cli, shared_broker.admin_addr, "topics", "create", topic, "--partitions", "3", "--reliable"
    )
    async with Client(shared_broker.url) as client:
        consumer = await client.consumer(topic, "all", type="shared", name="pc")
        producer = await client.producer(topic, "pp")
        for i in range(30):
            await producer.send_each([(b"m%02d" % i, {}, f"k{i}")])

        async def counted() -> pb.TopicStatsResponse | None:
            r = await stats(shared_broker, topic)
            return r if r.total.messages_in_total == 30 else None

        r = await until(counted, "30 messages in over the partitions")
        assert [p.topic for p in r.partitions] == [f"{topic}-part-{i}" for i in range(3)]
        assert all(p.owner_broker_id == "0" for p in r.partitions)
        t = r.total
        assert t.topic == topic and t.owner_broker_id == "0" and t.delivery == "Reliable"
        assert t.message_count == sum(p.message_count for p in r.partitions) == 30
        assert t.end_offset == sum(p.end_offset for p in r.partitions)
        assert t.storage.wal_bytes == sum(p.storage.wal_bytes for p in r.partitions)
        assert sum(p.producers[0].messages_total for p in r.partitions if p.producers) == 30
        assert [(p.name, p.messages_total) for p in t.producers] == [("pp", 30)]
        total_backlog = sub_of(t, "all").backlog_messages
        assert total_backlog == sum(sub_of(p, "all").backlog_messages for p in r.partitions)
        assert sum(len(sub_of(p, "all").consumers) for p in r.partitions) == len(sub_of(t, "all").consumers)
        await consumer.close()


async def test_cli_tables_and_json(shared_broker: BrokerProcess, topic: str) -> None:
    addr = shared_broker.admin_addr
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "clip")
        consumer = await client.consumer(topic, "cli-sub", type="exclusive", name="clic")
        await producer.send_batch([b"z" * 10 for _ in range(7)])
        await until(
            lambda: stats(shared_broker, topic), "stats answer"
        )  # the topic is there; nothing is acknowledged: backlog 7
        table = (await asyncio.to_thread(cli, addr, "topics", "stats", topic)).stdout
        assert f"Topic:       {topic}" in table
        assert "Offsets:     start 0, end 7 (7 messages)" in table
        sub_row = next(line for line in table.splitlines() if line.startswith("cli-sub"))
        assert sub_row.split()[:4] == ["cli-sub", "Exclusive", "-", "7"]
        assert any(line.startswith("clip ") for line in table.splitlines())
        assert any(line.startswith("cli-sub") and "clic" in line for line in table.splitlines())

        doc = json.loads((await asyncio.to_thread(cli, addr, "topics", "stats", topic, "-o", "json")).stdout)
        assert doc["topic"] == topic and doc["owner_broker_id"] == "0" and doc["partitions"] == []
        assert (doc["end_offset"], doc["message_count"]) == (7, 7)
        [p] = doc["producers"]
        assert isinstance(p["producer_id"], str) and p["producer_id"].isdigit()
        [s] = doc["subscriptions"]
        assert (s["subscription"], s["cursor"], s["backlog_messages"]) == ("cli-sub", None, 7)
        assert isinstance(s["consumers"][0]["consumer_id"], str)
        assert doc["replication"] is None

        listed = (await asyncio.to_thread(cli, addr, "subscriptions", "list", "--lagging")).stdout
        row = next(line for line in listed.splitlines() if line.startswith(topic + " "))
        assert row.split()[1:4] == ["cli-sub", "Exclusive", "7"]
        everything = json.loads(
            (await asyncio.to_thread(cli, addr, "subscriptions", "list", "-o", "json")).stdout
        )
        mine = [e for e in everything["subscriptions"] if e["topic"] == topic]
        assert [(e["subscription"], e["backlog_messages"], e["owner_broker_id"]) for e in mine] == [
            ("cli-sub", 7, "0")
        ]
        lags = [e["lag_ms"] for e in everything["subscriptions"]]
        assert lags == sorted(lags, reverse=True)
        assert everything["failed_brokers"] == []
        # another namespace's listing leaves it out; an unknown one is NOT_FOUND in one line
        cli(addr, "namespaces", "create", "statsother")
        other = json.loads(
            (
                await asyncio.to_thread(
                    cli, addr, "subscriptions", "list", "--namespace", "statsother", "-o", "json"
                )
            ).stdout
        )
        assert other["subscriptions"] == []
        err = (
            await asyncio.to_thread(cli, addr, "subscriptions", "list", "--namespace", "nope", code=1)
        ).stderr
        assert err.startswith("error:") and "NOT_FOUND" in err
        err = (await asyncio.to_thread(cli, addr, "topics", "stats", "/default/no_such_topic", code=1)).stderr
        assert err.startswith("error:") and "NOT_FOUND" in err
        await consumer.close()


async def test_stored_subscription_after_a_restart(tmp_path: Path) -> None:
    """After a restart no consumer has reopened the subscription: its stored cursor gives the backlog."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    topic = "/default/restarted"
    try:
        async with Client(broker.url) as client:
            producer = await client.producer(topic, "p")
            consumer = await client.consumer(topic, "kept", type="exclusive", name="k")
            await producer.send_batch([b"r" * 40 for _ in range(10)])
            n = 0
            async for m in consumer:
                n += 1
                await m.ack()
                if n == 4:
                    break

            async def acked() -> bool:
                w = sub_of((await stats(broker, topic)).total, "kept")
                return w.HasField("cursor") and w.cursor == 3

            await until(acked, "4 messages acknowledged")
            await consumer.close()
        assert broker.terminate() == 0  # graceful (SIGTERM): the cursor is written
        broker.start()
        r = await listing(broker.admin_addr, "default")
        [w] = [e for e in r.subscriptions if e.topic == topic]
        assert (w.subscription, w.type, w.live) == ("kept", "Exclusive", False)
        assert (w.cursor, w.next_offset, w.backlog_messages) == (3, 4, 6)
        assert w.backlog_bytes > 0 and w.lag_ms > 0 and not w.consumers
    finally:
        broker.stop()
