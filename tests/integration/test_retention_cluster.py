"""Retention on a real cluster (issue 37): 3 brokers on etcd, every reliable topic on 3 replicas, the durable
tier on SeaweedFS (S3). A namespace's time limit, set while the topic is published to, moves its start
offset, and the bucket and every replica's WAL shrink to follow it; the start offset is one value in etcd,
the same from every broker, and it survives the leader's kill -9 (the new leader reads it, readers start
there)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml

from ister.client import Client
from ister.core.replication import ReplicaRecord
from ister.metadata import keys
from ister.metadata.records import parse_start
from ister.storage.objects import list_descriptors, open_store
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.seaweed_server import SeaweedServer

pytestmark = pytest.mark.timeout(300)

TOPIC = "/default/retained"


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer) -> AsyncIterator[Cluster]:
    prefix = uuid.uuid4().hex[:8]
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 16 * 1024},
                "storage": {
                    "retention": {"check_interval_seconds": 0.3},
                    "durable": {
                        "url": f"{seaweed.url}/{prefix}",
                        "options": seaweed.options(),
                        "export_interval_seconds": 0.2,
                        "segment_max_age_seconds": 0.3,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    },
                },
            }
        )
    )
    env = {"ISTER_CLUSTER__REPLICATION_FACTOR": "3", "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2"}
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(config), env=env)
    c.bucket = open_store(f"{seaweed.url}/{prefix}", seaweed.options())  # type: ignore[attr-defined]
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def start_in_etcd(cluster: Cluster) -> int:
    assert cluster.store is not None
    return parse_start(await cluster.store.get(keys.start_offset(TOPIC)))


async def start_via(admin_addr: str) -> int:
    async with grpc.aio.insecure_channel(admin_addr) as channel:
        stub = ipb_grpc.IsterAdminStub(channel)
        return int((await stub.GetRetention(ipb.GetRetentionRequest(topic=TOPIC), timeout=10)).start_offset)


def wal_firsts(data_dir: Path) -> list[int]:
    return sorted(
        int(p.name.split(".")[0]) for p in (data_dir / "wal" / "default" / "retained").glob("*.wal")
    )


async def test_retention_on_every_replica_and_the_bucket(cluster: Cluster) -> None:
    entry = cluster.brokers[0]
    stop = asyncio.Event()

    async def publish() -> int:
        sent = 0
        async with Client(entry.url) as ister:
            producer = await ister.producer(TOPIC, max_batch_messages=200)
            while not stop.is_set():
                await producer.send_batch([b"c" * 200] * 200)
                sent += 200
                await asyncio.sleep(0.02)
        return sent

    publisher = asyncio.create_task(publish())
    assert cluster.store is not None
    await cluster.until(lambda: _descriptors_at_least(cluster, 3), "three objects exported", 60)
    async with grpc.aio.insecure_channel(entry.admin_addr) as channel:
        await ipb_grpc.IsterAdminStub(channel).SetRetention(
            ipb.SetRetentionRequest(namespace="default", time_ms=2_000), timeout=10
        )
    first = await cluster.until(lambda: start_in_etcd(cluster), "the start offset moved", 60)
    # Publishing stops now: the start offset keeps moving as the rest expires, and every copy follows it
    # (while publishing goes on, each replica trims on its own clock and the start moves every pass, so
    # the moment when all of them are past it at once can be long in coming on a busy machine).
    stop.set()
    sent = await publisher

    async def everywhere_shrunk() -> int:
        start = await start_in_etcd(cluster)
        if start <= first:
            return 0
        listed = await cluster.bucket.list("default/retained")  # type: ignore[attr-defined]
        names = [o.key.rsplit("/", 1)[-1] for o in listed if o.key.endswith(".dnb1")]
        if any(int(n[: -len(".dnb1")].split("-")[2]) < start for n in names):
            return 0
        descriptors = await list_descriptors(cluster.store, TOPIC)  # type: ignore[arg-type]
        if any(d.end_offset < start for d in descriptors):
            return 0
        for b in cluster.brokers:  # the leader's WAL and both followers' copies
            firsts = wal_firsts(b.data_dir)
            if any(nxt <= start for _, nxt in itertools.pairwise(firsts)):
                return 0
        return start

    start = await cluster.until(everywhere_shrunk, "bucket, descriptors and every replica shrunk", 90)
    for b in cluster.brokers:  # one start offset, whichever broker answers
        assert await start_via(b.admin_addr) >= start

    # the leader dies: the next one serves from the same start offset, nothing at the head lost
    kv = await cluster.store.get(keys.replicas(TOPIC))
    record = ReplicaRecord.parse(kv.value) if kv is not None else None
    assert record is not None
    victim = cluster.process_of(record.leader)
    victim.kill9()
    survivor = next(b for b in cluster.brokers if b is not victim)

    async def served() -> bool:
        try:
            async with Client(survivor.url) as ister:
                span = await ister.offsets(TOPIC)
                return span.earliest >= start and span.next >= sent
        except Exception:
            return False

    await cluster.until(served, "the new leader serves from the start offset with every record", 90)
    assert await start_in_etcd(cluster) >= start


async def _descriptors_at_least(cluster: Cluster, n: int) -> bool:
    assert cluster.store is not None
    return len(await list_descriptors(cluster.store, TOPIC)) >= n
