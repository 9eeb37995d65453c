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
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Iterable

from ister.broker import metrics
from ister.broker.topic import Topic
from ister.clock import REAL_CLOCK, Clock
from ister.core.record import decode_message
from ister.core.retention import (
    BacklogQuota,
    RetentionLimits,
    Unit,
    format_duration_ms,
    format_size_bytes,
    plan,
    quota_breach,
)
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicRetention, parse_start
from ister.metadata.store import MetadataStore
from ister.storage.objects import ObjectStore, catalog
from ister.storage.objects.catalog import ObjectDescriptor
from ister.storage.objects.segment import list_topic_files
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

NAMESPACES_PREFIX = "/namespaces/"


class RetentionView:
    """Every topic's limits and start offset, as the metadata store holds them (mirrored by watches)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.cache = LocalCache(
            store,
            [
                keys.RETENTION_PREFIX,
                keys.START_OFFSETS_PREFIX,
                keys.RATE_LIMITS_PREFIX,
                keys.COMPRESSION_PREFIX,
                keys.COMPRESSION_DICTS_PREFIX,  # trained zstd dictionaries (broker/compression_dicts.py)
                keys.NAMESPACE_DICT_PREFIX,  # which one a topic uses under its namespace policy
                keys.TABLES_PREFIX,
                NAMESPACES_PREFIX,
            ],
        )

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

    def quota_of(self, name: TopicName) -> tuple[BacklogQuota, int]:
        """The namespace's backlog quota and message TTL (0: none)."""
        ns = self.cache.get(keys.namespace_policy(name.namespace))
        policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
        quota = BacklogQuota(
            policy.backlog_quota_size_bytes or 0,
            policy.backlog_quota_time_ms or 0,
            policy.backlog_quota_policy or "producer_error",
        )
        return quota, policy.message_ttl_ms or 0

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
        storage: TopicStorage,
        topics: Callable[[], Iterable[Topic]],
        interval: float,
        clock: Clock = REAL_CLOCK,
        hold_seconds: float = 10.0,
        move: Callable[[Topic, str, int], Awaitable[object]] | None = None,
        trimmed: Callable[[Topic], object] | None = None,
    ) -> None:
        self.view = view
        self.store = view.store
        self.storage = storage
        self.objects: ObjectStore | None = storage.objects
        self._topics = topics
        self.interval = interval
        self.hold_seconds = hold_seconds  # producer_hold: how long a publish waits for room
        self._move = move  # moves a subscription forward, consumers attached or not (Cursors.seek)
        # told when a pass moved a topic's start offset: its table's committer drops those rows now
        self._trimmed = trimmed
        self._clock = clock
        self._tasks = TaskSupervisor("retention")  # its loop
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self.deleted_units = 0
        self._swept: weakref.WeakSet[Topic] = weakref.WeakSet()  # topics swept since they were loaded
        # per topic: what the last pass saw and when its oldest kept unit expires (a quiet topic is skipped
        # until then, without reading metadata)
        self._memo: weakref.WeakKeyDictionary[Topic, tuple[object, int]] = weakref.WeakKeyDictionary()

    def start(self) -> None:
        if self._task is None and not self._tasks.closed:
            self._task = self._tasks.spawn(self._run(), "retention")

    async def close(self) -> None:
        self._task = None
        await self._tasks.close()

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self.interval)
            for topic in list(self._topics()):
                if topic.wal is None or topic.closing or topic.wal.closed:
                    continue
                await self.run_once(topic)

    async def run_once(self, topic: Topic) -> bool:
        """`enforce`, its failure logged and counted; False when it failed. The store or etcd being down
        stops a pass between steps, never deleting past what the metadata says is gone; the next pass
        sweeps what this one left (an object whose descriptor is already deleted)."""
        try:
            await self.enforce(topic)
        except Exception as exc:
            metrics.retention_failures.inc()
            self._swept.discard(topic)
            log.warning("%s: retention pass failed (%s); retried next pass", topic.name, exc)
            return False
        return True

    async def enforce(self, topic: Topic) -> int:
        """One pass over one topic; returns its start offset afterwards."""
        wal = topic.wal
        assert wal is not None
        name = topic.name
        limits = self.view.limits_of(name)
        start = max(self.view.start_of(name), topic.start_offset)
        now_ms = int(self._clock.time() * 1000)
        quota, ttl_ms = self.view.quota_of(name)
        memo = self._memo.get(topic)
        skippable = quota.unlimited and not ttl_ms
        # What the WAL held before the units are listed: the memo must not claim a pass saw writes that
        # landed while it listed (the listing runs in a thread; under load it can be older than the offset
        # read after it, and a memo of the newer state skipped every later pass until the due time)
        written = (wal.committed_offset, wal.segment_count)
        if skippable and memo is not None and memo[0] == (limits, start, *written) and now_ms < memo[1]:
            return start  # nothing written, nothing changed and nothing expires yet: no metadata read
        if topic.exporter is not None and topic not in self._swept:
            await self.sweep(topic, topic.exporter.key_prefix)  # what an interrupted pass left behind
            self._swept.add(topic)
        if self.objects is not None:
            descriptors = await catalog.list_descriptors(self.store, name)
            units = [Unit(d.start_offset, d.end_offset + 1, d.size, newest_ms(d)) for d in descriptors]
        else:
            descriptors = []
            units = await asyncio.to_thread(_wal_units, wal)
        new_start, doomed = plan(units, limits, now_ms, written[0], start)
        if new_start > start:
            await self._advance(topic, new_start)
            topic.start_offset = new_start
            if self._trimmed is not None:
                self._trimmed(topic)
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
        await self._check_quota(topic, quota, units, start, now_ms)
        if ttl_ms:
            await self._expire(topic, ttl_ms, start, now_ms)
        kept = [u for u in units if u.end > start]
        due = kept[0].newest_ms + limits.time_ms + 1 if kept and limits.time_ms else 2**63
        self._memo[topic] = ((limits, start, *written), due)
        self.passes += 1
        if doomed or dropped:
            self.deleted_units += len(doomed)
            metrics.retention_deleted_units.inc(len(doomed) or dropped)
        return start

    async def _check_quota(
        self, topic: Topic, quota: BacklogQuota, units: list[Unit], start: int, now_ms: int
    ) -> None:
        """Measure the slowest subscription's backlog against the namespace's quota; the topic refuses or
        holds publishes while it is past it (Topic.publish_batch)."""
        if quota.unlimited:
            topic.set_quota_breach(None, quota.policy, self.hold_seconds)
            return
        wal = topic.wal
        assert wal is not None
        head = wal.committed_offset
        slowest, name = await self._slowest(topic, head)
        backlog = head - max(slowest, start)
        if backlog <= 0:
            topic.set_quota_breach(None, quota.policy, self.hold_seconds)
            return
        # bytes: the backlog times the average stored record (the WAL's, else the exported units')
        wal_count = head - wal.first_offset
        if wal_count > 0:
            stored, count = sum(size for _, _, size in wal.segments()), wal_count
        else:
            stored, count = sum(u.size for u in units if u.end > start), max(1, head - start)
        backlog_bytes = backlog * stored // count
        oldest = await self._publish_time(topic, max(slowest, start)) if quota.time_ms else None
        why = quota_breach(quota, name, backlog_bytes, oldest, now_ms)
        if why is not None and topic.quota_breach is None:
            log.warning("%s: %s; policy %s", topic.name, why, quota.policy)
        if why is not None and quota.policy == "consumer_eviction":
            # the oldest unacknowledged messages go: the slow subscriptions move to where the backlog fits
            per_record = max(1, stored // count)
            target = head - quota.size_bytes // per_record if quota.size_bytes else 0
            if quota.time_ms:
                cut = await self.storage.offset_for_time(topic.name, wal, now_ms - quota.time_ms)
                target = max(target, cut)
            evicted = await self._move_on(topic, min(max(target, start), head), "backlog quota eviction")
            metrics.quota_evicted.inc(evicted)
            why = None
        topic.set_quota_breach(why, quota.policy, self.hold_seconds)

    async def _slowest(self, topic: Topic, head: int) -> tuple[int, str]:
        """(next offset, name) of the subscription furthest behind."""
        found = await self._positions(topic)
        if not found:
            return head, ""
        name = min(found, key=lambda s: found[s])
        return found[name], name

    async def _positions(self, topic: Topic) -> dict[str, int]:
        """Every subscription's next offset: the live position of a loaded one, the persisted cursor of one
        whose consumers are away."""
        live = {s.name: s.first_open for s in topic.reliable_subscriptions()}
        found: dict[str, int] = {}
        prefix = keys.subscriptions_prefix(topic.name.full)
        for kv in await self.store.list(prefix):
            rest = kv.key[len(prefix) :]
            sub, _, leaf = rest.partition("/")
            if leaf == "cursor" and isinstance(kv.value, int) and not isinstance(kv.value, bool):
                found[sub] = kv.value + 1
            elif not leaf and isinstance(kv.value, dict) and sub not in found:
                start = kv.value.get("start_offset")
                if isinstance(start, int) and not isinstance(start, bool):
                    found.setdefault(sub, start)
        found.update(live)
        return found

    async def move(self, topic: Topic, subscription: str, target: int) -> None:
        if self._move is None:
            raise RuntimeError("this retention keeper cannot move subscriptions")
        await self._move(topic, subscription, target)

    async def _move_on(self, topic: Topic, target: int, why: str) -> int:
        """Move every subscription whose next offset is below `target` to it (consumers attached or not:
        `Cursors.seek`); returns how many messages they were spared. Used by message TTL and by the backlog
        quota's consumer_eviction."""
        moved = 0
        for sub, next_offset in (await self._positions(topic)).items():
            if next_offset < target:
                await self.move(topic, sub, target)
                moved += target - next_offset
                log.info("%s/%s: %s: moved from %d to %d", topic.name, sub, why, next_offset, target)
        return moved

    async def _expire(self, topic: Topic, ttl_ms: int, start: int, now_ms: int) -> None:
        """Message TTL: what every subscription left unacknowledged longer than `ttl_ms` is acknowledged on
        its behalf (its cursor moves to the first record published since)."""
        wal = topic.wal
        assert wal is not None
        positions = await self._positions(topic)
        if not positions or min(positions.values()) >= wal.committed_offset:
            return
        target = max(await self.storage.offset_for_time(topic.name, wal, now_ms - ttl_ms), start)
        expired = await self._move_on(topic, target, "message TTL")
        if expired:
            metrics.ttl_expired.inc(expired)

    async def _publish_time(self, topic: Topic, offset: int) -> int | None:
        """The publish time of the record at `offset` (None when it cannot be read now)."""
        wal = topic.wal
        assert wal is not None
        reader = self.storage.reader(topic.name, wal, offset)
        try:
            records = await reader.read(max_records=1, timeout=0)
        except Exception:
            return None
        finally:
            reader.close()
        return decode_message(records[0][1]).publish_time if records else None

    async def _advance(self, topic: Topic, new_start: int) -> None:
        """Metadata first: the start offset, only by the owner (fenced), never backwards."""
        key = keys.start_offset(topic.name)
        current = parse_start(await self.store.get(key))
        if new_start > current:
            record = {"start_offset": new_start, "updated_at": int(self._clock.time())}
            await topic.claim.guarded_put(key, record)

    async def _delete_object(self, name: TopicName, desc: ObjectDescriptor) -> None:
        """The descriptor first (readers stop finding the object), then the object and its copy."""
        assert self.objects is not None
        await self.store.delete(keys.storage_object(name, desc.start_offset))
        await self.objects.delete(desc.key)
        # Imported here: the module loads pyarrow (~0.2 s of CPU), which a broker start does not need.
        from ister.storage.objects.parquet import parquet_key

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
