"""Seed 000 end to end on real parts: 3 brokers on etcd, the durable tier on SeaweedFS (S3), danube-client.

The brokers rotate and export their WAL quickly (test-sized settings) and keep nothing locally once a
segment is in the object store, so every read below the WAL's head really comes from S3.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from ister.client import Client
from ister.metadata import keys
from ister.storage.objects import list_descriptors
from tests.etcd_server import EtcdServer
from tests.integration.cluster import WAIT, Cluster
from tests.integration.harness import client, consumer, producer
from tests.seaweed_server import SeaweedServer

pytestmark = pytest.mark.timeout(300)


def write_config(path: Path, s3: SeaweedServer) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 64 * 1024},
                "storage": {
                    "durable": {
                        "url": f"{s3.url}/{uuid.uuid4().hex[:8]}",
                        "options": s3.options(),
                        "export_interval_seconds": 0.3,
                        "segment_max_age_seconds": 0.5,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    }
                },
            }
        )
    )
    return path


@pytest.fixture
async def durable(tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer) -> AsyncIterator[Cluster]:
    config = write_config(tmp_path / "ister.yml", seaweed)
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(config))
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def exported_through(cluster: Cluster, topic: str, last: int) -> bool:
    assert cluster.store is not None
    found = await list_descriptors(cluster.store, topic)
    covered = -1
    for d in found:
        if d.start_offset > covered + 1:
            return False
        covered = max(covered, d.end_offset)
    return covered >= last


async def subscribe_from_start(cluster: Cluster, topic: str, sub: str) -> None:
    """A subscription record with start_offset 0 (an Ister addition): its first consumer reads from 0."""
    assert cluster.store is not None
    await cluster.store.put(
        keys.subscription(topic, sub),
        {
            "subscription_name": sub,
            "subscription_type": 0,
            "consumer_id": None,
            "consumer_name": "history",
            "key_filters": [],
            "start_offset": 0,
        },
    )


async def test_history_moves_and_reads_back_from_objects(durable: Cluster) -> None:
    topic = "/default/durable_history"
    entry = durable.brokers[0]
    # 10k messages through the batch API, then wait until the durable tier holds them.
    async with Client(entry.url) as ister:
        pub = await ister.producer(topic)
        offsets = await pub.send_batch([f"h{i}".encode() for i in range(10_000)])
        await pub.flush()
    assert offsets[0] == 0 and offsets[-1] == 9_999
    await durable.until(lambda: exported_through(durable, topic, 9_999), "10k messages exported", 60)

    # Move it twice while a danube-client producer and consumer run.
    c = await client(entry.url)
    p = await producer(c, topic, "live", reliable=True)
    cons, queue = await consumer(c, topic, "c", "live-sub")
    acked: list[bytes] = []
    seen: dict[bytes, int] = {}

    async def produce(n: int) -> None:
        for _ in range(n):
            payload = f"live{len(acked)}".encode()
            await p.send(payload, {})
            acked.append(payload)

    async def drain() -> None:
        while not set(acked) <= set(seen):
            msg = await asyncio.wait_for(queue.get(), WAIT)
            seen.setdefault(msg.payload, msg.msg_id.topic_offset)
            await cons.ack(msg)

    await produce(20)
    await drain()
    owners = [(await durable.assignments())[topic]]
    for move in range(2):
        await durable.unload(topic)

        async def moved() -> int | None:
            now = (await durable.assignments()).get(topic)
            return now if now is not None and now != owners[-1] else None

        owners.append(await durable.until(moved, f"move {move + 1}"))
        await produce(20)
        await drain()
    assert sorted(seen.values()) == list(range(10_000, 10_000 + len(seen)))  # offsets continue, no gap

    # A new subscription from offset 0 on the third owner: objects (written by the first owner), then WAL.
    await subscribe_from_start(durable, topic, "history")
    hist, hq = await consumer(c, topic, "history", "history")
    total = 10_000 + len(acked)
    got: dict[int, bytes] = {}
    started = time.monotonic()
    while len(got) < total:
        msg = await asyncio.wait_for(hq.get(), WAIT)
        got.setdefault(msg.msg_id.topic_offset, msg.payload)
        await hist.ack(msg)
    assert sorted(got) == list(range(total))
    assert [got[i] for i in range(10_000)] == [f"h{i}".encode() for i in range(10_000)]
    assert [got[10_000 + i] for i in range(len(acked))] == [seen_payload for seen_payload in acked]
    assert time.monotonic() - started < 120
    await hist.close()
    await cons.close()


async def test_object_store_outage_delays_export_but_not_produce(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    s3 = SeaweedServer(tmp_path / "s3")
    s3.start()
    config = write_config(tmp_path / "ister.yml", s3)
    cluster = Cluster(tmp_path, etcd_server.endpoint, 1, 2, "--config-file", str(config))
    try:
        await cluster.start()
        topic = "/default/outage"
        async with Client(cluster.brokers[0].url) as ister:
            pub = await ister.producer(topic)
            await pub.send_batch([b"before"] * 1000)
            await cluster.until(lambda: exported_through(cluster, topic, 999), "exported before the outage")
            s3.stop()
            down_at = time.monotonic()
            sent = 1000
            # Produce through an 8 s outage, no error: the exporter's attempts fail and back off meanwhile
            # (0.3 s interval, doubling), and the WAL keeps every unexported segment.
            while time.monotonic() - down_at < 8:
                offsets = await pub.send_batch([b"during"] * 500)
                assert offsets[-1] == sent + 499
                sent += 500
                await asyncio.sleep(0.1)
            assert not await exported_through(cluster, topic, sent - 1)
            s3.restart()
            await cluster.until(lambda: exported_through(cluster, topic, sent - 1), "export caught up", 120)
    finally:
        await cluster.stop()
        s3.stop()
