"""The topics this broker serves: creating them, loading them (storage opened and claimed through the
broker's `Placement`), the per-topic limit, sealing them for a move and forgetting them.

Topics are loaded lazily from the metadata store on first use, so a restarted broker serves every topic it
had, with its WAL recovered and its subscriptions resuming from their persisted cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator

from ister.broker import metrics
from ister.broker.exports import ExportScheduler
from ister.broker.sessions import ProducerSession
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.clock import REAL_CLOCK, Clock
from ister.config import BrokerConfig
from ister.core.lifecycle import Event, State
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ister.ids import PARTITION_MARKER, TopicName, shown
from ister.limits import MAX_NAME_LEN
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.records import NamespacePolicy, ProducerRecord, parse_start
from ister.metadata.store import MetadataStore
from ister.ports.placement import Placement
from ister.storage.topic_storage import SEAL_EXPORT_SECONDS, TopicStorage

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
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.storage = storage
        self.placement = placement
        self.exports = exports
        self._forget_clients = forget_clients
        self._register_producer = register_producer
        self.topics: dict[str, Topic] = {}
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
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception:
                log.exception("closing topic %s failed", topic.name)
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
        topic = await self._load(name)
        self.topics[name.full] = topic
        self._m_topics.set(len(self.topics))
        return topic

    async def _load(self, name: TopicName) -> Topic:
        kv = await self.store.get(keys.topic_delivery(name.full))
        delivery = kv.value if kv is not None and kv.value in (RELIABLE, NON_RELIABLE) else NON_RELIABLE
        policy = await self.namespace_policy(name.namespace)
        configured = policy.max_message_size
        max_size = configured if configured is not None else self.config.policies.max_message_size
        if delivery == RELIABLE:
            wal, claim = await self.placement.open_reliable(name, self.storage)
            topic = Topic(
                name,
                delivery=delivery,
                max_message_size=max_size,
                wal=wal,
                claim=claim,
                space=self.storage.space,
            )
            topic.exporter = self.storage.exporter(name, wal)
            if topic.exporter is not None:
                self.exports.add(topic)
        else:
            claim = await self.placement.claim_volatile(name)
            topic = Topic(name, delivery=delivery, max_message_size=max_size, wal=None, claim=claim)
        try:
            if topic.wal is not None:
                topic.start_offset = parse_start(await self.store.get(keys.start_offset(name)))
            producers = await self.store.list(keys.topic_producers_prefix(name.full))
        except BaseException:
            # Not registered: nobody else would close its WAL or give its claim back.
            self.exports.remove(topic)
            topic.claim.revoke("load failed")
            await topic.close()
            raise
        for p in producers:
            record = ProducerRecord.parse(p.value)
            if record is None:
                log.warning("ignoring malformed producer record %s", p.key)
                continue
            session = ProducerSession(
                record.producer_id, record.producer_name, name.full, record.access_mode, clock=self.clock
            )
            topic.producers[session.id] = session
            self._register_producer(session)
        log.info("loaded topic %s (%s)", name, delivery)
        return topic

    # -- leaving ------------------------------------------------------------------------------------------
    async def unload(self, topic: str, reason: str) -> None:
        """Drop a topic this broker no longer owns: its clients get CLOSE / UNAVAILABLE and look it up again.

        Its cursors are not flushed here: ownership is already gone, the new owner's cursors are the truth.
        """
        loaded = self.forget(topic)
        if loaded is None:
            return
        loaded.lifecycle.handle(Event.FENCE, reason)
        try:
            await loaded.close()
        except Exception:
            log.exception("closing unloaded topic %s failed", topic)
        log.info("unloaded topic %s (%s)", topic, reason)

    def forget(self, topic: str) -> Topic | None:
        loaded = self.topics.pop(topic, None)
        if loaded is None:
            return None
        self._m_topics.set(len(self.topics))
        self.unloaded += 1
        self.exports.remove(loaded)
        self._forget_clients(loaded)
        return loaded

    async def seal(self, topic: str, reason: str) -> None:
        """Graceful release: refuse appends, make every acknowledged record readable by the next owner,
        flush cursors, close (fsync) the WAL, write the sealed state {sealed, last_committed_offset,
        broker_id, timestamp, epoch}, then forget the topic here.

        When moves need the records exported (a cluster) the topic is never handed off before they are
        safe (docs/architecture.md §12): when the tail cannot be exported (no durable tier, the object store
        failing), this raises FailedPrecondition or Unavailable naming the cause and the topic keeps being
        served here.
        """
        loaded = self.topics.get(topic)
        if loaded is None:
            return
        lifecycle = loaded.lifecycle
        lifecycle.handle(Event.SEAL, reason)  # producers get UNAVAILABLE from here on and look it up again
        wal = loaded.wal
        gate = loaded.claim.replication
        if wal is not None and (gate is not None or self.placement.moves_need_export):
            try:
                if gate is not None:
                    # Replicated: a leadership transfer. The next owner is an in-sync replica; it needs
                    # every record on its own copy, not in the durable tier.
                    await gate.hand_over(SEAL_EXPORT_SECONDS)
                else:
                    await self._export_before_seal(loaded)
            except BaseException:
                lifecycle.handle(Event.SEAL_FAILED)
                raise
        # Forget its clients before the streams end: a consumer that reconnects at once must not attach to a
        # subscription that is closing (its stream would never deliver nor end).
        self._forget_clients(loaded)
        claim = loaded.claim
        try:
            await loaded.release()  # cursors flushed while this broker still owns the topic
            await self._export_tail_at_seal(loaded)
            if wal is not None and wal.committed_offset > 0:
                state = {
                    "sealed": True,
                    "last_committed_offset": wal.committed_offset - 1,
                    "broker_id": self.placement.broker_id,
                    "timestamp": int(time.time()),
                    "epoch": claim.epoch,
                }
                await claim.guarded_put(keys.storage_state(topic), state)
                log.info("sealed %s at offset %d (%s)", topic, wal.committed_offset - 1, reason)
            if lifecycle.state is State.SEALING:  # not fenced or closed meanwhile (a lease lost mid-seal)
                lifecycle.handle(Event.SEALED)
        finally:
            self.forget(topic)
            claim.revoke(f"sealed ({reason})")
            lifecycle.handle(Event.CLOSE)

    async def _export_tail_at_seal(self, loaded: Topic) -> None:
        if loaded.exporter is None:
            return
        try:
            async with asyncio.timeout(SEAL_EXPORT_SECONDS):
                await loaded.exporter.export_tail()
        except Exception as exc:
            if self.placement.moves_need_export and loaded.claim.replication is None:
                # Everything was exported just before; the topic reloads here from its WAL.
                raise Unavailable(
                    f"cannot move {loaded.name}: exporting its last records failed ({exc}); "
                    "it is reloaded where it was"
                ) from exc
            # Standalone reloads the same WAL: the export only has to happen some time.
            log.warning("%s: exporting the tail at seal failed: %s", loaded.name, exc)

    async def _export_before_seal(self, loaded: Topic) -> None:
        """Put every acknowledged record of the topic in the durable tier while it is still served here (no
        new offsets meanwhile), or raise (and keep serving) when that is impossible."""
        wal = loaded.wal
        assert wal is not None
        broker = self.placement.broker_id
        exporter = loaded.exporter
        if exporter is None:
            if wal.committed_offset > wal.first_offset:
                raise FailedPrecondition(
                    f"cannot move {loaded.name}: this cluster has no durable tier (storage.durable), so its "
                    f"offsets {wal.first_offset}..{wal.committed_offset - 1} exist only on broker {broker}; "
                    "configure a shared durable tier to move reliable topics. It stays on this broker"
                )
            return
        try:
            await self.storage.export_tail_now(wal, exporter)
        except Exception as exc:
            cause = "timed out" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            log.warning("%s: cannot move it, exporting its tail failed: %s", loaded.name, cause)
            raise Unavailable(
                f"cannot move {loaded.name}: exporting its last records to the durable tier failed "
                f"({cause}); it stays on broker {broker}"
            ) from exc
