"""What the replication tests share: the cluster settings, the replica record, and a producer whose every
acknowledged record is checked against what is read back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ister import errors
from ister.client import Client
from ister.core.record import decode_message
from ister.core.replication import ReplicaRecord
from ister.ids import TopicName
from ister.metadata import keys
from ister.storage.wal import Wal
from tests.integration.cluster import Cluster

BATCH_EVERY = 0.02  # `produce`: 2,500 records/s at most
RF_ENV = {
    "ISTER_CLUSTER__REPLICATION_FACTOR": "3",
    "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2",
    "ISTER_CLUSTER__REPLICA_MAX_LAG_SECONDS": "2",
}


async def replica_record(cluster: Cluster, topic: str) -> ReplicaRecord | None:
    assert cluster.store is not None
    kv = await cluster.store.get(keys.replicas(topic))
    return ReplicaRecord.parse(kv.value) if kv is not None else None


async def read_all(url: str | list[str], topic: str, end: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async with Client(url) as ister:
        async for batch in ister.read(topic, 0, end):
            for offset, record in batch:
                out[offset] = decode_message(record).payload
    return out


async def produce(
    urls: list[str],
    topic: str,
    acked: dict[int, bytes],
    stop: asyncio.Event,
    acked_at: list[float] | None = None,
    client: Client | None = None,
    prefix: str = "r",
) -> None:
    """Publish batches of 50 until `stop`, at most one per BATCH_EVERY seconds; `acked` gets offset ->
    payload of every acknowledged record (an offset acknowledged with two payloads fails it), `acked_at` the
    time (monotonic) of each acknowledged batch. `client`: a client of the caller's (its settings) instead
    of one on `urls`; `prefix` starts every payload (producers sharing `acked` use different ones)."""
    async with client if client is not None else Client(urls) as ister:
        pub = await ister.producer(topic)
        n = 0
        due = time.monotonic()
        while not stop.is_set():
            # A steady load: unpaced, the producer and three replicating brokers took every cycle the
            # machine had (~8k records/s here), and the tests check the history, not the throughput.
            due = max(due + BATCH_EVERY, time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            payloads = [f"{prefix}{n + i}".encode() for i in range(50)]
            n += 50
            try:
                offsets = await pub.send_batch(payloads)
            except errors.IsterError:
                continue  # not acknowledged: may or may not be stored, never counted
            for offset, payload in zip(offsets, payloads, strict=True):
                assert acked.setdefault(offset, payload) == payload, f"offset {offset} acknowledged twice"
            if acked_at is not None:
                acked_at.append(time.monotonic())


async def wal_contents(data_dir: Path, topic: str) -> dict[int, bytes]:
    """offset -> payload of every record in a stopped broker's copy of the topic."""
    name = TopicName.parse(topic)
    wal = await Wal.open(data_dir / "wal" / name.namespace / name.topic)
    try:
        out: dict[int, bytes] = {}
        reader = wal.reader(wal.first_offset)
        while reader.next_offset < wal.committed_offset:
            for offset, record in await reader.read(10_000):
                out[offset] = decode_message(bytes(record)).payload
        return out
    finally:
        await wal.close()
