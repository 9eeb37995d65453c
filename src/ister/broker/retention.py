"""Retention on the broker: each reliable topic it leads loses its oldest whole units once they are past
the topic's limits (docs/retention.md; the rules are `core/retention.py`'s).

A pass over one topic: list its units (durable objects when the broker has a durable tier, else the closed
WAL segment files), plan, then
1. move the topic's start offset forward in the metadata store (`/ister/start-offsets/{ns}/{topic}`,
   written only by the topic's owner, never backwards): from now on every reader starts there;
2. delete the descriptors of the units below it (metadata), then their objects and Parquet copies, then
   the local WAL files wholly below it.
A crash between the steps leaves only files nobody lists: the sweep (`sweep`, at load and every pass)
deletes objects below the start offset that no descriptor names, and WAL files wholly below it. Followers
drop their own WAL files below the start offset (`ReplicaFollower.trim`).

Limits come from the topic's own setting (`/ister/retention/{ns}/{topic}`), else its namespace's policy,
else 7 days and unlimited size; all of them, and the start offsets, are mirrored by a watch (`LocalCache`),
so a pass reads no metadata to decide whether there is anything to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable

from ister.broker import metrics
from ister.broker.topic import Topic
from ister.core.retention import RetentionLimits, Unit, format_duration_ms, format_size_bytes, plan
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicRetention, parse_start
from ister.metadata.store import MetadataStore
from ister.storage.objects import ObjectStore, catalog
from ister.storage.objects.catalog import ObjectDescriptor
from ister.storage.objects.parquet import parquet_key
from ister.storage.objects.segment import list_topic_files
from ister.storage.wal import Wal

log = logging.getLogger(__name__)

NAMESPACES_PREFIX = "/namespaces/"


class RetentionView:
    """Every topic's limits and start offset, as the metadata store holds them (mirrored by watches)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.cache = LocalCache(store, [keys.RETENTION_PREFIX, keys.START_OFFSETS_PREFIX, NAMESPACES_PREFIX])

    async def start(self) -> None:
        await self.cache.start()

    async def close(self) -> None:
        await self.cache.close()

    def limits_of(self, name: TopicName) -> RetentionLimits:
        own = self.cache.get(keys.topic_retention(name))
        mine = TopicRetention.parse(own.value) if own is not None else None
        ns = self.cache.get(keys.namespace_policy(name.namespace))
        policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
        default = RetentionLimits()
        time_ms = _first(mine.retention_time_ms if mine else None, policy.retention_time_ms, default.time_ms)
        size = _first(mine.retention_size_bytes if mine else None, policy.retention_size_bytes, 0)
        return RetentionLimits(time_ms, size)

    def start_of(self, name: TopicName) -> int:
        """The topic's start offset (0 until retention first deleted something)."""
        return parse_start(self.cache.get(keys.start_offset(name)))

    async def read_start(self, name: TopicName) -> int:
        """The start offset as the store holds it now (at load: the watch may not have seen it yet)."""
        return parse_start(await self.store.get(keys.start_offset(name)))


def _first(*values: int | None) -> int:
    for v in values:
        if v is not None:
            return v
    return 0


def newest_ms(desc: ObjectDescriptor) -> int:
    """The newest publish time of an object's records; its export time where the descriptor has none
    (later than every record in it: the object is then kept a little longer, never shorter)."""
    exact = getattr(desc, "max_publish_time_ms", None)
    return exact if isinstance(exact, int) else desc.created_at * 1000


class RetentionKeeper:
    """Runs retention passes over the reliable topics this broker leads, every `interval` seconds."""

    def __init__(
        self,
        view: RetentionView,
        objects: ObjectStore | None,
        topics: Callable[[], Iterable[Topic]],
        interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.view = view
        self.store = view.store
        self.objects = objects
        self._topics = topics
        self.interval = interval
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self.deleted_units = 0
        self._swept: weakref.WeakSet[Topic] = weakref.WeakSet()  # topics swept since they were loaded

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for topic in list(self._topics()):
                if topic.wal is None or topic.closing or topic.wal.closed:
                    continue
                try:
                    await self.enforce(topic)
                except asyncio.CancelledError:
                    raise
                except (
                    Exception
                ) as exc:  # the store or etcd is down: nothing was deleted past what is recorded
                    metrics.retention_failures.inc()
                    log.warning("%s: retention pass failed (%s); retried next pass", topic.name, exc)

    async def enforce(self, topic: Topic) -> int:
        """One pass over one topic; returns its start offset afterwards."""
        wal = topic.wal
        assert wal is not None
        name = topic.name
        limits = self.view.limits_of(name)
        start = max(self.view.start_of(name), topic.start_offset)
        if topic.exporter is not None and topic not in self._swept:
            await self.sweep(topic, topic.exporter.key_prefix)  # what an interrupted pass left behind
            self._swept.add(topic)
        now_ms = int(self._clock() * 1000)
        if self.objects is not None:
            descriptors = await catalog.list_descriptors(self.store, name)
            units = [Unit(d.start_offset, d.end_offset + 1, d.size, newest_ms(d)) for d in descriptors]
        else:
            descriptors = []
            units = await asyncio.to_thread(_wal_units, wal)
        new_start, doomed = plan(units, limits, now_ms, wal.committed_offset, start)
        if new_start > start:
            await self._advance(topic, new_start)
            topic.start_offset = new_start
            log.info(
                "%s: retention moved the start offset %d -> %d (%s)", name, start, new_start, _why(limits)
            )
        start = max(start, new_start)
        if self.objects is not None:
            gone = {(u.first, u.end) for u in doomed}
            for desc in descriptors:
                if (desc.start_offset, desc.end_offset + 1) in gone and desc.end_offset < start:
                    await self._delete_object(name, desc)
        dropped = await wal.drop_below(start)
        self.passes += 1
        if doomed or dropped:
            self.deleted_units += len(doomed)
            metrics.retention_deleted_units.inc(len(doomed) or dropped)
        return start

    async def _advance(self, topic: Topic, new_start: int) -> None:
        """Metadata first: the start offset, only by the owner (fenced), never backwards."""
        key = keys.start_offset(topic.name)
        current = parse_start(await self.store.get(key))
        if new_start > current:
            await topic.claim.guarded_put(key, {"start_offset": new_start, "updated_at": int(self._clock())})

    async def _delete_object(self, name: TopicName, desc: ObjectDescriptor) -> None:
        """The descriptor first (readers stop finding the object), then the object and its copy."""
        assert self.objects is not None
        await self.store.delete(keys.storage_object(name, desc.start_offset))
        await self.objects.delete(desc.key)
        await self.objects.delete(parquet_key(desc.key))

    async def sweep(self, topic: Topic, object_prefix: str) -> int:
        """Delete what a crash between the steps left behind: objects (and copies) wholly below the start
        offset that no descriptor names. Returns how many objects went."""
        if self.objects is None:
            return 0
        start = await self.view.read_start(topic.name)
        if start == 0:
            return 0
        named = {d.key for d in await catalog.list_descriptors(self.store, topic.name)}
        found, copies = await list_topic_files(self.objects, object_prefix)
        n = 0
        for first, last, key in found:
            if last < start and key not in named:
                await self.objects.delete(key)
                if (first, last) in copies:
                    await self.objects.delete(copies[(first, last)])
                n += 1
        if n:
            log.info(
                "%s: swept %d objects below the start offset %d left by an interrupted pass",
                topic.name,
                n,
                start,
            )
        return n


def _why(limits: RetentionLimits) -> str:
    return f"retention time {format_duration_ms(limits.time_ms)}, size {format_size_bytes(limits.size_bytes)}"


def _wal_units(wal: Wal) -> list[Unit]:
    """The closed WAL segment files as units (no durable tier); a file's modification time stands in for
    its newest record's publish time (later than every record in it)."""
    segments = wal.segments()
    out: list[Unit] = []
    for i in range(len(segments) - 1):
        first, path, size = segments[i]
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            continue
        out.append(Unit(first, segments[i + 1][0], size, int(mtime * 1000)))
    return out
