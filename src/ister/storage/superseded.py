"""Superseded WALs: what a broker still holds of a topic that another owner has taken over.

A broker that comes back after a failover may hold records nobody else has: the tail it acknowledged but had
not exported yet. Such a WAL is never appended to again (the next owner started past it). It is moved aside
to `<data_dir>/wal-stale/<namespace>/<topic>.<epoch>` with a small origin file, then exported into the
durable tier under the topic's descriptors (only the offsets no object holds yet), so readers of the topic
find them, and deleted once every one of its records is covered. Without a durable tier there is nowhere to
put them: they are kept for `cluster.superseded_wal_retention_seconds` (for manual recovery), then deleted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ister.errors import InvalidArgument, StorageError
from ister.ids import TopicName
from ister.metadata.store import MetadataStore
from ister.storage.objects import ObjectStore, SegmentExporter
from ister.storage.objects.catalog import list_descriptors
from ister.storage.objects.retention import covered
from ister.storage.wal import Wal, WalConfig, WriterPool
from ister.storage.wal.durable import fsync_dir
from ister.storage.wal.names import list_segment_files

log = logging.getLogger(__name__)

STALE_DIR = "wal-stale"
ORIGIN_FILE = "SUPERSEDED.json"


@dataclass(frozen=True, slots=True)
class Archived:
    path: Path
    topic: TopicName
    epoch: int
    archived_at: float


def holds_records(wal_dir: Path) -> bool:
    try:
        return any(p.stat().st_size > 0 for _, p in list_segment_files(wal_dir))
    except FileNotFoundError:
        return False


def archive(data_dir: Path, wal_dir: Path, topic: TopicName, epoch: int | None) -> Path | None:
    """Move a superseded WAL directory aside (blocking). An empty one is simply removed. Returns the new
    path, None when there was nothing to keep."""
    if not wal_dir.exists():
        return None
    if not holds_records(wal_dir):
        shutil.rmtree(wal_dir, ignore_errors=True)
        return None
    origin = {"topic": topic.full, "epoch": epoch or 0, "archived_at": time.time()}
    tmp = wal_dir / (ORIGIN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(origin, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(wal_dir / ORIGIN_FILE)
    base = data_dir / STALE_DIR / topic.namespace / f"{topic.topic}.{epoch or 0}"
    target, suffix = base, 0
    while target.exists():
        suffix += 1
        target = base.with_name(f"{base.name}.{suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    wal_dir.rename(target)
    fsync_dir(target.parent)
    log.warning("%s: the WAL of epoch %s was superseded by another owner; moved to %s", topic, epoch, target)
    return target


def archived(data_dir: Path) -> list[Archived]:
    """Every archived WAL with a readable origin (blocking). Directories without one are left alone."""
    root = data_dir / STALE_DIR
    found: list[Archived] = []
    if not root.is_dir():
        return found
    for ns_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for wal_dir in sorted(p for p in ns_dir.iterdir() if p.is_dir()):
            item = _origin(wal_dir)
            if item is not None:
                found.append(item)
    return found


def _origin(wal_dir: Path) -> Archived | None:
    try:
        raw = json.loads((wal_dir / ORIGIN_FILE).read_text())
        topic = TopicName.parse(raw["topic"])
        return Archived(wal_dir, topic, int(raw["epoch"]), float(raw["archived_at"]))
    except FileNotFoundError:
        log.warning(
            "%s has no %s: not an Ister archive of a superseded WAL; left alone", wal_dir, ORIGIN_FILE
        )
    except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
        log.warning("%s: unreadable %s (%s); left alone", wal_dir, ORIGIN_FILE, exc)
    return None


async def export_archived(
    item: Archived,
    objects: ObjectStore,
    store: MetadataStore,
    wal_config: WalConfig,
    pool: WriterPool | None = None,
) -> list[tuple[int, int]]:
    """Export the records of an archived WAL that no object holds yet; returns its record ranges ([first,
    end)). Raises (and keeps the directory) unless every record is then in a recorded object."""
    wal = await Wal.open(item.path, wal_config, pool=pool)
    try:
        ranges = wal.record_ranges()
        exporter = SegmentExporter(item.topic, wal, objects, store)
        await wal.close()
        await exporter.export_tail()
    finally:
        await wal.close()
    descriptors = await list_descriptors(store, item.topic)
    missing = [(a, b) for a, b in ranges if not covered(descriptors, a, b - 1)]
    if missing:
        raise StorageError(
            f"{item.path}: offsets {missing} are still not in the durable tier after its export"
        )
    return ranges


def remove(path: Path) -> None:
    shutil.rmtree(path)
    fsync_dir(path.parent)
