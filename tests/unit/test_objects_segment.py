"""The .dnb1 object format (ister.storage.objects.segment): round trip, seeks, GET counts, corruption."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ister.core.frames import HEADER_SIZE, encode_frames, scan_frames
from ister.errors import CorruptionError, InvalidArgument
from ister.storage.objects.segment import (
    FOOTER_SIZE,
    INDEX_ENTRY_SIZE,
    MAGIC,
    SegmentBuilder,
    build_segment,
    list_segments,
    object_key,
    object_name,
    parse_object_name,
    read_layout,
    read_segment,
)
from ister.storage.objects.store import ObjectStore, open_store


class CountingStore(ObjectStore):
    """A real memory:// store that counts the GETs it serves."""

    def __init__(self) -> None:
        base = open_store("memory://")
        super().__init__(base._store, base.url)
        self.gets = 0

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        self.gets += 1
        return await super().get_range(key, start, end)

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        self.gets += 1
        return await super().get_tail(key, length)


def payload(i: int, size: int = 20) -> bytes:
    return (f"m{i:08d}-".encode() * (size // 10 + 1))[:size]


def records(first: int, count: int, size: int = 20) -> list[tuple[int, bytes]]:
    return [(first + i, payload(first + i, size)) for i in range(count)]


async def collect(
    store: ObjectStore, key: str, *args: int | None, chunk: int = 4096
) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    async for batch in read_segment(store, key, *args, chunk_bytes=chunk):
        assert batch, "batches are never empty"
        assert [o for o, _ in batch] == list(range(batch[0][0], batch[0][0] + len(batch)))
        out.extend(batch)
    return out


def test_names_and_keys() -> None:
    assert object_name(5, 29) == "data-5-29.dnb1"
    assert object_key("ns/t/", 0, 1) == "ns/t/data-0-1.dnb1"
    assert object_key("", 3, 3) == object_name(3, 3)
    assert parse_object_name("x/y/" + object_name(7, 70)) == (7, 70)
    assert parse_object_name("data-5-4.dnb1") is None
    assert parse_object_name("data-05-7.dnb1") is None
    assert parse_object_name("data-1-2.wal") is None
    with pytest.raises(InvalidArgument):
        object_name(9, 5)


def test_layout_is_body_then_index_then_footer() -> None:
    recs = records(100, 25)
    blob = build_segment(recs, index_every_frames=10)
    body = encode_frames(100, [p for _, p in recs])
    assert blob.startswith(body)  # the body is the WAL frames, byte for byte
    tail = blob[len(body) :]
    assert len(tail) == 3 * INDEX_ENTRY_SIZE + FOOTER_SIZE  # entries at 100, 110, 120
    entries = [struct.unpack_from("<QQ", tail, i * 16) for i in range(3)]
    frame = HEADER_SIZE + 20
    assert entries == [(100, 0), (110, 10 * frame), (120, 20 * frame)]
    first, last, count, index_pos, index_count, version, flags, _crc, magic = struct.unpack(
        "<QQQQIHHI8s", tail[-FOOTER_SIZE:]
    )
    assert (first, last, count, index_pos, index_count, version, flags, magic) == (
        100,
        124,
        25,
        len(body),
        3,
        1,
        0,
        MAGIC,
    )


def test_builder_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        build_segment([])
    with pytest.raises(ValueError, match="dense"):
        build_segment([(1, b"a"), (3, b"b")])
    builder = SegmentBuilder(10)
    with pytest.raises(CorruptionError, match="gap"):
        builder.feed(encode_frames(11, [b"x"]))
    builder = SegmentBuilder(10)
    bad = bytearray(encode_frames(10, [b"abc"]))
    bad[-1] ^= 1
    with pytest.raises(CorruptionError, match="crc"):
        builder.feed(bytes(bad))
    builder = SegmentBuilder(10)
    frames = encode_frames(10, [b"abc", b"def"])
    assert builder.feed(frames[:25]) == frames[:19]  # only complete frames are released
    with pytest.raises(CorruptionError, match="incomplete"):
        builder.finish()


async def test_round_trip_and_every_seek() -> None:
    store = CountingStore()
    recs = records(1000, 300, size=50)
    key = object_key("t", 1000, 1299)
    await store.put(key, build_segment(recs, index_every_frames=16))
    assert await collect(store, key) == recs
    for start in range(990, 1305, 7):
        got = await collect(store, key, start)
        assert got == [r for r in recs if r[0] >= start]
    for start, end in [(1000, 1000), (1100, 1150), (1299, 1299), (1290, 5000), (0, 1001), (1200, 1100)]:
        got = await collect(store, key, start, end)
        assert got == [r for r in recs if start <= r[0] <= end]


async def test_seek_takes_two_or_three_gets_on_a_large_object() -> None:
    store = CountingStore()
    recs = records(0, 20_000, size=100)  # ~2.3 MiB, 20 index entries
    key = object_key("big", 0, 19_999)
    await store.put(key, build_segment(recs))
    store.gets = 0
    got = await collect(store, key, 12_345, 12_400, chunk=1 << 20)
    assert got == recs[12_345:12_401]
    assert store.gets == 2  # tail (footer + index), then one ranged GET of the body
    store.gets = 0
    layout = await read_layout(store, key, tail_read=FOOTER_SIZE)  # tail too short for the index
    assert store.gets == 2 and len(layout.index) == 20


async def test_small_object_is_read_with_one_get() -> None:
    store = CountingStore()
    recs = records(5, 10)
    key = object_key("small", 5, 14)
    await store.put(key, build_segment(recs))
    store.gets = 0
    assert await collect(store, key) == recs
    assert store.gets == 1


async def test_every_flipped_byte_is_detected_or_harmless(tmp_path: Path) -> None:
    """Flip each byte of a small object: reading it whole either fails with CorruptionError or (never)
    returns different data."""
    recs = records(40, 12, size=9)
    blob = build_segment(recs, index_every_frames=4)
    store = open_store(f"file://{tmp_path}")
    key = object_key("c", 40, 51)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x40
        await store.put(key, bytes(bad))
        with pytest.raises(CorruptionError):
            await collect(store, key)


async def test_truncated_renamed_and_foreign_objects_are_corrupt() -> None:
    store = open_store("memory://")
    recs = records(0, 50)
    blob = build_segment(recs)
    await store.put("t/cut", blob[:-1])
    await store.put(object_key("t", 1, 50), blob)  # name disagrees with the footer
    await store.put("t/foreign", b"x" * 200)
    await store.put("t/tiny", b"DNB1")
    for key in ("t/cut", object_key("t", 1, 50), "t/foreign", "t/tiny"):
        with pytest.raises(CorruptionError):
            await collect(store, key)


async def test_corrupt_payload_far_from_the_seek_point_is_not_read() -> None:
    """A range read only touches the frames it returns (plus those between the index entry and them)."""
    store = open_store("memory://")
    recs = records(0, 100)
    blob = bytearray(build_segment(recs, index_every_frames=10))
    frame = HEADER_SIZE + 20
    blob[95 * frame + HEADER_SIZE] ^= 1  # payload of offset 95
    key = object_key("t", 0, 99)
    await store.put(key, bytes(blob))
    assert await collect(store, key, 10, 30) == recs[10:31]
    with pytest.raises(CorruptionError):
        await collect(store, key, 90)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.integers(0, 2**40),
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    every=st.integers(1, 20),
    every_bytes=st.integers(1, 10_000),
    chunk=st.integers(1, 9000),
    data=st.data(),
)
async def test_property_any_range_reads_back_exactly(
    first: int, sizes: list[int], every: int, every_bytes: int, chunk: int, data: st.DataObject
) -> None:
    recs = [(first + i, payload(first + i, n)) for i, n in enumerate(sizes)]
    blob = build_segment(recs, index_every_frames=every, index_every_bytes=every_bytes)
    assert scan_frames(blob, expect_offset=first).count == len(recs)
    store = open_store("memory://")
    last = first + len(recs) - 1
    key = object_key("p", first, last)
    await store.put(key, blob)
    lo = data.draw(st.integers(first - 2, last + 2))
    hi = data.draw(st.integers(lo - 1, last + 2))
    assert await collect(store, key, lo, hi, chunk=chunk) == [r for r in recs if lo <= r[0] <= hi]


async def test_list_segments_finds_a_topics_objects_without_metadata() -> None:
    store = open_store("memory://")
    for start, end in [(30, 59), (0, 29), (60, 60)]:
        await store.put(
            object_key("default/orders", start, end), build_segment(records(start, end - start + 1))
        )
    await store.put("default/orders/notes.txt", b"x")
    await store.put("default/orders/old/" + object_name(0, 5), b"x")
    await store.put(object_key("default/orders2", 0, 1), b"x")
    assert await list_segments(store, "default/orders/") == [
        (0, 29, "default/orders/data-0-29.dnb1"),
        (30, 59, "default/orders/data-30-59.dnb1"),
        (60, 60, "default/orders/data-60-60.dnb1"),
    ]
