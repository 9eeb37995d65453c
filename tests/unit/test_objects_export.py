"""Exporting a real WAL to objects (ister.storage.objects.exporter) and the local retention rule."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from ister.core.frames import scan_frames
from ister.errors import CorruptionError, FailedPrecondition, MetadataError
from ister.limits import MiB
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects.catalog import ObjectDescriptor, list_descriptors, read_cur
from ister.storage.objects.exporter import SegmentExporter, plan_file
from ister.storage.objects.retention import LocalRetention, deletable
from ister.storage.objects.segment import object_key, object_name, read_segment
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable, PutInfo, open_store
from ister.storage.wal import Wal, WalConfig
from tests.support import until

TOPIC = "/default/orders"
SMALL = WalConfig(segment_max_bytes=1024)


class FaultyMetadata(EmbeddedStore):
    """The embedded store, with switchable failures of descriptor or `cur` writes (a crash point)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_descriptor_after = -1  # fail descriptor writes once this many succeeded (-1: never)
        self.fail_cur = False
        self.descriptor_writes = 0

    async def compare_and_set(
        self, key: str, value: Any, *, expected_version: int | None, lease: int | None = None
    ) -> bool:
        if key.endswith("/cur"):
            if self.fail_cur:
                raise MetadataError("injected: cur write lost")
        elif self.fail_descriptor_after >= 0 and self.descriptor_writes >= self.fail_descriptor_after:
            raise MetadataError("injected: descriptor write lost")
        else:
            self.descriptor_writes += 1
        return await super().compare_and_set(key, value, expected_version=expected_version, lease=lease)


class FlakyObjects(ObjectStore):
    """A real memory:// store that can be switched to fail like an unreachable endpoint."""

    def __init__(self) -> None:
        base = open_store("memory://")
        super().__init__(base._store, base.url)
        self.down = False

    async def put(self, key: str, data: bytes | bytearray | memoryview) -> PutInfo:
        if self.down:
            raise ObjectStoreUnavailable("injected: store down")
        return await super().put(key, data)


def payload(i: int) -> bytes:
    return f"payload-{i:06d}-".encode() * 2


async def fill(wal: Wal, count: int) -> None:
    for i in range(count):
        await wal.append([payload(wal.next_offset)])
        del i


async def read_object(store: ObjectStore, key: str) -> list[tuple[int, bytes]]:
    return [r async for batch in read_segment(store, key) for r in batch]


def wal_records(wal: Wal, include_active: bool = True) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    segments = wal.segments() if include_active else wal.segments()[:-1]
    for first, path, size in segments:
        res = scan_frames(path.read_bytes()[:size], expect_offset=first)
        out.extend((o, bytes(p)) for o, p, _ in res.frames)
    return out


def assert_contiguous(descriptors: list[ObjectDescriptor], start: int, end: int) -> None:
    assert descriptors, "no descriptors"
    assert descriptors[0].start_offset == start
    for a, b in itertools.pairwise(descriptors):
        assert b.start_offset == a.end_offset + 1, (a, b)
    assert descriptors[-1].end_offset == end


async def test_export_closed_files_records_descriptors_and_cur(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = EmbeddedStore.in_memory()
    objects = open_store(f"file://{tmp_path}/objects")
    exporter = SegmentExporter(TOPIC, wal, objects, meta)
    try:
        await fill(wal, 200)
        closed = wal.segments()[:-1]
        assert len(closed) >= 3
        recorded = await exporter.export_closed()
        assert [d.start_offset for d in recorded] == [first for first, _, _ in closed]
        descs = await list_descriptors(meta, TOPIC)
        assert descs == recorded
        assert_contiguous(descs, 0, wal.segments()[-1][0] - 1)
        assert await read_cur(meta, TOPIC) == descs[-1].start_offset
        exported = [r for d in descs for r in await read_object(objects, d.key)]
        assert exported == wal_records(wal, include_active=False)
        for d in descs:
            head = await objects.head(d.key)
            assert (head.size, head.etag) == (d.size, d.etag)
            assert d.key == f"default/orders/data-{d.start_offset}-{d.end_offset}.dnb1"
            assert d.offset_index[0] == (d.start_offset, 0)
        # idempotent: nothing new, nothing rewritten
        assert await exporter.export_closed() == []
        assert await list_descriptors(meta, TOPIC) == descs
        assert len(await objects.list("default/orders")) == len(descs)
        with pytest.raises(FailedPrecondition):
            await exporter.export_tail()  # the WAL is still open
    finally:
        await wal.close()
    tail = await exporter.export_tail()
    assert len(tail) == 1
    descs = await list_descriptors(meta, TOPIC)
    assert_contiguous(descs, 0, 199)
    assert [r for d in descs for r in await read_object(objects, d.key)] == wal_records(wal)
    assert await exporter.export_tail() == []


async def test_crash_between_object_and_descriptor_leaves_no_dangling_descriptor(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = FaultyMetadata()
    objects = open_store("memory://")
    exporter = SegmentExporter(TOPIC, wal, objects, meta)
    try:
        await fill(wal, 200)
        meta.fail_descriptor_after = 1  # the second descriptor write is lost, after its object was put
        with pytest.raises(MetadataError, match="injected"):
            await exporter.export_closed()
        assert exporter.failures == 1
        descs = await list_descriptors(meta, TOPIC)
        assert len(descs) == 1
        stored = {o.key for o in await objects.list("")}
        assert len(stored) == 2  # one object nobody references yet
        assert {d.key for d in descs} < stored  # every descriptor has its object
        meta.fail_descriptor_after = -1
        await exporter.export_closed()  # the next pass exports the rest; the orphan key is reused
        assert exporter.failures == 0
        descs = await list_descriptors(meta, TOPIC)
        assert_contiguous(descs, 0, wal.segments()[-1][0] - 1)
        assert {o.key for o in await objects.list("")} == {d.key for d in descs}
    finally:
        await wal.close()


async def test_lost_cur_update_is_repaired_by_the_next_pass(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = FaultyMetadata()
    exporter = SegmentExporter(TOPIC, wal, open_store("memory://"), meta)
    try:
        await fill(wal, 120)
        meta.fail_cur = True
        with pytest.raises(MetadataError):
            await exporter.export_closed()
        assert len(await list_descriptors(meta, TOPIC)) == 1
        assert await read_cur(meta, TOPIC) is None
        meta.fail_cur = False
        await exporter.export_closed()
        descs = await list_descriptors(meta, TOPIC)
        assert await read_cur(meta, TOPIC) == descs[-1].start_offset
    finally:
        await wal.close()


async def test_a_file_that_grew_after_export_exports_only_the_new_offsets(tmp_path: Path) -> None:
    """Seal exported the active file [0..9]; the WAL reopened and kept appending to the same file. The
    new offsets must get their own object instead of being skipped (or duplicated) by start offset."""
    meta = EmbeddedStore.in_memory()
    objects = open_store("memory://")
    wal = await Wal.open(tmp_path / "wal", SMALL)
    await fill(wal, 10)
    await wal.close()
    assert [
        (d.start_offset, d.end_offset) for d in await SegmentExporter(TOPIC, wal, objects, meta).export_tail()
    ] == [(0, 9)]
    wal = await Wal.open(tmp_path / "wal", SMALL)
    try:
        assert wal.segments()[0][0] == 0 and wal.next_offset == 10
        await fill(wal, 100)
        assert len(wal.segments()) >= 2
        exporter = SegmentExporter(TOPIC, wal, objects, meta)
        recorded = await exporter.export_closed()
        assert recorded[0].start_offset == 10
        descs = await list_descriptors(meta, TOPIC)
        assert_contiguous(descs, 0, wal.segments()[-1][0] - 1)
        assert [r for d in descs for r in await read_object(objects, d.key)] == wal_records(wal, False)
    finally:
        await wal.close()


async def test_large_file_is_streamed_as_a_multipart_object(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=6 * MiB))
    objects = open_store(f"file://{tmp_path}/objects", part_size=5 * MiB, multipart_threshold=5 * MiB)
    meta = EmbeddedStore.in_memory()
    try:
        block = [bytes([i % 251]) * 64 * 1024 for i in range(100)]  # 6.25 MiB in one append
        await wal.append(block)
        await wal.append([b"next segment"])
        recorded = await SegmentExporter(TOPIC, wal, objects, meta).export_closed()
        assert [(d.start_offset, d.end_offset) for d in recorded] == [(0, 99)]
        assert recorded[0].size > 6 * MiB
        assert [p for _, p in await read_object(objects, recorded[0].key)] == block
    finally:
        await wal.close()


async def test_a_damaged_frame_is_not_exported_and_does_not_stop_the_rest(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = EmbeddedStore.in_memory()
    objects = open_store("memory://")
    try:
        await fill(wal, 120)
        first, path, _ = wal.segments()[1]
        frames = scan_frames(path.read_bytes(), expect_offset=first).frames
        bad, _, pos = frames[1]
        raw = bytearray(path.read_bytes())
        raw[pos + 20] ^= 0xFF  # a payload byte of the second file's second frame
        path.write_bytes(bytes(raw))
        exporter = SegmentExporter(TOPIC, wal, objects, meta)
        await exporter.export_closed()
        assert wal.holes() == [(bad, bad + 1)]  # found by the export, recorded in the WAL
        descs = await list_descriptors(meta, TOPIC)
        last_closed = wal.segments()[-1][0] - 1
        spans = [(x.start_offset, x.end_offset) for x in descs]
        assert (bad + 1, spans[2][1]) == spans[2] and spans[1][1] == bad - 1
        assert spans[0][0] == 0 and spans[-1][1] == last_closed
        records = [r for x in descs for r in await read_object(objects, x.key)]
        assert records == [(i, payload(i)) for i in range(last_closed + 1) if i != bad]
        # nothing can ever fill the damaged offset: retention counts it as done
        closed = [p for _, p, _ in wal.segments()[:-1]]
        assert await exporter.deletable(LocalRetention()) == closed
    finally:
        await wal.close()


async def test_a_header_damaged_while_open_is_found_by_the_export(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=1024, cache_max_bytes=0))
    meta = EmbeddedStore.in_memory()
    try:
        await fill(wal, 120)
        first, path, _ = wal.segments()[1]
        nxt = wal.segments()[2][0]
        frames = scan_frames(path.read_bytes(), expect_offset=first).frames
        raw = bytearray(path.read_bytes())
        raw[frames[3][2]] ^= 0x01  # the fourth frame's offset field, after the WAL checked the file
        path.write_bytes(bytes(raw))
        await SegmentExporter(TOPIC, wal, open_store("memory://"), meta).export_closed()
        assert wal.holes() == [(first + 3, nxt)]
        spans = [(x.start_offset, x.end_offset) for x in await list_descriptors(meta, TOPIC)]
        assert (first, first + 2) in spans and spans[-1][1] == wal.segments()[-1][0] - 1
        assert not any(a <= first + 3 <= b for a, b in spans)
    finally:
        await wal.close()


async def test_a_header_damaged_at_open_is_not_exported(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    await fill(wal, 120)
    await wal.close()
    path = sorted((tmp_path / "wal").glob("*.wal"))[1]
    first = int(path.stem)
    frames = scan_frames(path.read_bytes(), expect_offset=first).frames
    raw = bytearray(path.read_bytes())
    raw[frames[2][2] + 11] = 0xFF  # the third frame's length: impossible
    path.write_bytes(bytes(raw))
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = EmbeddedStore.in_memory()
    try:
        nxt = wal.segments()[2][0]
        assert wal.holes() == [(first + 2, nxt)]
        await SegmentExporter(TOPIC, wal, open_store("memory://"), meta).export_closed()
        spans = [(x.start_offset, x.end_offset) for x in await list_descriptors(meta, TOPIC)]
        assert (first, first + 1) in spans and not any(a <= first + 2 <= b for a, b in spans)
        assert spans[-1][1] == wal.segments()[-1][0] - 1
    finally:
        await wal.close()


async def test_run_backs_off_while_the_store_is_down_and_catches_up(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = EmbeddedStore.in_memory()
    objects = FlakyObjects()
    objects.down = True
    exporter = SegmentExporter(TOPIC, wal, objects, meta)
    task = asyncio.create_task(exporter.run(0.02, initial_backoff=0.01, max_backoff=0.05))
    try:
        await fill(wal, 150)  # producing is never blocked by the exporter
        await until(lambda: exporter.failures >= 3, "three failed export attempts")
        assert isinstance(exporter.last_error, ObjectStoreUnavailable)
        assert await list_descriptors(meta, TOPIC) == []
        objects.down = False
        await until(
            lambda: exporter.failures == 0 and len(exporter.descriptors) == len(wal.segments()) - 1,
            "every closed segment exported after the store came back",
        )
        assert exporter.failures == 0 and exporter.last_error is None
        assert_contiguous(await list_descriptors(meta, TOPIC), 0, wal.segments()[-1][0] - 1)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wal.close()


def test_plan_file_splits_around_recorded_ranges(tmp_path: Path) -> None:
    from ister.core.frames import encode_frames

    path = tmp_path / "00000000000000000100.wal"
    data = encode_frames(100, [b"x" * 10] * 50)
    path.write_bytes(data)
    frame = 26

    def plan(covered: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
        return [(p.first, p.last, p.start_pos, p.end_pos) for p in plan_file(path, 100, len(data), covered)]

    assert plan([]) == [(100, 149, 0, 50 * frame)]
    assert plan([(0, 99), (150, 200)]) == [(100, 149, 0, 50 * frame)]
    assert plan([(100, 109)]) == [(110, 149, 10 * frame, 50 * frame)]
    assert plan([(90, 119), (130, 139)]) == [
        (120, 129, 20 * frame, 30 * frame),
        (140, 149, 40 * frame, 50 * frame),
    ]
    assert plan([(100, 149)]) == []
    assert plan([(149, 149)]) == [(100, 148, 0, 49 * frame)]
    with pytest.raises(CorruptionError):
        plan_file(path, 100, len(data) + 5, [])
    with pytest.raises(CorruptionError):
        plan_file(path, 101, len(data), [])


def d(start: int, end: int) -> ObjectDescriptor:
    return ObjectDescriptor(object_name(start, end), object_key("p", start, end), start, end, 1, None, 0)


def test_deletable_needs_recorded_objects_and_respects_retention() -> None:
    segs = [(0, Path("a"), 100), (10, Path("b"), 100), (20, Path("c"), 100), (30, Path("d"), 50)]
    descs = [d(0, 9), d(10, 19), d(20, 29)]
    assert deletable(segs, descs) == [Path("a"), Path("b"), Path("c")]  # never the active file
    assert deletable(segs, [d(0, 9), d(20, 29)]) == [Path("a")]  # stops at the first unexported file
    assert deletable(segs, [d(0, 5), d(6, 14), d(15, 29)]) == [Path("a"), Path("b"), Path("c")]
    assert deletable(segs, descs, LocalRetention(keep_bytes=150)) == [Path("a"), Path("b")]
    assert deletable(segs, descs, LocalRetention(keep_bytes=10_000)) == []
    assert deletable(segs, descs, keep_from=15) == [Path("a")]
    ages = {Path("a"): 100.0, Path("b"): 5.0, Path("c"): 100.0}
    assert deletable(segs, descs, LocalRetention(keep_seconds=60), ages=ages) == [Path("a")]
    assert deletable(segs, descs, LocalRetention(keep_seconds=60)) == []
    # a file followed by a gap (next file starts later) is judged by the whole span up to the next file
    gap = [(0, Path("a"), 100), (50, Path("e"), 10)]
    assert deletable(gap, [d(0, 9)]) == []
    assert deletable(gap, [d(0, 9), d(10, 49)]) == [Path("a")]
    # offsets the WAL lost or found damaged count as done: no copy of them can ever come
    assert deletable(gap, [d(0, 9)], holes=[(10, 50)]) == [Path("a")]
    assert deletable(segs, [d(0, 9), d(20, 29)], holes=[(10, 15)]) == [Path("a")]
    assert deletable(segs, [d(0, 9), d(20, 29)], holes=[(10, 15), (15, 20)]) == segs_paths(3)


def segs_paths(n: int) -> list[Path]:
    return [Path(x) for x in "abcd"[:n]]


async def test_exporter_deletable_uses_fresh_descriptors(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "wal", SMALL)
    meta = EmbeddedStore.in_memory()
    exporter = SegmentExporter(TOPIC, wal, open_store("memory://"), meta)
    try:
        await fill(wal, 150)
        assert await exporter.deletable(LocalRetention()) == []
        await exporter.export_closed()
        closed = [p for _, p, _ in wal.segments()[:-1]]
        assert await exporter.deletable(LocalRetention()) == closed
        assert await exporter.deletable(LocalRetention(keep_seconds=3600)) == []
        await meta.delete(keys.storage_object(TOPIC, wal.segments()[1][0]))
        assert await exporter.deletable(LocalRetention()) == closed[:1]
    finally:
        await wal.close()
