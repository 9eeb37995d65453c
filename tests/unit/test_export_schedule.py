"""The export scheduler's walks and back-off run on its clock (broker/exports.py), here a VirtualClock, over
a real WAL, a real exporter and objects in a file:// store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ister.broker.exports import ExportScheduler
from ister.clock import VirtualClock
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects import SegmentExporter, open_store
from ister.storage.objects.catalog import ObjectDescriptor
from ister.storage.objects.retention import LocalRetention
from ister.storage.wal import Wal, WalConfig
from tests.support import until
from tests.unit.test_objects_parquet import fill

TOPIC = TopicName.parse("/default/exported")


class FlakyExporter(SegmentExporter):
    """Its exports fail while `down` is set; `calls` counts them."""

    down = False
    calls = 0

    async def export_closed(self) -> list[ObjectDescriptor]:
        self.calls += 1
        if self.down:
            raise MetadataError("injected: the metadata store did not answer")
        return await super().export_closed()


class LoadedTopic:
    """What the scheduler reads of a loaded topic (broker/topic.py)."""

    def __init__(self, wal: Wal, exporter: SegmentExporter) -> None:
        self.name, self.wal, self.exporter = TOPIC, wal, exporter
        self.closing = False
        self.start_offset = 0
        self.tasks: list[Any] = []


async def test_a_failed_pass_is_retried_after_its_back_off_in_virtual_time(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = EmbeddedStore.in_memory()
    wal = await Wal.open(tmp_path / "wal", WalConfig(segment_max_bytes=2048))
    exporter = FlakyExporter(TOPIC, wal, open_store(f"file://{tmp_path}/objects"), store)
    scheduler = ExportScheduler(LocalRetention(), interval=1.0, segment_max_age=0.0, clock=clock)
    try:
        await fill(wal, 100)
        exporter.down = True
        topic: Any = LoadedTopic(wal, exporter)
        scheduler.add(topic)  # the first walk at once: its pass fails
        await until(lambda: scheduler.ticks == 1, "the first walk")
        assert exporter.calls == 1 and scheduler.passes == 0
        await until(lambda: clock.pending() == 1, "the walk asleep on the virtual clock")
        exporter.down = False
        await clock.advance(1.0)  # the next walk: the topic's retry is 1.5 to 2 s after its failure
        await until(lambda: scheduler.ticks == 2, "the second walk")
        assert exporter.calls == 1
        await clock.advance(1.0)
        await until(lambda: scheduler.passes == 1, "the retried pass, at 2 virtual seconds")
        assert exporter.calls == 2 and scheduler.exported > 0
    finally:
        await scheduler.close()
        await wal.close()
        await store.close()
