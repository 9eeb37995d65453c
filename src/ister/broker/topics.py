"""The topics this broker serves: creating them, loading them (each through its `TopicOwner`, which opens
storage and claims it through the broker's `Placement`), the per-topic limit, sealing them for a move and
forgetting them.

Topics are loaded lazily from the metadata store on first use, so a restarted broker serves every topic it
had, with its WAL recovered and its subscriptions resuming from their persisted cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from functools import partial
from typing import Any

from ister.broker import metrics
from ister.broker.compression_dicts import DictionaryTrainer
from ister.broker.compression_policy import TopicCompressionPolicy
from ister.broker.dedup import TopicDedup, rebuild_from_log
from ister.broker.exports import ExportScheduler
from ister.broker.namespace_limits import check_topic_room
from ister.broker.rate_limits import RateSource
from ister.broker.sessions import ProducerSession
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.broker.topic_owner import TopicOwner
from ister.clock import REAL_CLOCK, Clock
from ister.config import BrokerConfig
from ister.core.lifecycle import TopicLifecycle
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ister.ids import PARTITION_MARKER, TopicName, shown
from ister.limits import MAX_NAME_LEN
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, ProducerRecord, parse_start
from ister.metadata.store import MetadataStore
from ister.ports.claim import TopicClaim
from ister.ports.placement import Placement
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal

log = logging.getLogger(__name__)

DLQ_SUFFIX = "-DLQ"


class TopicRegistry:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        storage: TopicStorage,
        placement: Placement,
        exports: ExportScheduler,
        forget_clients: Callable[[Topic], None],
        register_producer: Callable[[ProducerSession], None],
        clock: Clock = REAL_CLOCK,
        rates: RateSource | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rates = rates  # publish and dispatch rate limits (none: unlimited)
        self.store = store
        self.storage = storage
        self.placement = placement
        self.exports = exports
        self._forget_clients = forget_clients
        self._register_producer = register_producer
        self.topics: dict[str, Topic] = {}
        self._owners: dict[str, TopicOwner[Topic]] = {}  # each served topic's lifecycle owner
        self._m_topics = metrics.topics_loaded.labels(str(placement.broker_id))
        # A lock per topic being loaded (entries live only while someone holds or waits for them, so the
        # map does not grow with every name anyone asks about), and one for creations, which are rare and
        # check names across topics (a partition against its base name).
        self._load_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._create_lock = asyncio.Lock()
        self._creating: set[str] = set()  # topics whose creation was checked and is being written
        self._reserved = 0  # topics being created or loaded (counted against limits.max_topics_per_broker)
        self.unloaded = 0  # topics forgotten so far (broker/heap.py sweeps after many)
        self.closing = False

    async def close(self) -> None:
        self.closing = True
        for name, owner in list(self._owners.items()):
            try:
                await owner.close()
            except Exception:
                log.exception("closing topic %s failed", name)
        self._owners.clear()
        self.topics.clear()
        self._m_topics.set(0)

    # -- lookups ----------------------------------------------------------------------------------------
    async def exists(self, name: TopicName) -> bool:
        return name.full in self.topics or await self.store.get(keys.namespace_topic(name.full)) is not None

    async def namespace_policy(self, namespace: str) -> NamespacePolicy:
        kv = await self.store.get(keys.namespace_policy(namespace))
        if kv is None:
            raise NotFound(f"namespace {shown(namespace)} does not exist")
        return NamespacePolicy.lenient(kv.value)

    async def partitions(self, name: TopicName) -> list[str]:
        if await self.exists(name):
            return [name.full]
        prefix = keys.namespace_topic(name.full) + PARTITION_MARKER
        found: list[tuple[int, str]] = []
        for kv in await self.store.list(prefix):
            index = kv.key[len(prefix) :]
            if index.isdigit():
                found.append((int(index), name.partition_topic(int(index)).full))
        # Unknown topics answer [name] so the following Subscribe reports a clear NOT_FOUND.
        return [n for _, n in sorted(found)] or [name.full]

    async def lookup(self, name: TopicName, here: str) -> tuple[str, bool]:
        """(URL of the broker serving the topic, whether that is this broker at `here`)."""
        if not await self.exists(name):
            raise NotFound(f"topic {name} does not exist")
        url = await self.placement.locate(name)
        return (here, True) if url is None else (url, False)

    # -- creation -----------------------------------------------------------------------------------------
    async def _create(self, name: TopicName, delivery: str, *, internal: bool = False) -> None:
        await self.namespace_policy(name.namespace)
        if len(name.topic) + len(DLQ_SUFFIX) > MAX_NAME_LEN and not (
            internal and name.topic.endswith(DLQ_SUFFIX)
        ):
            # Leave room for the dead-letter topic `<topic>-DLQ`, which must be a valid name too.
            raise InvalidArgument(
                f"topic name {name.topic!r} is too long: at most {MAX_NAME_LEN - 4} characters"
            )
        if not self.config.auto_create_topics:
            raise NotFound(f"topic {name} does not exist and auto_create_topics is off")
        # The checks across names (a partition against its plain base name) run under the creation lock,
        # counting creations still being written; the write itself does not hold it, so creations share
        # metadata commits instead of waiting for each other's.
        async with self._create_lock:
            if await self.store.get(keys.namespace_topic(name.full)) is not None:
                return  # created meanwhile (the admin API)
            await self._check_partition_names(name)
            if not internal:  # a dead-letter topic the broker needs is created whatever the count
                await check_topic_room(self.store, name.namespace)
            self._creating.add(name.full)
        try:
            # If the admin API created it meanwhile, that one stands.
            await catalog.create_topic(self.store, name, delivery)
        finally:
            self._creating.discard(name.full)
        await self.placement.topics_created([name])
        log.info("created topic %s (%s)", name, delivery)

    async def _check_partition_names(self, name: TopicName) -> None:
        part = name.partition
        if part is not None:
            base = TopicName(name.namespace, part[0])
            if base.full in self._creating or (
                await self.store.get(keys.namespace_topic(base.full)) is not None
            ):
                raise FailedPrecondition(f"cannot create partition {name}: a plain topic {base} exists")
        else:
            marker = name.full + PARTITION_MARKER
            if any(t.startswith(marker) for t in self._creating) or await self.store.list(
                keys.namespace_topic(name.full) + PARTITION_MARKER, limit=1
            ):
                raise FailedPrecondition(f"cannot create {name}: it is a partitioned topic")

    # -- loading ------------------------------------------------------------------------------------------
    async def get(self, name: TopicName, *, create_as: str | None = None, internal: bool = False) -> Topic:
        """The loaded topic; loads it from metadata (or creates it when `create_as` is given)."""
        if self.closing:
            raise Unavailable("broker is shutting down")
        topic = self.topics.get(name.full)
        if topic is not None:
            return topic
        async with self.lock(name.full):
            topic = self.topics.get(name.full)
            if topic is not None:
                return topic
            missing = await self.store.get(keys.namespace_topic(name.full)) is None
            if missing and create_as is None:
                raise NotFound(f"topic {name} does not exist")
            if self.placement.serves(name.full):
                # It loads here: over the limit it is refused before anything is written.
                with self._slot(name):
                    if missing:
                        assert create_as is not None
                        await self._create(name, create_as, internal=internal)
                    return await self._load_and_register(name)
            if missing:
                assert create_as is not None
                await self._create(name, create_as, internal=internal)
        # Not (yet) served here: wait for an owner outside the lock, then try again.
        await self.placement.ensure_served_here(name)
        async with self.lock(name.full):
            topic = self.topics.get(name.full)
            if topic is not None:
                return topic
            with self._slot(name):
                return await self._load_and_register(name)

    def check_room(self, count: int, what: str) -> None:
        """Raise ResourceExhausted (before anything is written) when `count` more topics would exceed
        limits.max_topics_per_broker on this broker."""
        limit = self.config.limits.max_topics_per_broker
        held = len(self.topics) + self._reserved
        if limit and held + count > limit:
            raise ResourceExhausted(
                f"cannot {what}: this broker holds {held} topics and limits.max_topics_per_broker is {limit}"
            )

    @contextlib.contextmanager
    def _slot(self, name: TopicName) -> Iterator[None]:
        self.check_room(1, f"create or load topic {name}")
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1

    @contextlib.asynccontextmanager
    async def lock(self, name: str) -> AsyncIterator[None]:
        """Held while the topic is loaded, and by an admin delete while it removes the topic's files."""
        lock, users = self._load_locks.setdefault(name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._load_locks[name]

    async def _load_and_register(self, name: TopicName) -> Topic:
        kv = await self.store.get(keys.topic_delivery(name.full))
        delivery = kv.value if kv is not None and kv.value in (RELIABLE, NON_RELIABLE) else NON_RELIABLE
        policy = await self.namespace_policy(name.namespace)
        configured = policy.max_message_size
        max_size = configured if configured is not None else self.config.policies.max_message_size

        def make(wal: Wal | None, claim: TopicClaim, lifecycle: TopicLifecycle) -> Topic:
            space = self.storage.space if wal is not None else None
            topic = Topic(
                name,
                delivery=delivery,
                max_message_size=max_size,
                wal=wal,
                claim=claim,
                lifecycle=lifecycle,
                space=space,
            )
            if wal is not None:
                topic.exporter = self.storage.exporter(name, wal)
                topic.dedup = TopicDedup(name.full, self.config.idempotence)
            if self.rates is not None:
                topic.limits = self.rates.for_topic(name)
                if wal is not None:
                    trainer = DictionaryTrainer(self.store, name, partial(_spawn_into, topic))
                    topic.compression = TopicCompressionPolicy(self.rates.cache, name, trainer)
            return topic

        owner: TopicOwner[Topic] = TopicOwner(name, self.placement, self.storage, self)
        topic = await owner.load(delivery == RELIABLE, make, self._prepare)
        self._owners[name.full] = owner
        log.info("loaded topic %s (%s)", name, delivery)
        return topic

    async def _prepare(self, topic: Topic) -> None:
        """Read what a loaded topic needs from the metadata: its retention start and its producers."""
        name = topic.name
        if topic.wal is not None:
            topic.start_offset = parse_start(await self.store.get(keys.start_offset(name)))
        if topic.dedup is not None and topic.wal is not None:
            rebuild = rebuild_from_log(topic.dedup, self.storage, name, topic.wal)
            topic.tasks.append(asyncio.create_task(rebuild, name=f"idempotence {name}"))
        for p in await self.store.list(keys.topic_producers_prefix(name.full)):
            record = ProducerRecord.parse(p.value)
            if record is None:
                log.warning("ignoring malformed producer record %s", p.key)
                continue
            session = ProducerSession(
                record.producer_id, record.producer_name, name.full, record.access_mode, clock=self.clock
            )
            topic.producers[session.id] = session

    # -- the owner's host (broker/topic_owner.py) ---------------------------------------------------------
    def register(self, topic: Topic) -> None:
        self.topics[topic.name.full] = topic
        self._m_topics.set(len(self.topics))
        if topic.exporter is not None:
            self.exports.add(topic)
        for session in topic.producers.values():
            self._register_producer(session)

    def forget_clients(self, topic: Topic) -> None:
        self._forget_clients(topic)

    # -- leaving ------------------------------------------------------------------------------------------
    async def unload(self, topic: str, reason: str) -> None:
        """Drop a topic this broker no longer owns: its clients get CLOSE / UNAVAILABLE and look it up again.

        Its cursors are not flushed here: ownership is already gone, the new owner's cursors are the truth.
        """
        owner = self._owners.get(topic)
        if owner is None:
            return
        try:
            await owner.fence(reason)  # forgotten here, then released
            await owner.close()
        except Exception:
            log.exception("closing unloaded topic %s failed", topic)
        log.info("unloaded topic %s (%s)", topic, reason)

    def drop(self, topic: str) -> None:
        """No longer listed as served here (the owner's DROP effect); its clients are let go."""
        self._owners.pop(topic, None)
        loaded = self.topics.pop(topic, None)
        if loaded is None:
            return
        self._m_topics.set(len(self.topics))
        self.unloaded += 1
        self.exports.remove(loaded)
        self._forget_clients(loaded)

    async def seal(self, topic: str, reason: str) -> None:
        """Graceful release: refuse appends, make every acknowledged record readable by the next owner,
        flush cursors, close (fsync) the WAL, write the sealed state {sealed, last_committed_offset,
        broker_id, timestamp, epoch}, then forget the topic here (the SEAL row of core/lifecycle.py's
        table, run by the topic's owner).

        When moves need the records exported (a cluster) the topic is never handed off before they are
        safe (docs/architecture.md §12): when the tail cannot be exported (no durable tier, the object store
        failing), this raises FailedPrecondition or Unavailable naming the cause and the topic keeps being
        served here.
        """
        owner = self._owners.get(topic)
        if owner is not None:
            await owner.seal(reason)


def _spawn_into(topic: Topic, work: Coroutine[Any, Any, None]) -> None:
    """Run `work` as one of the topic's tasks (cancelled when it closes), off its list once done."""
    task = asyncio.create_task(work, name=f"compression dictionary {topic.name}")
    topic.tasks.append(task)
    task.add_done_callback(lambda t: topic.tasks.remove(t) if t in topic.tasks else None)
