"""Where a broker keeps its topics' records: the WAL directories, the epoch files that say under which
ownership epoch each WAL was loaded, superseded WALs, and the durable tier behind them.

One object per broker. It opens a topic's WAL at a given offset, exports its tail before a move, reads it
back across tiers, and gives back superseded WALs (storage/superseded.py). It knows nothing about who owns
what: the broker's `Ownership` decides where offsets start and calls these primitives.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ister.config import BrokerConfig
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.metadata.store import MetadataStore
from ister.storage import superseded
from ister.storage.diskspace import DiskSpace, Headroom
from ister.storage.objects import (
    LocalRetention,
    ObjectStore,
    SegmentExporter,
    TieredReader,
    open_store,
    topic_object_prefix,
)
from ister.storage.objects.catalog import first_descriptor
from ister.storage.time_lookup import offset_for_time
from ister.storage.wal import Wal, WalReader, WriterPool, hold_root
from ister.storage.wal.cache import CacheBudget
from ister.storage.wal.checkpoint import record_gap

log = logging.getLogger(__name__)

SEAL_EXPORT_SECONDS = 30.0  # bound on exporting the WAL tail while sealing


@dataclass(frozen=True, slots=True)
class StoredOffsets:
    """What a reliable topic stores: offsets earliest .. next-1 (some may be missing after a failover
    without seal), and where its durable objects are (durable_url None: this broker has no durable tier)."""

    earliest: int
    next: int
    durable_url: str | None
    object_prefix: str


class TopicStorage:
    def __init__(self, config: BrokerConfig, store: MetadataStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        w = config.wal
        durable = config.storage.durable
        url = config.durable_url(data_dir)
        # The durable tier: closed WAL segments go to objects; readers below the WAL read them back.
        self.objects: ObjectStore | None = open_store(url, durable.options) if url is not None else None
        self.wal_config = w.wal_config(
            segment_max_age_s=durable.segment_max_age_seconds if self.objects is not None else 0.0
        )
        # One memory budget for the record caches of all this broker's WALs (per-topic caps alone would let
        # a thousand busy topics hold a thousand times cache_max_bytes).
        self.cache_budget = CacheBudget(w.cache_total_bytes)
        self.retention = LocalRetention(
            keep_bytes=durable.local_retention_bytes, keep_seconds=durable.local_retention_seconds
        )
        # Every WAL of this broker is written by one pool of threads, and one flock on <data_dir>/wal keeps
        # other processes out of all of them (a thread and two descriptors per topic would not scale).
        self.writers = WriterPool(
            w.writer_threads, idle_close_s=w.idle_close_seconds, max_open_files=w.max_open_segments
        )
        self.wal_root = data_dir / "wal"
        self.superseded_retention_s = config.cluster.superseded_wal_retention_seconds
        self.parquet = durable.parquet  # Parquet copies of exported objects (docs/formats.md)
        self._release_wal_root: Callable[[], None] | None = None
        # Free space of the data disk: reliable publishes and replica copies stop below the headroom.
        self.space = DiskSpace(
            data_dir, Headroom(config.storage.min_free_bytes, config.storage.min_free_ratio)
        )

    async def start(self) -> None:
        # Refused (StorageError) while another process uses this data directory's WALs.
        self._release_wal_root = await asyncio.to_thread(hold_root, self.wal_root)
        await self.space.start()

    async def close(self) -> None:
        await self.space.close()
        if not await asyncio.to_thread(self.writers.close):
            log.error("WAL writer threads did not stop in time")
        if self._release_wal_root is not None:
            self._release_wal_root()
            self._release_wal_root = None

    # -- local files ------------------------------------------------------------------------------------
    def wal_dir(self, name: TopicName) -> Path:
        return self.wal_root / name.namespace / name.topic

    def epoch_file(self, name: TopicName) -> Path:
        return self.data_dir / "owners" / name.namespace / f"{name.topic}.epoch"

    async def open_wal(self, name: TopicName, start_offset: int = 0) -> Wal:
        return await Wal.open(
            self.wal_dir(name),
            self.wal_config,
            start_offset=start_offset,
            pool=self.writers,
            lock_root=self.wal_root,
            cache_budget=self.cache_budget,
        )

    async def skip_to(self, name: TopicName, wal: Wal, end: int) -> Wal:
        """Close `wal` and reopen it continuing at `end`, its records kept and the offsets in between
        recorded as lost (`record_gap`); `wal` itself when it already reaches `end`."""
        if wal.next_offset >= end:
            return wal
        start = wal.next_offset
        await wal.close()
        await asyncio.to_thread(record_gap, self.wal_dir(name), start, end)
        return await self.open_wal(name, start_offset=end)

    def read_epoch(self, name: TopicName) -> int | None:
        """The ownership epoch this broker's local WAL of a topic was loaded under (None: no usable WAL)."""
        return read_epoch(self.epoch_file(name))

    def write_epoch(self, name: TopicName, epoch: int) -> None:
        write_epoch(self.epoch_file(name), epoch)

    async def forget_epoch(self, name: TopicName) -> None:
        await asyncio.to_thread(self.epoch_file(name).unlink, True)

    async def local_epochs(self) -> list[tuple[TopicName, int | None]]:
        """(topic, epoch) of every topic this broker has an epoch file for."""
        return await asyncio.to_thread(_local_epochs, self.data_dir)

    async def remove_local(self, name: TopicName) -> None:
        """Delete the topic's local WAL (a deleted topic; a later one of the same name starts empty)."""
        await asyncio.to_thread(shutil.rmtree, self.wal_dir(name), True)

    # -- superseded WALs ----------------------------------------------------------------------------------
    async def archive_superseded(self, name: TopicName, epoch: int | None) -> bool:
        """Move the topic's local WAL aside as superseded (True when it held records to give back)."""
        return (
            await asyncio.to_thread(superseded.archive, self.data_dir, self.wal_dir(name), name, epoch)
            is not None
        )

    async def archived(self) -> list[superseded.Archived]:
        return await asyncio.to_thread(superseded.archived, self.data_dir)

    async def give_back(self, item: superseded.Archived, topic_exists: bool) -> bool:
        """Export one archived WAL and delete it (True), or keep it for now (False)."""
        if not topic_exists:
            log.warning("%s was deleted: removing its superseded WAL %s", item.topic, item.path)
            await asyncio.to_thread(superseded.remove, item.path)
            return True
        if self.objects is None:
            keep = self.superseded_retention_s
            if time.time() - item.archived_at < keep:
                return False
            log.warning(
                "%s: no durable tier; deleting the superseded WAL %s after %.0f s",
                item.topic,
                item.path,
                keep,
            )
            await asyncio.to_thread(superseded.remove, item.path)
            return True
        try:
            ranges = await superseded.export_archived(
                item, self.objects, self.store, self.wal_config, self.writers
            )
        except Exception as exc:
            log.warning(
                "%s: exporting the superseded WAL %s failed (%s); kept, retried", item.topic, item.path, exc
            )
            return False
        await asyncio.to_thread(superseded.remove, item.path)
        held = ", ".join(f"{a}..{b - 1}" for a, b in ranges) or "none"
        log.info(
            "%s: superseded WAL of epoch %d is in the durable tier (offsets %s); deleted",
            item.topic,
            item.epoch,
            held,
        )
        return True

    # -- the durable tier -----------------------------------------------------------------------------------
    def exporter(self, name: TopicName, wal: Wal) -> SegmentExporter | None:
        if self.objects is None:
            return None
        return SegmentExporter(name, wal, self.objects, self.store, parquet=self.parquet)

    @staticmethod
    async def export_tail_now(wal: Wal, exporter: SegmentExporter) -> None:
        """Close the active segment (waiting for appends in flight) and export every closed segment,
        within SEAL_EXPORT_SECONDS (TimeoutError)."""
        async with asyncio.timeout(SEAL_EXPORT_SECONDS):
            await wal.rotate()
            await exporter.export_closed()

    def reader(self, name: TopicName, wal: Wal, start: int) -> TieredReader | WalReader:
        """A reader of the topic from `start`: objects → WAL when there is a durable tier, else the WAL."""
        if self.objects is not None:
            return TieredReader(name, wal, self.objects, self.store, start)
        # No tier: offsets below the WAL (a failover without seal) exist nowhere; start past them.
        return wal.reader(max(start, min(wal.first_offset, wal.committed_offset)))

    async def earliest(self, name: TopicName, wal: Wal) -> int:
        """The lowest stored offset: the first durable object's, else the WAL's first offset."""
        earliest = wal.first_offset
        if self.objects is not None:
            desc = await first_descriptor(self.store, name)
            if desc is not None:
                earliest = min(earliest, desc.start_offset)
        return min(earliest, wal.committed_offset)

    async def offset_for_time(self, name: TopicName, wal: Wal, t_ms: int) -> int:
        """The first stored offset whose record was published at or after `t_ms` (Unix ms), else the head
        (storage/time_lookup.py: from the units' publish-time ranges and one search inside one unit)."""
        earliest = await self.earliest(name, wal)
        return await offset_for_time(name, wal, self.objects, self.store, t_ms, earliest)

    async def stored_offsets(
        self, name: TopicName, wal: Wal, exporter: SegmentExporter | None
    ) -> StoredOffsets:
        head = wal.committed_offset
        earliest = await self.earliest(name, wal)
        if self.objects is None:
            return StoredOffsets(earliest, head, None, "")
        prefix = (
            exporter.key_prefix if exporter is not None else topic_object_prefix(name.namespace, name.topic)
        )
        return StoredOffsets(earliest, head, self.objects.url, prefix)


def read_epoch(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def write_epoch(path: Path, epoch: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _local_epochs(data_dir: Path) -> list[tuple[TopicName, int | None]]:
    out: list[tuple[TopicName, int | None]] = []
    root = data_dir / "owners"
    if not root.is_dir():
        return out
    for epoch_file in sorted(root.glob("*/*.epoch")):
        try:
            name = TopicName.parse(f"/{epoch_file.parent.name}/{epoch_file.name[: -len('.epoch')]}")
        except InvalidArgument:
            continue
        out.append((name, read_epoch(epoch_file)))
    return out
