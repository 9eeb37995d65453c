"""The durable tier against a real S3 server (SeaweedFS `weed mini`): round trip, multipart, export and
tiered reads, and an object-store outage during export."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest

from ister.errors import NotFound
from ister.limits import MiB
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects.catalog import list_descriptors, read_cur
from ister.storage.objects.exporter import SegmentExporter
from ister.storage.objects.segment import build_segment, object_key, read_segment
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable, open_store
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalConfig
from tests.seaweed_server import SeaweedServer

pytestmark = pytest.mark.integration

TOPIC = "/default/orders"
_prefixes = itertools.count()


def s3_store(seaweed: SeaweedServer, **options: str) -> ObjectStore:
    """A store rooted at a prefix of the bucket that no other test uses."""
    url = f"{seaweed.url}/run-{os.getpid()}-{next(_prefixes)}"
    return open_store(url, seaweed.options(**options), part_size=5 * MiB, multipart_threshold=5 * MiB)


def payload(i: int) -> bytes:
    return f"s3-message-{i:07d}".encode()


async def append_n(wal: Wal, count: int) -> None:
    for _ in range(count):
        await wal.append([payload(wal.next_offset)])


async def test_round_trip(seaweed: SeaweedServer) -> None:
    store = s3_store(seaweed)
    data = os.urandom(100_000)
    info = await store.put("a/b/object", data)
    assert info.etag
    assert await store.get("a/b/object") == data
    assert await store.get_range("a/b/object", 1000, 2000) == data[1000:2000]
    assert await store.get_tail("a/b/object", 52) == (data[-52:], len(data))
    head = await store.head("a/b/object")
    assert (head.size, head.etag) == (len(data), info.etag)
    assert [o.key for o in await store.list("a")] == ["a/b/object"]
    await store.delete("a/b/object")
    await store.delete("a/b/object")
    with pytest.raises(NotFound):
        await store.get("a/b/object")
    recs = [(i, payload(i)) for i in range(500)]
    key = object_key("seg", 0, 499)
    await store.put(key, build_segment(recs, index_every_frames=50))
    got = [r async for batch in read_segment(store, key, 123, 321) for r in batch]
    assert got == recs[123:322]


async def test_multipart_object(seaweed: SeaweedServer) -> None:
    store = s3_store(seaweed)
    big = os.urandom(11 * MiB + 7)  # above the 5 MiB threshold: three 5 MiB-or-less parts
    info = await store.put("big", big)
    assert info.etag is not None and info.etag.strip('"').endswith("-3")
    assert (await store.head("big")).size == len(big)
    assert await store.get("big") == big
    assert await store.get_range("big", 10 * MiB, 10 * MiB + 100) == big[10 * MiB : 10 * MiB + 100]


async def test_export_and_tiered_read(seaweed: SeaweedServer, tmp_path: Path) -> None:
    objects = s3_store(seaweed)
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=4096)
    old = await Wal.open(tmp_path / "old", config)
    await append_n(old, 1000)
    await old.append([bytes([7]) * (6 * MiB)])  # one file above the threshold: a streamed multipart put
    await append_n(old, 50)
    await old.close()
    await SegmentExporter(TOPIC, old, objects, meta).export_tail()
    descs = await list_descriptors(meta, TOPIC)
    assert descs[0].start_offset == 0 and descs[-1].end_offset == 1050
    assert await read_cur(meta, TOPIC) == descs[-1].start_offset
    assert any(d.size > 6 * MiB for d in descs)
    for d in descs:
        assert (await objects.head(d.key)).size == d.size

    wal = await Wal.open(tmp_path / "new", config, start_offset=1051)
    try:
        await append_n(wal, 20)
        reader = TieredReader(TOPIC, wal, objects, meta, 0)
        got: list[tuple[int, bytes]] = []
        while reader.next_offset < 1071:
            got.extend(await reader.read(max_records=300, max_bytes=16 * MiB, timeout=5))
        assert [o for o, _ in got] == list(range(1071))
        assert got[1000][1] == bytes([7]) * (6 * MiB)
        assert all(p == payload(o) for o, p in got if o != 1000)
    finally:
        await wal.close()


async def test_store_down_then_back(seaweed: SeaweedServer, tmp_path: Path) -> None:
    """Stop weed: an export pass fails with a retriable error and records nothing. Restart it on the same
    ports and data: the next pass exports everything. (Last in the module: it restarts the server.)"""
    objects = s3_store(seaweed, max_retries="1", timeout="2s", connect_timeout="1s", retry_timeout="3")
    meta = EmbeddedStore.in_memory()
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=1024))
    exporter = SegmentExporter(TOPIC, wal, objects, meta)
    try:
        await append_n(wal, 100)
        await exporter.export_closed()
        before = await list_descriptors(meta, TOPIC)
        assert before
        await append_n(wal, 100)
        await asyncio.to_thread(seaweed.stop)
        try:
            with pytest.raises(ObjectStoreUnavailable) as info:
                await exporter.export_closed()
            assert info.value.retriable and exporter.failures == 1
            assert await list_descriptors(meta, TOPIC) == before
            await append_n(wal, 10)  # producing goes on while the store is down
        finally:
            await asyncio.to_thread(seaweed.start)
        recorded = await exporter.export_closed()
        assert recorded and exporter.failures == 0
        descs = await list_descriptors(meta, TOPIC)
        assert [d.start_offset for d in descs] == [first for first, _, _ in wal.segments()[:-1]]
        got = [r for d in descs async for batch in read_segment(objects, d.key) for r in batch]
        assert [o for o, _ in got] == list(range(wal.segments()[-1][0]))
    finally:
        await wal.close()
