"""Parquet copies of exported objects (ister.storage.objects.parquet, SegmentExporter(parquet=True))."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from ister.core.record import StoredMessage, encode_message  # noqa: E402
from ister.errors import CorruptionError  # noqa: E402
from ister.limits import MiB  # noqa: E402
from ister.metadata.embedded import EmbeddedStore  # noqa: E402
from ister.storage.objects import parquet  # noqa: E402
from ister.storage.objects.catalog import list_descriptors  # noqa: E402
from ister.storage.objects.exporter import SegmentExporter, parquet_copies  # noqa: E402
from ister.storage.objects.segment import read_segment  # noqa: E402
from ister.storage.objects.store import ObjectStore, PutInfo, open_store  # noqa: E402
from ister.storage.wal import Wal, WalConfig  # noqa: E402

TOPIC = "/default/orders"


def record(i: int) -> bytes:
    attrs = {"n": str(i)} if i % 3 == 0 else {}
    key = f"k{i % 5}" if i % 2 == 0 else None
    schema = (7, 2) if i % 4 == 0 else (None, None)
    return encode_message(
        StoredMessage(f"payload-{i}".encode(), 1_700_000_000_000 + i, 1, "prod", attrs, key, *schema)
    )


async def fill(wal: Wal, count: int) -> None:
    for _ in range(count):
        await wal.append([record(wal.next_offset)])


def expected_rows(first: int, last: int, topic: str = TOPIC, partition: int = -1) -> list[dict[str, object]]:
    """The rows as the Spark source's Python path builds them (one batch of the whole range)."""
    offsets = range(first, last + 1)
    batch = parquet.to_batch(topic, partition, offsets, [record(i) for i in offsets], True)
    return pa.Table.from_batches([batch]).to_pylist()  # type: ignore[no-any-return]


class FailingParquet(ObjectStore):
    """A file:// store whose Parquet puts fail (the `.dnb1` objects go through)."""

    def __init__(self, url: str) -> None:
        base = open_store(url)
        super().__init__(base._store, base.url)

    async def put(self, key: str, data: bytes | bytearray | memoryview) -> PutInfo:
        if key.endswith(".parquet"):
            raise OSError("injected: Parquet put failed")
        return await super().put(key, data)


async def test_each_exported_object_gets_a_parquet_copy_with_its_records(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=2048))
    objects = open_store(f"file://{tmp_path}/objects")
    exporter = SegmentExporter(TOPIC, wal, objects, EmbeddedStore.in_memory(), parquet=True)
    try:
        await fill(wal, 200)
        recorded = await exporter.export_closed()
        assert len(recorded) >= 3
        assert exporter.parquet_written == len(recorded) and exporter.parquet_failures == 0
        for d in recorded:
            key = parquet.parquet_key(d.key)
            assert key == f"default/orders/data-{d.start_offset}-{d.end_offset}.parquet"
            data = await objects.get(key)
            table = parquet.read_table(data, d.start_offset, d.end_offset)
            assert table.to_pylist() == expected_rows(d.start_offset, d.end_offset)
            # and the same records as the object itself
            stored = [r async for batch in read_segment(objects, d.key) for r in batch]
            assert [o for o, _ in stored] == table.column("offset").to_pylist()
            assert parquet.check_metadata(pq.ParquetFile(pa.BufferReader(data)).metadata, *d_range(d)) is None
    finally:
        await wal.close()


def d_range(d: object) -> tuple[int, int]:
    return d.start_offset, d.end_offset  # type: ignore[attr-defined]


async def test_partition_topics_carry_the_base_topic_and_index(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=1024))
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    exporter = SegmentExporter("/default/orders-part-3", wal, objects, meta, parquet=True)
    try:
        await fill(wal, 40)
        d = (await exporter.export_closed())[0]
        data = await objects.get(parquet.parquet_key(d.key))
        table = parquet.read_table(data, d.start_offset, d.end_offset)
        assert set(table.column("topic").to_pylist()) == {TOPIC}
        assert set(table.column("partition").to_pylist()) == {3}
    finally:
        await wal.close()


async def test_a_large_piece_is_encoded_from_chunks(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=6 * MiB))
    objects = open_store(f"file://{tmp_path}/objects", part_size=5 * MiB, multipart_threshold=5 * MiB)
    exporter = SegmentExporter(TOPIC, wal, objects, EmbeddedStore.in_memory(), parquet=True)
    try:
        big = [
            encode_message(StoredMessage(bytes([i % 251]) * 64 * 1024, 1_700_000_000_000, 1, "p"))
            for i in range(100)
        ]
        await wal.append(big)
        await wal.append([record(100)])
        (d,) = await exporter.export_closed()
        table = parquet.read_table(await objects.get(parquet.parquet_key(d.key)), 0, 99)
        assert table.column("value").to_pylist() == [bytes([i % 251]) * 64 * 1024 for i in range(100)]
    finally:
        await wal.close()


async def test_a_parquet_failure_never_fails_the_export(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=1024))
    meta = EmbeddedStore.in_memory()
    objects = FailingParquet(f"file://{tmp_path}/objects")
    exporter = SegmentExporter(TOPIC, wal, objects, meta, parquet=True)
    failed_before = parquet_copies.labels("failed")._value.get()
    try:
        await fill(wal, 60)
        recorded = await exporter.export_closed()
        assert recorded and exporter.failures == 0 and exporter.last_error is None
        assert await list_descriptors(meta, TOPIC) == recorded
        assert exporter.parquet_failures == len(recorded) and exporter.parquet_written == 0
        assert parquet_copies.labels("failed")._value.get() == failed_before + len(recorded)
        assert not [i for i in await objects.list("default/orders") if i.key.endswith(".parquet")]
        for d in recorded:  # the objects are whole
            stored = [r async for batch in read_segment(objects, d.key) for r in batch]
            assert len(stored) == d.count
    finally:
        await wal.close()


async def test_an_encoding_failure_never_fails_the_export(tmp_path: Path) -> None:
    """Records that are not StoredMessages (a bug, a foreign writer): no copy, the export goes on."""
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=1024))
    objects = open_store("memory://")
    exporter = SegmentExporter(TOPIC, wal, objects, EmbeddedStore.in_memory(), parquet=True)
    try:
        for i in range(40):
            await wal.append([f"not msgpack {i}".encode() * 3])
        recorded = await exporter.export_closed()
        assert recorded and exporter.parquet_failures == len(recorded)
    finally:
        await wal.close()


def test_damaged_copies_are_refused() -> None:
    good = parquet.encode(TOPIC, -1, 0, 9, b"".join(_frames(0, 10)))
    assert parquet.read_table(good, 0, 9).num_rows == 10
    with pytest.raises(CorruptionError):
        parquet.read_table(good[: len(good) // 2], 0, 9)  # truncated
    with pytest.raises(CorruptionError):
        parquet.read_table(b"garbage" * 100, 0, 9)
    with pytest.raises(CorruptionError):
        parquet.read_table(good, 0, 10)  # not the object's range
    other = parquet.encode(TOPIC, -1, 1, 10, b"".join(_frames(1, 10)))
    with pytest.raises(CorruptionError):
        parquet.read_table(other, 0, 9)


def _frames(first: int, n: int) -> list[bytes]:
    from ister.core.frames import encode_frame

    return [encode_frame(first + i, record(first + i)) for i in range(n)]


def test_names() -> None:
    assert parquet.parquet_name(5, 9) == "data-5-9.parquet"
    assert parquet.parquet_key("a/b/data-5-9.dnb1") == "a/b/data-5-9.parquet"
    assert parquet.parse_parquet_name("a/b/data-5-9.parquet") == (5, 9)
    assert parquet.parse_parquet_name("a/b/data-5-9.dnb1") is None
