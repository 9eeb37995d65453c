"""reset-cursor and peek in a 3-broker cluster (real etcd): any broker answers (the request is forwarded to
each topic's owner), partitioned topics spread over brokers move every partition, a consumer attached
through another broker is moved; and when etcd or the owner cannot be reached the answer says so and
nothing moves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ister.client import Client
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.cursor_support import admin_fails, admin_json

pytestmark = pytest.mark.integration

LONG_LEASE = 60  # a killed owner keeps its topics for the whole test: the forward to it must fail


async def owner_of(cluster: Cluster, topic: str) -> int:
    got = await cluster.until(lambda: _owned(cluster, topic), f"{topic} assigned")
    return int(got)


async def _owned(cluster: Cluster, topic: str) -> int | None:
    return (await cluster.assignments()).get(topic)


async def test_reset_and_peek_through_any_broker_and_failures(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    cluster = Cluster(tmp_path, etcd.endpoint, 3, LONG_LEASE)
    try:
        await cluster.start()
        topic, parted = "/default/cursor_cluster", "/default/cursor_parts"
        async with Client(cluster.brokers[0].url) as client:
            producer = await client.producer(topic, "p")
            await producer.send_batch([b"m%d" % i for i in range(20)])
            owner = await owner_of(cluster, topic)
            other = next(b for b in cluster.brokers if cluster.broker_id(b) != owner)
            consumer = await client.consumer(topic, "s", name="c1", initial_position="earliest")
            async with asyncio.timeout(30):
                for _ in range(20):
                    await (await consumer.receive()).ack()

            # Through a broker that does not own the topic: forwarded to the owner.
            got = await admin_json(other.admin_addr, "reset-cursor", topic, "-s", "s", "--to", "5")
            assert [(p["topic"], p["next"], p["head"], p["consumers"]) for p in got["positions"]] == [
                (topic, 5, 20, 1)
            ]
            async with asyncio.timeout(30):
                again = await consumer.receive()
                while again.offset != 5:
                    again = await consumer.receive()
                for _ in range(14):
                    await (await consumer.receive()).ack()
                await again.ack()
            peeked = await admin_json(other.admin_addr, "peek", topic, "--from", "3", "-n", "2")
            assert [(m["offset"], m["payload"]) for m in peeked] == [(3, "m3"), (4, "m4")]
            by_time = await admin_json(other.admin_addr, "reset-cursor", topic, "-s", "s", "--time", "-1h")
            assert by_time["positions"][0]["next"] == 0

            # A partitioned topic spread over the brokers: every partition, through any broker.
            await admin_json(other.admin_addr, "create", parted, "--partitions", "3")
            pp = await client.producer(parted, "pp", partitions=3)
            for i in range(9):
                await pp.send(b"x%d" % i, key=f"k{i}")
            await pp.close()
            for i in range(3):
                await owner_of(cluster, f"{parted}-part-{i}")
            await client.seek(parted, "ps", "latest")  # the subscription, on every partition's owner
            moved = await admin_json(
                cluster.brokers[2].admin_addr, "reset-cursor", parted, "-s", "ps", "--to", "0"
            )
            assert [p["topic"] for p in moved["positions"]] == [f"{parted}-part-{i}" for i in range(3)]
            assert all(p["next"] == 0 for p in moved["positions"])

            # etcd down: the answer names the cause, and nothing moves.
            etcd.stop()
            err = await admin_fails(other.admin_addr, "reset-cursor", topic, "-s", "s", "--to", "latest")
            assert "UNAVAILABLE" in err, err
            etcd.start()
            await cluster.until(cluster.all_registered, "brokers registered after the etcd restart")
            async with asyncio.timeout(30):
                still = await consumer.receive()  # the reset to -1h above still holds: offset 0 again
            assert still.offset == 0
            await consumer.close()
            await producer.close()

        # The owner is gone (killed; its lease outlives the test): the forward fails with UNAVAILABLE
        # naming it, and the partitioned reset moves no partition.
        cluster.process_of(owner).kill9()
        err = await admin_fails(other.admin_addr, "reset-cursor", topic, "-s", "s", "--to", "latest")
        assert "UNAVAILABLE" in err and str(owner) in err, err
        err = await admin_fails(other.admin_addr, "peek", topic)
        assert "UNAVAILABLE" in err, err
    finally:
        await cluster.stop()
        etcd.stop()
