"""The broker facade the gRPC servicers call: topics, producers, consumers, offset reads, lookup, health.

It wires the broker's parts (docs/architecture.md): `TopicStorage` (WALs, epoch files, the durable tier),
the broker's `Placement` and the admin API's `PlacementAdmin` (ister.ports: standalone's, or the cluster's,
given by app.py), `TopicRegistry` (creating, loading,
sealing and forgetting topics), `Producers`, `Consumers`, `OffsetReads` and the schema registry with its
payload validator, and delegates to them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from ister.broker.compression_dicts import DictionaryFollower
from ister.broker.consumers import CONSUMER_IDLE_SECONDS, ConsumerRef, Consumers
from ister.broker.cursors import CursorMove, Cursors, Position
from ister.broker.exports import ExportScheduler
from ister.broker.peek import Peeked, Peeker
from ister.broker.producers import Producers
from ister.broker.rate_limits import RateSource
from ister.broker.reads import OffsetReads
from ister.broker.retention import RetentionKeeper, RetentionView
from ister.broker.sessions import ConsumerStream, ProducerSession
from ister.broker.standalone import StandaloneAdmin, StandalonePlacement
from ister.broker.stats_rates import RateKeeper
from ister.broker.tables import SubjectVersions, TableKeeper
from ister.broker.topic import Topic
from ister.broker.topics import TopicRegistry
from ister.clock import REAL_CLOCK, Clock
from ister.config import BrokerConfig
from ister.core.dispatch import SubType
from ister.core.record import StoredMessage
from ister.core.schema import JsonRules
from ister.errors import NotFound
from ister.ids import TopicName, validate_segment
from ister.metadata import keys
from ister.metadata import topic_catalog as catalog
from ister.metadata.store import MetadataStore
from ister.metadata.topic_index import TopicNames
from ister.ports.placement import Placement
from ister.ports.placement_admin import PlacementAdmin
from ister.schema.registry import SchemaRegistry
from ister.schema.validation import PayloadValidator
from ister.storage.objects import ObjectStore
from ister.storage.topic_storage import StoredOffsets, TopicStorage
from ister.storage.wal import WriterPool
from ister.tables.catalog import CatalogSpec, spec_for
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

CONSUMER_REAP_INTERVAL_SECONDS = 30.0
PRODUCER_IDLE_SECONDS = 300.0  # a producer with no stream, send or health check this long is forgotten

__all__ = ["BrokerService", "ConsumerRef", "StoredOffsets"]


class BrokerService:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        data_dir: Path,
        placement: Placement | None = None,
        storage: TopicStorage | None = None,
        placement_admin: PlacementAdmin | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.data_dir = data_dir
        self.broker_url = config.broker_url
        self.storage = storage if storage is not None else TopicStorage(config, store, data_dir)
        # Standalone unless a mode's parts are given (app.py; tests of cluster mode).
        self.placement: Placement = placement if placement is not None else StandalonePlacement(config, store)
        self.placement_admin: PlacementAdmin = (
            placement_admin if placement_admin is not None else StandaloneAdmin(config, store)
        )
        durable = config.storage.durable
        self.exports = ExportScheduler(
            self.storage.retention, durable.export_interval_seconds, durable.segment_max_age_seconds, clock
        )
        # Every namespace policy, topic retention and rate limit, mirrored by watches: retention passes and
        # the rate limits of publishes and dispatch read them without a metadata round trip.
        self.retention_view = RetentionView(store)
        self.dictionaries = DictionaryFollower(self.retention_view.cache)  # into core.zdict.REGISTRY
        # Every topic's name, sorted per namespace, from the same mirror: the admin API's topic listing.
        self.topic_names = TopicNames(self.retention_view.cache)
        self.rate_source = RateSource(
            self.retention_view.cache, clock, config.limits.max_publish_wait_seconds
        )
        self.registry = TopicRegistry(
            config,
            store,
            self.storage,
            self.placement,
            self.exports,
            forget_clients=self._forget_clients,
            register_producer=self._register_producer,
            clock=clock,
            rates=self.rate_source,
        )
        self.producer_sessions = Producers(store, self.registry, self.placement, clock)
        self.consumer_refs = Consumers(config, store, self.storage, self.registry, self.broker_url, clock)
        self.reads = OffsetReads(self.registry, self.storage)
        self.retention = RetentionKeeper(
            self.retention_view,
            self.storage,
            lambda: self.registry.topics.values(),
            config.storage.retention.check_interval_seconds,
            clock=clock,
            hold_seconds=config.storage.retention.producer_hold_seconds,
            move=lambda topic, sub, offset: self.cursors.seek(
                topic, sub, Position("offset", offset), create=False
            ),
            trimmed=lambda topic: self.tables.wake(topic),  # the table leaves with the records
        )
        self.tables = TableKeeper(
            self.retention_view.cache,
            self.storage,
            lambda: self.registry.topics.values(),
            lambda: self.table_catalog,
            config.tables,
            clock,
            schema_of=SubjectVersions(lambda: self.schemas),
        )
        self.schemas = SchemaRegistry(
            store, self.topic_exists, json_rules=JsonRules(config.schema.json_compatibility)
        )
        self.validator = PayloadValidator(self.schemas)
        self.cursors = Cursors(self.consumer_refs, self.storage)
        self.peeker = Peeker(self.reads, self.cursors, self.schemas)
        self.rates = RateKeeper(lambda: self.registry.topics.values())  # the admin API's stats
        self._tasks = TaskSupervisor("broker service")  # the session reaper, the topic name index
        self.placement.bind(self)

    # -- views tests, the admin API and the heap keeper read ---------------------------------------------
    @property
    def topics(self) -> dict[str, Topic]:
        return self.registry.topics

    @property
    def producers(self) -> dict[int, ProducerSession]:
        return self.producer_sessions.sessions

    @property
    def consumers(self) -> dict[int, ConsumerRef]:
        return self.consumer_refs.refs

    @property
    def topics_unloaded(self) -> int:
        return self.registry.unloaded

    @property
    def long_lived_growth(self) -> int:
        """Topics loaded now plus segment pieces exported so far: what leaves long-lived objects behind
        (broker/heap.py freezes them out of the garbage collector's walks)."""
        return len(self.registry.topics) + self.exports.exported

    @property
    def table_catalog(self) -> CatalogSpec:
        """The Iceberg catalog topics' tables go to (docs/tables.md)."""
        return spec_for(self.config, self.data_dir)

    @property
    def objects(self) -> ObjectStore | None:
        return self.storage.objects

    @property
    def writers(self) -> WriterPool:
        return self.storage.writers

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.storage.start()
        await self.store.put(keys.cluster_name(self.config.cluster_name), None)
        policy = {
            name: getattr(self.config.policies, name) for name in self.config.policies.__struct_fields__
        }
        for ns in self.config.bootstrap_namespaces:
            validate_segment(ns, "namespace")
            await catalog.create_namespace(self.store, ns, policy)  # unless it exists
        self._tasks.spawn(self._reap_loop(), "session-reaper")
        await self.schemas.start()
        await self.retention_view.start()
        self.dictionaries.sync()  # every stored dictionary before any topic loads (its records need them)
        self._tasks.spawn(self.dictionaries.follow(), "compression-dictionaries")
        self._tasks.spawn(self.topic_names.follow(), "topic-name-index")
        self.retention.start()
        self.tables.start()
        self.rates.start()

    async def close(self) -> None:
        """Graceful shutdown: stop accepting work, flush cursors, close every WAL."""
        await self._tasks.close()
        await self.rates.close()
        await self.schemas.close()
        await self.tables.close()
        await self.retention.close()
        await self.retention_view.close()
        await self.registry.close()
        await self.consumer_refs.partition_groups.close()
        await self.exports.close()
        await self.storage.close()

    # -- topics (the placement's TopicHost too) ------------------------------------------------------------
    async def topic_exists(self, name: TopicName) -> bool:
        return await self.registry.exists(name)

    async def get_topic(
        self, name: TopicName, *, create_as: str | None = None, internal: bool = False
    ) -> Topic:
        return await self.registry.get(name, create_as=create_as, internal=internal)

    def check_topic_room(self, count: int, what: str) -> None:
        self.registry.check_room(count, what)

    def topic_lock(self, name: str) -> AbstractAsyncContextManager[None]:
        return self.registry.lock(name)

    async def load_assigned(self, topic: str) -> None:
        """The placement saw an assignment to this broker: load the topic now."""
        await self.registry.get(TopicName.parse(topic))

    def loaded_topics(self) -> list[str]:
        return list(self.topics)

    def is_loaded(self, topic: str) -> bool:
        return topic in self.topics

    def load_snapshot(self) -> Iterator[tuple[str, Topic, int]]:
        """(name, topic, backlog) of every loaded topic, for the cluster load report."""
        return ((name, topic, topic.backlog()) for name, topic in list(self.topics.items()))

    async def unload(self, topic: str, reason: str) -> None:
        await self.registry.unload(topic, reason)

    async def seal(self, topic: str, reason: str) -> None:
        await self.registry.seal(topic, reason)

    async def request_unload(self, name: TopicName) -> None:
        """Admin unload: standalone seals the topic here (it reloads from the sealed state on next use);
        cluster mode hands it to another broker and waits for the owner's answer."""
        if not await self.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        await self.placement.request_unload(name)

    async def partitions(self, name: TopicName) -> list[str]:
        return await self.registry.partitions(name)

    async def lookup(self, name: TopicName) -> tuple[str, bool]:
        """(URL of the broker serving the topic, whether that is this broker)."""
        return await self.registry.lookup(name, self.broker_url)

    def _forget_clients(self, loaded: Topic) -> None:
        self.producer_sessions.forget(loaded)
        self.consumer_refs.forget(loaded)

    def _register_producer(self, session: ProducerSession) -> None:
        self.producer_sessions.register(session)

    # -- offset reads -------------------------------------------------------------------------------------
    async def stored_offsets(self, topic_name: str) -> StoredOffsets:
        return await self.reads.stored_offsets(topic_name)

    def read_range(
        self, topic_name: str, start: int, end: int, max_records: int, max_bytes: int
    ) -> AsyncGenerator[list[tuple[int, bytes]], None]:
        return self.reads.read_range(topic_name, start, end, max_records, max_bytes)

    # -- producers ----------------------------------------------------------------------------------------
    async def create_producer(
        self, topic_name: str, producer_name: str, reliable: bool, access_mode: int
    ) -> int:
        return await self.producer_sessions.create(topic_name, producer_name, reliable, access_mode)

    async def producer_session(
        self, topic_name: str, producer_name: str, *, reliable: bool
    ) -> ProducerSession:
        """Create (or find, by name) a producer and return its session: the batch API's open step."""
        producer_id = await self.create_producer(topic_name, producer_name, reliable, access_mode=0)
        return self.producers[producer_id]

    async def producer(self, producer_id: int, topic_name: str) -> ProducerSession:
        return await self.producer_sessions.find(producer_id, topic_name)

    async def send(self, session: ProducerSession, message: StoredMessage) -> int:
        return await self.producer_sessions.send(session, message)

    # -- consumers ----------------------------------------------------------------------------------------
    async def subscribe(
        self,
        topic_name: str,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        key_filters: list[str],
        earliest: bool = False,
    ) -> int:
        return await self.consumer_refs.subscribe(
            topic_name, subscription, consumer_name, sub_type, key_filters, earliest
        )

    async def consumer(self, consumer_id: int) -> ConsumerRef:
        return await self.consumer_refs.find(consumer_id)

    async def open_stream(self, consumer_id: int) -> tuple[ConsumerRef, ConsumerStream]:
        return await self.consumer_refs.open_stream(consumer_id)

    def close_stream(self, ref: ConsumerRef, stream: ConsumerStream) -> None:
        ref.subscription.detach(ref.session, stream)

    async def ack(self, topic_name: str, subscription: str, offset: int) -> None:
        sub = await self.consumer_refs.subscription_for(topic_name, subscription)
        if sub is not None:
            await sub.ack(offset)

    async def nack(
        self, topic_name: str, subscription: str, offset: int, delay_ms: int | None, reason: str | None
    ) -> None:
        sub = await self.consumer_refs.subscription_for(topic_name, subscription)
        if sub is not None:
            await sub.nack(offset, delay_ms, reason)

    async def close_idle_subscription(self, topic: Topic, subscription: str) -> None:
        await self.consumer_refs.close_idle_subscription(topic, subscription)

    async def seek_cursor(
        self, topic_name: str, subscription: str, position: Position, *, create: bool, dry_run: bool = False
    ) -> CursorMove:
        """Move a subscription of a reliable topic served here, consumers attached or not (cursors.py)."""
        topic = await self.reads.reliable_topic(topic_name)
        return await self.cursors.seek(topic, subscription, position, create=create, dry_run=dry_run)

    async def peek(self, topic_name: str, start: Position | None, count: int) -> list[Peeked]:
        return await self.peeker.peek(topic_name, start, count)

    async def set_cursor(self, topic_name: str, subscription: str, next_offset: int) -> int:
        topic = await self.reads.reliable_topic(topic_name)
        return await self.consumer_refs.set_cursor(topic, subscription, next_offset)

    async def _reap_loop(self) -> None:
        while True:
            await self.clock.sleep(CONSUMER_REAP_INTERVAL_SECONDS)
            try:
                await self.reap_consumers(self.clock.monotonic() - CONSUMER_IDLE_SECONDS)
            except Exception:
                log.exception("consumer reaper failed")
            try:
                await self.reap_producers(self.clock.monotonic() - PRODUCER_IDLE_SECONDS)
            except Exception:
                log.exception("producer reaper failed")

    async def reap_consumers(self, seen_before: float) -> int:
        return await self.consumer_refs.reap(seen_before)

    async def reap_producers(self, seen_before: float) -> int:
        return await self.producer_sessions.reap(seen_before)

    # -- health ---------------------------------------------------------------------------------------------
    def end_streams(self) -> None:
        """End every consumer stream (first step of shutdown, so gRPC's grace period is not waited out)."""
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                sub.end_streams()

    def producer_alive(self, producer_id: int) -> bool:
        session = self.producers.get(producer_id)
        if session is None or self.registry.closing:
            return False
        session.touch()
        return True

    def consumer_alive(self, consumer_id: int) -> bool:
        ref = self.consumers.get(consumer_id)
        if ref is None or self.registry.closing:
            return False
        ref.session.touch()
        return True
