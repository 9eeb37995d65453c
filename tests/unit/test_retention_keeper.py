"""A retention pass when its I/O fails (broker/retention.py, DESIGN invariant 8): a real WAL, real exported
objects in a file:// store, the embedded metadata store. The metadata write of the start offset failing
deletes nothing; an object delete failing after its descriptor went leaves an object nobody lists, which
the next pass sweeps. Records at or past the start offset are never touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ister.broker.retention import RetentionKeeper, RetentionView
from ister.clock import VirtualClock
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import parse_start
from ister.storage.objects import SegmentExporter, open_store
from ister.storage.objects.catalog import list_descriptors
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable
from ister.storage.wal import Wal, WalConfig
from tests.support import until
from tests.unit.test_objects_parquet import fill

TOPIC = TopicName.parse("/default/kept")


class FlakyDeletes(ObjectStore):
    """A file:// store whose deletes fail while `down` is set."""

    def __init__(self, url: str) -> None:
        base = open_store(url)
        super().__init__(base._store, base.url)
        self.down = False

    async def delete(self, key: str) -> None:
        if self.down:
            raise ObjectStoreUnavailable(f"injected: delete {key} failed")
        await super().delete(key)


class Claim:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store, self.down = store, False

    async def guarded_put(self, key: str, value: object) -> None:
        if self.down:
            raise MetadataError("injected: the metadata store did not answer")
        await self.store.put(key, value)


class OwnedTopic:
    """What the keeper reads of a loaded topic (broker/topic.py), over a real WAL and exporter."""

    def __init__(self, wal: Wal, exporter: SegmentExporter, claim: Claim) -> None:
        self.name, self.wal, self.exporter, self.claim = TOPIC, wal, exporter, claim
        self.start_offset = 0
        self.closing = False
        self.quota_breach = None

    def reliable_subscriptions(self) -> list[Any]:
        return []

    def set_quota_breach(self, why: str | None, policy: str, hold: float = 0.0) -> None:
        self.quota_breach = why


async def setup(tmp_path: Path) -> tuple[Any, ...]:
    store = EmbeddedStore.in_memory()
    objects = FlakyDeletes(f"file://{tmp_path}/objects")
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=2048))
    exporter = SegmentExporter(TOPIC, wal, objects, store)
    await fill(wal, 200)
    assert len(await exporter.export_closed()) >= 3
    view = RetentionView(store)
    await view.start()
    # the records were published in 2023 (test_objects_parquet.record): with 1 ms, every exported one expires
    await store.put(keys.topic_retention(TOPIC), {"retention_time_ms": 1})
    await until(lambda: view.limits_of(TOPIC).time_ms == 1, "the limit seen by the watch")
    storage: Any = type("Storage", (), {"objects": objects})()
    keeper = RetentionKeeper(view, storage, lambda: [], 60.0)
    topic = OwnedTopic(wal, exporter, Claim(store))
    return store, objects, wal, view, keeper, topic


def object_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "objects" / "default" / "kept").glob("*.dnb1"))


async def test_the_start_offset_not_written_deletes_nothing(tmp_path: Path) -> None:
    store, _, wal, view, keeper, topic = await setup(tmp_path)
    try:
        before = object_files(tmp_path)
        descriptors = await list_descriptors(store, TOPIC)
        topic.claim.down = True
        assert not await keeper.run_once(topic)  # failed, counted, logged
        assert parse_start(await store.get(keys.start_offset(TOPIC))) == 0 and topic.start_offset == 0
        assert object_files(tmp_path) == before and await list_descriptors(store, TOPIC) == descriptors
        topic.claim.down = False
        assert await keeper.run_once(topic)  # the next pass does it
        start = parse_start(await store.get(keys.start_offset(TOPIC)))
        assert start == descriptors[-1].end_offset + 1 and wal.committed_offset == 200
        assert object_files(tmp_path) == []
    finally:
        await view.close()
        await wal.close()


async def test_an_object_left_by_a_failed_delete_is_swept_by_the_next_pass(tmp_path: Path) -> None:
    store, objects, wal, view, keeper, topic = await setup(tmp_path)
    try:
        first = (await list_descriptors(store, TOPIC))[0]
        objects.down = True
        assert not await keeper.run_once(topic)
        start = parse_start(await store.get(keys.start_offset(TOPIC)))
        assert start > first.end_offset  # metadata first: the start moved, readers start there
        assert first not in await list_descriptors(store, TOPIC)  # the first descriptor went ...
        assert first.object_id in object_files(tmp_path)  # ... its object did not: nobody lists it now
        objects.down = False
        assert await keeper.run_once(topic)
        assert object_files(tmp_path) == [] and await list_descriptors(store, TOPIC) == []
        assert parse_start(await store.get(keys.start_offset(TOPIC))) >= start
        assert wal.committed_offset == 200  # the head: nothing past the start offset touched
    finally:
        await view.close()
        await wal.close()


async def test_passes_come_every_interval_on_the_keepers_clock(tmp_path: Path) -> None:
    store, _, wal, view, idle, topic = await setup(tmp_path)
    clock = VirtualClock(wall_start=1_800_000_000.0)  # after the records' publish times: all expired
    keeper = RetentionKeeper(view, idle.storage, lambda: [topic], 60.0, clock=clock)
    keeper.start()
    try:
        await clock.advance(59.0)
        assert keeper.passes == 0 and topic.start_offset == 0  # the first pass is an interval away
        await clock.advance(1.0)
        await until(lambda: keeper.passes == 1, "the first pass, at 60 virtual seconds")
        assert topic.start_offset == parse_start(await store.get(keys.start_offset(TOPIC))) > 0
        assert object_files(tmp_path) == []
    finally:
        await keeper.close()
        await view.close()
        await wal.close()


async def test_a_listing_older_than_the_head_does_not_stop_later_passes(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Without a durable tier a pass lists the WAL's segments in a thread: on a loaded machine that listing
    can be older than the committed offset read after it. Its pass then moves the start only as far as the
    old listing allows, and the next pass must go on (seen once in the gate: the memo recorded the newer
    head, every later pass was skipped as "nothing written" and the WAL stayed past its size limit)."""
    from ister.broker import retention

    store = EmbeddedStore.in_memory()
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=2048))
    view = RetentionView(store)
    await view.start()
    try:
        await store.put(keys.topic_retention(TOPIC), {"retention_size_bytes": 4096})
        await until(lambda: view.limits_of(TOPIC).size_bytes == 4096, "the limit seen by the watch")
        storage: Any = type("Storage", (), {"objects": None})()
        keeper = RetentionKeeper(view, storage, lambda: [], 60.0)
        topic: Any = OwnedTopic(wal, None, Claim(store))  # type: ignore[arg-type]
        await fill(wal, 300)
        stale = retention._wal_units(wal)  # the listing a slow thread returns ...
        await fill(wal, 300)  # ... while these were written
        monkeypatch.setattr(retention, "_wal_units", lambda w: stale)
        assert await keeper.run_once(topic)
        first_start = topic.start_offset
        assert 0 < first_start <= 300  # as far as the old listing goes
        monkeypatch.undo()
        assert await keeper.run_once(topic)  # nothing written since: this pass must still run
        assert topic.start_offset > 300
        size = sum(s for _, _, s in wal.segments()[:-1])
        assert size <= 4096 + 2048 + 512  # closed segments back near the limit (one segment of slack)
    finally:
        await view.close()
        await wal.close()
