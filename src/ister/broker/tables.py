"""Topics as Iceberg tables on the broker (docs/tables.md): a committer per reliable topic this broker
owns whose table policy is on.

Each committer pass, every `interval` (sooner when retention moved the topic's start: `TableKeeper.wake`):
1. read the table's committed end offset and epoch from its current snapshot (`tables/committer.py`); a
   table left by an earlier topic of this name is renamed out of the way, and the topic's incarnation is
   stamped on the writer (`table_ops.follow_incarnation`, `stamp`);
2. commit the records from there to the topic's committed offset, one commit per WAL segment's part
   (so a tail file never straddles a segment) and at most `tables.max_commit_records` per commit; the
   worker reads them from the WAL segment file itself, the broker when it cannot (`_append`);
3. retention: rows below the topic's start offset are deleted from the table;
4. compaction: the files inside an exported segment's range (a closed WAL segment's when there is no
   durable tier) are replaced by one, in one commit;
5. now and then, snapshots older than `tables.snapshot_keep_seconds` expire and the files only they
   named are deleted;
6. every `tables.orphan_sweep_interval_seconds`, data files no snapshot names that are older than
   `tables.orphan_min_age_seconds` are deleted (`table_ops.OrphanSweeper`, `tables/sweep.py`).
A failed pass (catalog down, object store down) is retried after a backoff from the table's state: nothing
is lost (the topic still holds the records) and nothing is added twice (the end offset says what is in).
A pass refused as fenced (a newer owner committed) ends the committer. pyiceberg is blocking: its calls run
in worker threads; it is imported only once some topic's policy is on.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import multiprocessing
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from prometheus_client import Counter

from ister.broker import table_ops
from ister.broker.topic import Topic
from ister.clock import REAL_CLOCK, Clock
from ister.config import TablesSettings
from ister.core import zdict
from ister.core.backoff import Backoff
from ister.errors import Fenced
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.schema.bindings import TopicBindings
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal.runs import RunUnreadable, locate
from ister.tables.catalog import CatalogSpec, table_ident
from ister.tables.packing import pack
from ister.tables.policy import TablePolicy, TableSetting, in_effect
from ister.tables.shape_spec import ShapeSpec
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

table_commits = Counter("ister_table_commits", "Iceberg table commits (docs/tables.md)", ("op", "result"))
table_rows = Counter("ister_table_rows", "Rows committed to topics' Iceberg tables")
table_fallbacks = Counter(
    "ister_table_wal_fallbacks", "Table appends the broker read after the worker could not read the WAL file"
)

TICK_SECONDS = 1.0  # how often policies are looked at (a committer's own pace is its interval)
EXPIRE_EVERY_SECONDS = 60.0
READ_CHUNK = 10_000


def policy_of(cache: LocalCache, topic: Topic) -> TablePolicy:
    own = cache.get(keys.topic_table(topic.name))
    ns = cache.get(keys.namespace_policy(topic.name.namespace))
    return in_effect(
        TableSetting.from_json(own.value) if own is not None else None,
        TableSetting.of_namespace(ns.value if ns is not None else None),
    )


class TableKeeper:
    """Starts and stops the committers of the topics this broker owns, by their policies."""

    def __init__(
        self,
        cache: LocalCache,
        storage: TopicStorage,
        topics: Callable[[], Iterable[Topic]],
        spec: Callable[[], CatalogSpec],
        settings: TablesSettings,
        clock: Clock = REAL_CLOCK,
        schema_of: Callable[[Topic], Awaitable[ShapeSpec | None]] | None = None,
    ) -> None:
        self.cache = cache
        self.storage = storage
        self._topics = topics
        self._spec = spec
        self.settings = settings
        self._clock = clock
        # the registry versions a topic's records follow (None: a bytes topic): the table's typed columns
        self.schema_of = schema_of
        self._pool: ProcessPoolExecutor | None = None
        self._pool_dicts: set[int] = set()  # compression dictionaries the worker process holds already
        self.committers: dict[Topic, TopicCommitter] = {}
        self._tasks = TaskSupervisor("tables")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and not self._tasks.closed:
            self._task = self._tasks.spawn(self._run(), "tables")

    async def close(self) -> None:
        self._task = None
        for c in list(self.committers.values()):
            c.stop()
        await self._tasks.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def run(self, *args: Any) -> Any:
        """`tables.worker.dispatch(*args)` in the broker's table worker process (started on first use), or
        in a thread when `tables.worker_process` is off. A worker that died is replaced at the next call."""
        loop = asyncio.get_running_loop()
        if not self.settings.worker_process:
            return await asyncio.to_thread(_dispatch, *args)  # imports pyiceberg there, not on the loop
        if self._pool is None:
            self._pool = await asyncio.to_thread(_start_pool, self.settings.worker_nice)
            self._pool_dicts = set()
        # The worker decodes records itself: it gets the zstd dictionaries it does not hold yet with the
        # operation (docs/compression.md, "Dictionaries"); ids are immutable: sending one twice is harmless.
        new = {
            i: d for i in zdict.REGISTRY.ids() if i not in self._pool_dicts and (d := zdict.REGISTRY.get(i))
        }
        try:
            result = await loop.run_in_executor(self._pool, _dispatch_with, tuple(new.values()), *args)
        except BrokenProcessPool:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            raise
        except Exception:
            self._pool_dicts.update(new)  # the operation ran (and failed) after the worker loaded them
            raise
        self._pool_dicts.update(new)
        return result

    async def _run(self) -> None:
        while True:
            self.tick()
            await self._clock.sleep(TICK_SECONDS)

    def tick(self) -> None:
        live = set()
        for topic in list(self._topics()):
            if topic.wal is None or topic.closing or topic.wal.closed:
                continue
            policy = policy_of(self.cache, topic)
            if not policy.on:
                continue
            live.add(topic)
            c = self.committers.get(topic)
            if c is None or c.done:
                c = TopicCommitter(self, topic, policy)
                self.committers[topic] = c
                task = self._tasks.spawn(c.run(), f"table {topic.name}")
                c.task = task
                topic.tasks.append(task)  # Topic.close cancels it
                task.add_done_callback(functools.partial(_forget, topic))
            else:
                c.policy = policy
        for topic in [t for t in self.committers if t not in live]:
            self.committers.pop(topic).stop()

    def wake(self, topic: Topic) -> None:
        """Run the topic's committer now (retention moved its start offset: the table drops those rows)."""
        c = self.committers.get(topic)
        if c is not None:
            c.wake.set()


def _start_pool(nice: int = 0) -> ProcessPoolExecutor:
    """One worker process, started by spawn (a fork would copy the broker's gRPC and loop state)."""
    from ister.tables import worker

    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=worker.init_worker,
        initargs=(os.getpid(), nice),
    )


def _dispatch(*args: Any) -> Any:
    from ister.tables import worker

    return worker.dispatch(*args)


def _dispatch_with(dicts: tuple[bytes, ...], *args: Any) -> Any:
    """`_dispatch` in the worker process after loading the compression dictionaries it was sent."""
    for d in dicts:
        zdict.REGISTRY.add(d)
    return _dispatch(*args)


class SubjectVersions:
    """`TableKeeper.schema_of` from the registry: the subject a topic is bound to and its versions' stored
    records (immutable: kept once read; the subject's version list is read afresh each pass, so a record
    committed before the pass began never names a version the spec lacks)."""

    def __init__(self, bindings: Callable[[], TopicBindings]) -> None:
        self._bindings = bindings
        self._records: dict[tuple[str, int, str], Any] = {}

    async def __call__(self, topic: Topic) -> ShapeSpec | None:
        registry = self._bindings()
        binding = await registry.topic_binding(str(topic.name))  # read afresh: no watch lag
        if binding is None:
            return None
        _, listed = await registry.list_versions(binding.subject)
        versions: list[tuple[int, Any]] = []
        for entry in sorted(listed, key=lambda e: int(e.get("version", 0))):
            v = int(entry.get("version", 0))
            # with the fingerprint: a subject deleted and registered again reuses version numbers
            key = (binding.subject, v, str(entry.get("fingerprint", "")))
            record = self._records.get(key)
            if record is None:
                kv = await registry.store.get(keys.schema_version(binding.subject, v))
                if kv is None or not isinstance(kv.value, dict):
                    continue  # deleted
                record = self._records[key] = kv.value
            versions.append((v, record))
        return ShapeSpec(binding.subject, tuple(versions)) if versions else None


def _forget(topic: Topic, task: asyncio.Task[None]) -> None:
    if task in topic.tasks:
        topic.tasks.remove(task)


class TopicCommitter:
    """One topic's committer (see the module's docstring)."""

    def __init__(self, keeper: TableKeeper, topic: Topic, policy: TablePolicy) -> None:
        self.keeper = keeper
        self.topic = topic
        self.policy = policy
        self.task: asyncio.Task[None] | None = None
        self.done = False
        self.failures = 0
        self.last_error: BaseException | None = None
        self.committed_end = 0  # the table's end offset after the last pass
        self._shape: ShapeSpec | None = None
        # the next call reloads the table: after a failure (its metadata may have moved), and at the first
        # (the worker may hold this table's writer from an earlier term of this broker's, its view stale)
        self._reopen = True
        self._opened = False
        self._compacted: set[tuple[int, int]] = set()
        self._last_expiry = time.monotonic()
        self._backoff = Backoff(first=1.0, cap=30.0, jitter=0.25)
        self.wake = asyncio.Event()  # set: the next wait between passes ends at once
        self.sweeper = table_ops.OrphanSweeper(keeper.settings, keeper._clock)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def run(self) -> None:
        clock = self.keeper._clock
        try:
            while True:
                try:
                    await self.run_once()
                    self.failures, self.last_error = 0, None
                    delay = self.policy.interval_ms / 1000
                except asyncio.CancelledError:
                    raise
                except Fenced as exc:
                    table_commits.labels("append", "fenced").inc()
                    log.warning("%s: table commits stop: %s", self.topic.name, exc)
                    return
                except Exception as exc:  # the catalog or the store is down: wait, then start from the table
                    self.failures += 1
                    self.last_error = exc
                    self._reopen = True
                    delay = self._backoff.delay(self.failures, random.random())
                    table_commits.labels("append", "failed").inc()
                    log.warning(
                        "%s: table commit failed (%d in a row, retry in %.1f s): %s",
                        self.topic.name,
                        self.failures,
                        delay,
                        exc,
                    )
                await table_ops.nap(clock, self.wake, delay)
        finally:
            self.done = True

    async def _call(self, op: str, *args: Any) -> Any:
        """One operation on the topic's table, wherever the keeper runs table work."""
        reopen, self._reopen = self._reopen, False
        return await self.keeper.run(
            self.keeper._spec(),
            table_ident(self.topic.name),
            self._shape,
            self.policy.partition,
            reopen,
            op,
            *args,
        )

    async def run_once(self) -> int:
        """One pass; returns the rows added."""
        topic, wal = self.topic, self.topic.wal
        assert wal is not None
        target = wal.committed_offset  # before the schema: every record up to it has its version listed
        if target == 0:
            return 0  # no table before the first record: a producer binds the topic to its subject first
        # the table worker builds the shape (parsed schemas do not pickle): it gets the versions' records
        self._shape = await self.keeper.schema_of(topic) if self.keeper.schema_of is not None else None
        epoch = topic.claim.epoch
        state = await self._follow_topic(await self._call("state"))
        if not self._opened:
            self._opened = True
            log.info("%s: committing to Iceberg table %s", topic.name, ".".join(table_ident(topic.name)))
        if state.epoch > epoch:
            raise Fenced(f"table of {topic.name} was committed at epoch {state.epoch}, this owner's: {epoch}")
        start_offset = topic.start_offset
        earliest = await self.keeper.storage.earliest(topic.name, wal)
        start = max(state.end, start_offset, earliest)
        added = 0
        max_records = self.keeper.settings.max_commit_records
        while start < target:
            stop = min(target, start + max_records, _next_boundary(wal, start))
            n, end = await self._append(start, stop, epoch)
            if end <= start:
                break  # nothing readable now (the next pass tries again)
            table_commits.labels("append", "ok").inc()
            table_rows.inc(n)
            added += n
            start = end
        self.committed_end = start
        await self._maintain(epoch, start_offset)
        return added

    async def _maintain(self, epoch: int, start_offset: int) -> None:
        files = await self._call("files")
        if files and files[0].first < start_offset:
            await self._call("drop_below", start_offset, epoch)
            table_commits.labels("retention", "ok").inc()
            files = await self._call("files")
        for first, last in self._segment_ranges():
            if (first, last) in self._compacted or last >= self.committed_end:
                continue
            inside = [f for f in files if first <= f.first and f.last <= last]
            if len(inside) >= 2 and await self._call("compact", first, last, epoch):
                table_commits.labels("compact", "ok").inc()
            self._compacted.add((first, last))
        keep = self.keeper.settings.snapshot_keep_seconds
        if time.monotonic() - self._last_expiry >= min(EXPIRE_EVERY_SECONDS, max(1.0, keep)):
            self._last_expiry = time.monotonic()
            gone = await self._call("expire", keep)
            if gone:
                log.info("%s: table snapshots expired, %d data files deleted", self.topic.name, len(gone))
        await self.sweeper.maybe(self._call, str(self.topic.name))

    async def _follow_topic(self, state: Any) -> Any:
        """The table's state, after a table of an earlier topic of this name was renamed out of the way."""
        rev = table_ops.topic_revision(self.keeper.cache, self.topic)
        table = table_ident(self.topic.name)[1]
        if await table_ops.follow_incarnation(self._call, str(self.topic.name), table, rev, state):
            self._reopen = True  # the worker opens (creates) the topic's new table
            state = await self._call("state")
        if rev is not None:
            await self._call("stamp", rev)  # the writer records it in every snapshot it commits
        return state

    async def _append(self, start: int, stop: int, epoch: int) -> tuple[int, int]:
        """Commit offsets start..stop-1 (or a first part of them); returns (rows added, the end reached).
        The table worker reads them from their WAL segment file when one holds them all; else (below the
        WAL, holes, the file gone) this broker reads them and sends them."""
        wal = self.topic.wal
        assert wal is not None
        run = locate(wal, start, stop)
        if run is not None:
            try:
                return await self._call("append_wal", run, epoch), run.end
            except RunUnreadable as exc:
                table_fallbacks.inc()
                log.info("%s: table records read by the broker: %s", self.topic.name, exc)
        records, end = await self._read(start, stop)
        if end <= start:
            return 0, end
        return await self._call("append_packed", *pack(records), start, end, epoch), end

    async def _read(self, start: int, stop: int) -> tuple[list[tuple[int, bytes]], int]:
        """The records of offsets start..stop-1 (holes skipped) and the end they reach: `stop` when read
        through, less when the reader ran dry first."""
        wal = self.topic.wal
        assert wal is not None
        reader = self.keeper.storage.reader(self.topic.name, wal, start)
        records: list[tuple[int, bytes]] = []
        try:
            while reader.next_offset < stop:
                got = await reader.read(min(READ_CHUNK, stop - reader.next_offset), timeout=1.0)
                if not got:
                    break
                records += got if got[-1][0] < stop else [r for r in got if r[0] < stop]
        finally:
            reader.close()
        if reader.next_offset >= stop:
            return records, stop
        return records, (records[-1][0] + 1 if records else start)

    def _segment_ranges(self) -> list[tuple[int, int]]:
        """Ranges whose table files are compacted into one: the exported objects', else closed WAL
        segments'."""
        exporter = self.topic.exporter
        if exporter is not None and exporter.descriptors:
            return [(d.start_offset, d.end_offset) for d in exporter.descriptors]
        wal = self.topic.wal
        assert wal is not None
        firsts = [first for first, _, _ in wal.segments()]
        return [(a, b - 1) for a, b in itertools.pairwise(firsts) if b > a]


def _next_boundary(wal: Any, offset: int) -> int:
    """The first offset of the WAL segment after the one holding `offset` (a large number: none)."""
    for first, _, _ in wal.segments():
        if first > offset:
            return int(first)
    return 1 << 62


__all__ = ["TableKeeper", "TopicCommitter", "policy_of"]
