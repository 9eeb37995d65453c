"""Compressed records in a cluster (docs/compression.md): three brokers on etcd, RF 3, a durable tier on
SeaweedFS with Parquet copies. Followers get the leader's compressed frames as they are; exported objects
hold them compressed, their Parquet copies hold plain payloads; after the leader dies the new leader (a
former follower) serves the same records. The same for records compressed with a zstd dictionary."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from ister.benchmark.compression_cases import dictionary_topic
from ister.client import Client
from ister.core.compression import ENVELOPE, MARK, Codec, uses_dictionary
from ister.storage.objects.catalog import list_descriptors
from ister.storage.objects.parquet import read_table
from ister.storage.objects.segment import list_topic_files, read_segment
from ister.storage.objects.store import open_store
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.compression_support import log_lines, read_payloads, stored_codecs
from tests.integration.replication_support import RF_ENV, replica_record
from tests.seaweed_server import SeaweedServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TOPIC = "/default/packed"


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer) -> AsyncIterator[Cluster]:
    url = f"{seaweed.url}/{uuid.uuid4().hex[:8]}"
    durable = {
        "url": url,
        "options": seaweed.options(),
        "parquet": True,
        "export_interval_seconds": 0.3,
        "segment_max_age_seconds": 0.5,
    }
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump({"wal": {"segment_max_bytes": 64 * 1024}, "storage": {"durable": durable}})
    )
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(config), env=RF_ENV)
    c.durable_url = url  # type: ignore[attr-defined]
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def test_compressed_records_replicate_export_and_survive_the_leaders_death(
    cluster: Cluster, seaweed: SeaweedServer
) -> None:
    lines = log_lines(600)
    entry = cluster.brokers[0].url
    async with Client(entry) as c:
        p = await c.producer(TOPIC, "p", compression="zstd", max_batch_messages=50)
        assert await p.send_batch(lines) == list(range(600))
        await p.close()
    record = await cluster.until(lambda: replica_record(cluster, TOPIC), "a replica record")
    assert len(record.replicas) == 3

    # Exported objects hold the records compressed; their Parquet copies hold plain payloads.
    async def exported() -> bool:
        assert cluster.store is not None
        found = await list_descriptors(cluster.store, TOPIC)
        return any(d.start_offset == 0 for d in found)

    await cluster.until(exported, "the first object exported", 60)
    store = open_store(cluster.durable_url, seaweed.options())  # type: ignore[attr-defined]

    async def with_copy() -> tuple[list[tuple[int, int, str]], dict[tuple[int, int], str]] | None:
        objects, copies = await list_topic_files(store, TOPIC.strip("/"))
        return (objects, copies) if objects and (objects[0][0], objects[0][1]) in copies else None

    objects, copies = await cluster.until(with_copy, "an object and its Parquet copy", 60)
    first, last, key = objects[0]
    records = [r async for batch in read_segment(store, key) for r in batch]
    assert [o for o, _ in records] == list(range(first, last + 1))
    assert all(r[0] == MARK and ENVELOPE.unpack_from(r)[1] == Codec.ZSTD for _, r in records)
    table = read_table(await store.get(copies[(first, last)]), first, last)
    assert table.column("value").to_pylist() == lines[first : last + 1]

    # The leader dies: a former follower serves every record, stored as the leader stored it.
    cluster.process_of(record.leader).kill9()

    async def new_leader() -> int | None:
        rec = await replica_record(cluster, TOPIC)
        return rec.leader if rec is not None and rec.leader != record.leader else None

    leader = await cluster.until(new_leader, "a follower leads", 60)
    url = cluster.process_of(leader).url

    async def all_read() -> list[bytes] | None:
        got = await read_payloads(url, TOPIC)
        return got if len(got) == len(lines) else None  # the new leader may still be loading the topic

    assert await cluster.until(all_read, "every record read from the new leader", 60) == lines
    assert set(await stored_codecs(url, TOPIC, 0, 600)) == {Codec.ZSTD}


async def test_records_with_a_dictionary_are_read_by_every_broker_and_in_parquet(
    cluster: Cluster, seaweed: SeaweedServer
) -> None:
    """A dictionary trained by the leader reaches the other brokers through etcd: after the leader's death
    the new leader reads every record; the exported Parquet copies hold plain payloads."""
    topic = "/default/zdict"
    warmup, lines = log_lines(600, seed=99), log_lines(600)
    entry = cluster.brokers[0]
    await dictionary_topic(entry.url, entry.admin_addr, topic, warmup)  # trained, stored, named
    async with Client(entry.url) as c:
        p = await c.producer(topic, "p", max_batch_messages=50)  # plain: the policy compresses
        assert await p.send_batch(lines) == list(range(600, 1200))
        await p.close()
    record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
    store = open_store(cluster.durable_url, seaweed.options())  # type: ignore[attr-defined]

    async def late_copy() -> tuple[int, int, str, str] | None:
        objects, copies = await list_topic_files(store, topic.strip("/"))
        for first, last, key in objects:
            if first >= 600 and (first, last) in copies:
                return first, last, key, copies[(first, last)]
        return None

    first, last, key, copy = await cluster.until(
        late_copy, "an object of dictionary records and its copy", 90
    )
    records = [r async for batch in read_segment(store, key) for r in batch]
    assert all(uses_dictionary(r) for _, r in records)
    table = read_table(await store.get(copy), first, last)
    assert table.column("value").to_pylist() == lines[first - 600 : last - 600 + 1]

    cluster.process_of(record.leader).kill9()

    async def new_leader() -> int | None:
        rec = await replica_record(cluster, topic)
        return rec.leader if rec is not None and rec.leader != record.leader else None

    url = cluster.process_of(await cluster.until(new_leader, "a follower leads", 60)).url

    async def all_read() -> list[bytes] | None:
        got = await read_payloads(url, topic)
        return got if len(got) == 1200 else None

    assert await cluster.until(all_read, "every record read from the new leader", 60) == [*warmup, *lines]
