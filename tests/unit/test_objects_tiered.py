"""TieredReader (ister.storage.objects.tiered): objects -> WAL -> live without gap or duplicate."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ister.core.frames import HEADER_SIZE, scan_frames
from ister.errors import DataLoss, StorageError
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects.catalog import list_descriptors
from ister.storage.objects.exporter import SegmentExporter
from ister.storage.objects.retention import LocalRetention
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable, open_store
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalConfig

TOPIC = "/default/orders"


def payload(i: int) -> bytes:
    return f"message-{i:07d}".encode() * (1 + i % 3)


class FlakyReads(ObjectStore):
    """A real memory:// store whose reads can be switched off like an unreachable endpoint."""

    def __init__(self) -> None:
        base = open_store("memory://")
        super().__init__(base._store, base.url)
        self.down = False

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if self.down:
            raise ObjectStoreUnavailable("injected: store down")
        return await super().get_range(key, start, end)

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if self.down:
            raise ObjectStoreUnavailable("injected: store down")
        return await super().get_tail(key, length)


async def append_n(wal: Wal, count: int) -> None:
    for _ in range(count):
        await wal.append([payload(wal.next_offset)])


async def old_owner(
    directory: Path, objects: ObjectStore, meta: EmbeddedStore, count: int, config: WalConfig, seal: bool
) -> None:
    """A previous owner wrote offsets 0..count-1 and exported them (all of them if it sealed)."""
    wal = await Wal.open(directory, config)
    await append_n(wal, count)
    exporter = SegmentExporter(TOPIC, wal, objects, meta)
    if seal:
        await wal.close()
        await exporter.export_tail()
    else:
        await exporter.export_closed()
        await wal.close()


async def read_until(reader: TieredReader, end: int, max_records: int = 37) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while reader.next_offset < end:
        batch = await reader.read(max_records=max_records, timeout=5)
        assert batch, f"stalled at {reader.next_offset}"
        assert [o for o, _ in batch] == list(range(batch[0][0], batch[0][0] + len(batch)))
        out.extend(batch)
    return out


def expected(start: int, end: int, skip: tuple[int, int] | None = None) -> list[tuple[int, bytes]]:
    return [(i, payload(i)) for i in range(start, end) if skip is None or not skip[0] <= i <= skip[1]]


async def test_from_zero_across_objects_then_wal_then_live(tmp_path: Path) -> None:
    objects = open_store(f"file://{tmp_path}/objects")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=2048)
    await old_owner(tmp_path / "a", objects, meta, 300, config, seal=True)
    wal = await Wal.open(tmp_path / "b", config, start_offset=300)  # the new owner after a move
    try:
        assert wal.first_offset == 300
        await append_n(wal, 120)
        reader = TieredReader(TOPIC, wal, objects, meta, 0, chunk_bytes=512)
        assert reader.in_objects and reader.available() == 420
        got = await read_until(reader, 420)
        assert got == expected(0, 420)
        assert not reader.in_objects and reader.skipped == []
        assert await reader.read(timeout=0.05) == []
        pending = asyncio.create_task(reader.read(timeout=5))
        await asyncio.sleep(0.01)
        await append_n(wal, 3)
        live = await pending
        assert live and live[0][0] == 420
        assert live + await read_until(reader, 423) == expected(420, 423)
        reader.close()
        with pytest.raises(StorageError, match="closed"):
            await reader.read(timeout=0)
    finally:
        await wal.close()


async def test_start_in_the_middle_of_an_object_and_broker_style_polling(tmp_path: Path) -> None:
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=4096)
    await old_owner(tmp_path / "a", objects, meta, 200, config, seal=True)
    wal = await Wal.open(tmp_path / "b", config, start_offset=200)
    try:
        await append_n(wal, 10)
        reader = TieredReader(TOPIC, wal, objects, meta, 77)
        got: list[tuple[int, bytes]] = []
        while reader.available() > 0:  # the way ReliableSubscription._fill polls
            records = await reader.read(max_records=10, timeout=0)
            assert records
            got.extend(records)
        assert got == expected(77, 210)
        assert await reader.read(timeout=0) == []
    finally:
        await wal.close()
    with pytest.raises(StorageError, match="wal closed"):
        await reader.read(timeout=1)


async def test_a_hole_below_the_wal_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1024)
    await old_owner(tmp_path / "a", objects, meta, 150, config, seal=False)  # failed without a seal
    exported_end = (await list_descriptors(meta, TOPIC))[-1].end_offset
    assert exported_end < 149
    wal = await Wal.open(tmp_path / "b", config, start_offset=1000)  # the next owner's reservation
    try:
        await append_n(wal, 5)
        reader = TieredReader(TOPIC, wal, objects, meta, 0)
        with caplog.at_level(logging.WARNING):
            got = await read_until(reader, 1005)
        assert got == expected(0, exported_end + 1) + expected(1000, 1005)
        assert reader.skipped == [(exported_end + 1, 999)]
        assert "known gap" in caplog.text
    finally:
        await wal.close()


async def test_wal_files_removed_by_retention_are_read_from_objects(tmp_path: Path) -> None:
    """Files deleted behind the WAL's back (retention): the WAL reader says OffsetOutOfRange and the
    tiered reader falls back to the objects, then returns to the WAL."""
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    wal = await Wal.open(tmp_path / "w", WalConfig(segment_max_bytes=1024, cache_max_bytes=0))
    try:
        await append_n(wal, 200)
        exporter = SegmentExporter(TOPIC, wal, objects, meta)
        await exporter.export_closed()
        doomed = await exporter.deletable(LocalRetention())
        assert len(doomed) >= 2
        for path in doomed[:-1]:
            path.unlink()
        assert wal.first_offset == 0  # the WAL does not know
        reader = TieredReader(TOPIC, wal, objects, meta, 0)
        assert not reader.in_objects
        assert await read_until(reader, 200) == expected(0, 200)
        assert reader.skipped == []
    finally:
        await wal.close()


async def test_object_store_outage_during_a_read_is_retriable(tmp_path: Path) -> None:
    objects = FlakyReads()
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1024)
    await old_owner(tmp_path / "a", objects, meta, 100, config, seal=True)
    wal = await Wal.open(tmp_path / "b", config, start_offset=100)
    try:
        reader = TieredReader(TOPIC, wal, objects, meta, 0, chunk_bytes=256)
        first = await reader.read(max_records=5)
        objects.down = True
        got = list(first)
        failures = 0
        while reader.next_offset < 100:
            try:
                got.extend(await reader.read(max_records=7))
            except ObjectStoreUnavailable:
                failures += 1
                objects.down = False  # the store comes back; the next read resumes at next_offset
        assert failures >= 1
        assert got == expected(0, 100)
    finally:
        await wal.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    segment_bytes=st.integers(200, 3000),
    exported=st.integers(1, 300),
    local=st.integers(0, 60),
    start_frac=st.floats(0, 1),
    max_records=st.integers(1, 50),
    chunk=st.integers(64, 5000),
)
async def test_property_no_gap_no_duplicate(
    tmp_path_factory: pytest.TempPathFactory,
    segment_bytes: int,
    exported: int,
    local: int,
    start_frac: float,
    max_records: int,
    chunk: int,
) -> None:
    tmp = tmp_path_factory.mktemp("tiered")
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=segment_bytes)
    await old_owner(tmp / "a", objects, meta, exported, config, seal=True)
    wal = await Wal.open(tmp / "b", config, start_offset=exported)
    try:
        await append_n(wal, local)
        end = exported + local
        start = min(end, int(start_frac * (end + 1)))
        reader = TieredReader(TOPIC, wal, objects, meta, start, chunk_bytes=chunk)
        assert await read_until(reader, end, max_records) == expected(start, end)
        await append_n(wal, 2)
        assert await read_until(reader, end + 2, max_records) == expected(end, end + 2)
        assert reader.skipped == []
    finally:
        await wal.close()


# ---- the WAL's holes: damaged or lost ranges come from the durable tier, else are skipped once ---------


def flip_payload_byte(path: Path, frame: int) -> int:
    """Flip a payload byte of the `frame`-th frame of a WAL file; returns that frame's offset."""
    data = bytearray(path.read_bytes())
    offset, _, pos = scan_frames(bytes(data), expect_offset=int(path.stem)).frames[frame]
    data[pos + HEADER_SIZE + 3] ^= 0x10
    path.write_bytes(bytes(data))
    return offset


async def test_a_damaged_wal_frame_is_read_from_the_durable_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1024, cache_max_bytes=0)
    wal = await Wal.open(tmp_path / "w", config)
    try:
        await append_n(wal, 300)
        await SegmentExporter(TOPIC, wal, objects, meta).export_closed()
        files = wal.segments()
        bad = flip_payload_byte(files[len(files) // 2][1], 2)  # after the export: the tier holds a copy
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                reader = TieredReader(TOPIC, wal, objects, meta, 0, chunk_bytes=512)
                assert await read_until(reader, 300) == expected(0, 300)
                assert reader.skipped == reader.damaged == []
        assert wal.holes() == [(bad, bad + 1)]
        assert caplog.text.count("reading them from the durable tier") == 1
    finally:
        await wal.close()


async def test_a_damaged_wal_range_without_a_copy_is_skipped_and_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1024, cache_max_bytes=0)
    wal = await Wal.open(tmp_path / "w", config)
    try:
        await append_n(wal, 300)
        files = wal.segments()
        bad = flip_payload_byte(files[len(files) // 2][1], 1)  # never exported
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                reader = TieredReader(TOPIC, wal, objects, meta, 0)
                got = await read_until(reader, 300)
                assert got == expected(0, 300, skip=(bad, bad))
                assert reader.skipped == reader.damaged == [(bad, bad)]
        assert caplog.text.count("durable tier holds no copy") == 1
        strict = TieredReader(TOPIC, wal, objects, meta, bad)
        strict.strict_start = True  # the batch Read RPC: a read that starts in lost data fails
        with pytest.raises(DataLoss, match=f"offsets {bad}..{bad}"):
            await strict.read(timeout=0)
        await append_n(wal, 1)
        assert wal.next_offset == 301
    finally:
        await wal.close()


async def test_a_lost_wal_tail_is_read_from_the_durable_tier(tmp_path: Path) -> None:
    """Issue 13 item 6 with a durable tier: the sealed tail was exported, then the last local segment lost
    its end. The offsets are not handed out again and readers get them from the objects."""
    objects = open_store("memory://")
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=4096)
    await old_owner(tmp_path / "w", objects, meta, 200, config, seal=True)
    last = sorted((tmp_path / "w").glob("*.wal"))[-1]
    lost_from, _, pos = scan_frames(last.read_bytes(), expect_offset=int(last.stem)).frames[3]
    os.truncate(last, pos + 5)
    wal = await Wal.open(tmp_path / "w", config)
    try:
        assert wal.next_offset == 200 and wal.holes() == [(lost_from, 200)]
        await append_n(wal, 10)
        reader = TieredReader(TOPIC, wal, objects, meta, 0, chunk_bytes=300)
        assert await read_until(reader, 210) == expected(0, 210)
        assert reader.skipped == []
    finally:
        await wal.close()
