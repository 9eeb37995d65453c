"""Object descriptors in the metadata store (ister.storage.objects.catalog)."""

from __future__ import annotations

import pytest

from ister.errors import FailedPrecondition, InvalidArgument
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects.catalog import (
    ObjectDescriptor,
    advance_cur,
    covering,
    list_descriptors,
    next_descriptor,
    read_cur,
    record,
    thin_index,
)
from ister.storage.objects.segment import object_key, object_name

TOPIC = "/default/orders"


def desc(start: int, end: int, prefix: str = "p") -> ObjectDescriptor:
    return ObjectDescriptor(
        object_name(start, end), object_key(prefix, start, end), start, end, 100, '"etag"', 1_700_000_000
    )


async def test_record_writes_descriptor_then_cur_with_the_documented_layout() -> None:
    store = EmbeddedStore.in_memory()
    d = desc(0, 99)
    assert await record(store, TOPIC, d) is True
    kv = await store.get("/danube-data/storage/topics/default/orders/objects/00000000000000000000")
    assert kv is not None
    assert kv.value == {
        "object_id": "data-0-99.dnb1",
        "key": "p/data-0-99.dnb1",
        "start_offset": 0,
        "end_offset": 99,
        "size": 100,
        "etag": '"etag"',
        "created_at": 1_700_000_000,
        "completed": True,
    }
    cur = await store.get(keys.storage_objects_cur(TOPIC))
    assert cur is not None and cur.value == {"start": "00000000000000000000"}
    assert await record(store, TOPIC, d) is False  # idempotent
    assert await list_descriptors(store, TOPIC) == [d]


async def test_overlaps_are_refused_and_cur_never_moves_back() -> None:
    store = EmbeddedStore.in_memory()
    await record(store, TOPIC, desc(100, 199))
    await record(store, TOPIC, desc(0, 99))
    assert await read_cur(store, TOPIC) == 100
    for start, end in [(150, 250), (50, 120), (199, 199), (0, 500)]:
        with pytest.raises(FailedPrecondition, match="overlaps"):
            await record(store, TOPIC, desc(start, end))
    with pytest.raises(FailedPrecondition):
        await record(store, TOPIC, desc(100, 199, prefix="other"))  # same range, another object
    await record(store, TOPIC, desc(200, 200))
    assert await read_cur(store, TOPIC) == 200
    await advance_cur(store, TOPIC, 100)
    assert await read_cur(store, TOPIC) == 200
    assert [d.start_offset for d in await list_descriptors(store, TOPIC)] == [0, 100, 200]


async def test_concurrent_writer_of_a_different_descriptor_is_detected() -> None:
    store = EmbeddedStore.in_memory()
    await store.put(keys.storage_object(TOPIC, 0), desc(0, 50, prefix="x").to_json())
    with pytest.raises(FailedPrecondition, match="concurrently"):
        await record(store, TOPIC, desc(0, 99), existing=[])


async def test_listing_ignores_junk_cur_and_mismatched_keys() -> None:
    store = EmbeddedStore.in_memory()
    prefix = keys.storage_objects_prefix(TOPIC)
    good = desc(10, 19)
    await store.put(keys.storage_object(TOPIC, 10), good.to_json())
    await store.put(keys.storage_objects_cur(TOPIC), {"start": keys.pad_offset(10)})
    await store.put(keys.storage_object(TOPIC, 30), {"segment_id": "danube-style", "start_offset": 30})
    await store.put(keys.storage_object(TOPIC, 40), desc(41, 50).to_json())  # key and value disagree
    await store.put(keys.storage_object(TOPIC, 60), {**desc(60, 69).to_json(), "completed": False})
    await store.put(keys.storage_object(TOPIC, 70), {**desc(70, 79).to_json(), "size": "big"})
    await store.put(keys.storage_object(TOPIC, 80), "not an object")
    await store.put(f"{prefix}00000000000000000090/extra", desc(90, 99).to_json())
    assert await list_descriptors(store, TOPIC) == [good]
    assert await list_descriptors(store, "/default/other") == []


async def test_listing_pages_through_many_descriptors() -> None:
    store = EmbeddedStore.in_memory()
    for i in range(2500):
        await store.put(keys.storage_object(TOPIC, i * 10), desc(i * 10, i * 10 + 9).to_json())
    found = await list_descriptors(store, TOPIC)
    assert [d.start_offset for d in found] == [i * 10 for i in range(2500)]


def test_covering_and_next() -> None:
    ds = [desc(0, 9), desc(10, 19), desc(40, 49)]
    assert covering(ds, 0) == ds[0]
    assert covering(ds, 19) == ds[1]
    assert covering(ds, 20) is None
    assert covering(ds, 50) is None
    assert covering([], 0) is None
    assert next_descriptor(ds, 25) == ds[2]
    assert next_descriptor(ds, 45) == ds[2]
    assert next_descriptor(ds, 50) is None


def test_descriptor_validation() -> None:
    with pytest.raises(InvalidArgument):
        ObjectDescriptor(object_name(0, 9), "k/" + object_name(0, 9), 5, 4, 1, None, 0)
    with pytest.raises(InvalidArgument):
        ObjectDescriptor(object_name(0, 9), "k/" + object_name(0, 8), 0, 9, 1, None, 0)
    assert ObjectDescriptor.from_json({"object_id": 1}) is None
    d = desc(3, 7)
    assert ObjectDescriptor.from_json(d.to_json()) == d
    assert ObjectDescriptor.from_json({**d.to_json(), "start_offset": True}) is None
    indexed = ObjectDescriptor.from_json({**d.to_json(), "offset_index": [[3, 0], [5, 40]]})
    assert indexed is not None and indexed.offset_index == ((3, 0), (5, 40))
    assert indexed.to_json()["offset_index"] == [[3, 0], [5, 40]]
    junk = ObjectDescriptor.from_json({**d.to_json(), "offset_index": [[3, "x"]]})
    assert junk is not None and junk.offset_index == ()
    assert "offset_index" not in d.to_json()  # omitted when there is none, as in Danube
    assert thin_index([(i, i) for i in range(10)], 4) == ((0, 0), (3, 3), (6, 6), (9, 9))
