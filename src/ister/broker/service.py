"""The broker facade the gRPC servicers call: topics, producers, consumers, lookup and health.

Topics are loaded lazily from the metadata store on first use, so a restarted broker serves every topic it
had, with its WAL recovered and its subscriptions resuming from their persisted cursors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ister.broker import metrics, superseded
from ister.broker.exports import ExportScheduler
from ister.broker.nonreliable import NonReliableSubscription
from ister.broker.reliable import ReliableSubscription
from ister.broker.sessions import ConsumerSession, ConsumerStream, ProducerSession
from ister.broker.subscription import Subscription
from ister.broker.topic import NON_RELIABLE, RELIABLE, Topic
from ister.config import BrokerConfig
from ister.core.cluster.ownership import OwnerRecord, plan_load
from ister.core.dispatch import DeadLetter, FailurePolicy, SubType
from ister.core.dispatch.selector import MAX_KEY_FILTERS
from ister.core.record import StoredMessage, repair_for_wire
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ister.ids import (
    PARTITION_MARKER,
    TopicName,
    new_id,
    shown,
    validate_client_name,
    validate_segment,
)
from ister.limits import (
    MAX_NAME_LEN,
    MAX_READ_OFFSET,
    NON_RELIABLE_CONSUMER_BUFFER,
    RELIABLE_CONSUMER_BUFFER,
)
from ister.metadata import keys
from ister.metadata.store import Compare, MetadataStore, Put
from ister.storage.objects import (
    LocalRetention,
    ObjectStore,
    SegmentExporter,
    TieredReader,
    open_store,
    topic_object_prefix,
)
from ister.storage.objects.catalog import first_descriptor
from ister.storage.wal import Wal, WalConfig, WalReader, WriterPool, hold_root

if TYPE_CHECKING:
    from ister.cluster.guard import OwnershipGuard
    from ister.cluster.node import ClusterNode

log = logging.getLogger(__name__)

SEAL_EXPORT_SECONDS = 30.0  # bound on exporting the WAL tail while sealing
UNLOAD_WAIT_SECONDS = 2 * SEAL_EXPORT_SECONDS + 5.0  # admin unload: the owner's answer (two export bounds)
SUPERSEDED_FIRST_SWEEP_SECONDS = 2.0  # after start: the cluster view is loaded by then
SUPERSEDED_SWEEP_SECONDS = 10.0  # a topic this broker lost (paused, fenced) is given back this soon after
SUPERSEDED_RETRY_SECONDS = 10.0  # while an archive could not be exported yet
ASSIGNMENT_WAIT_SECONDS = 3.0  # how long a call for an unassigned topic waits for the leader
# Index of consumer ids so a consumer survives a broker restart (an Ister addition, see docs/metadata.md).
CONSUMER_INDEX = "/ister/consumers/"
DLQ_SUFFIX = "-DLQ"
# Consumers with no stream and no health check for this long are forgotten (there is no unsubscribe RPC).
CONSUMER_IDLE_SECONDS = 300.0
CONSUMER_REAP_INTERVAL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class StoredOffsets:
    """What a reliable topic stores: offsets earliest .. next-1 (some may be missing after a failover
    without seal), and where its durable objects are (durable_url None: this broker has no durable tier)."""

    earliest: int
    next: int
    durable_url: str | None
    object_prefix: str


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    session: ConsumerSession
    subscription: Subscription


class BrokerService:
    def __init__(
        self, config: BrokerConfig, store: MetadataStore, data_dir: Path, cluster: ClusterNode | None = None
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.store = store
        self.data_dir = data_dir
        self.broker_url = config.broker_url
        self.topics: dict[str, Topic] = {}
        self.producers: dict[int, ProducerSession] = {}
        self.consumers: dict[int, ConsumerRef] = {}
        self._m_topics = metrics.topics_loaded.labels(str(cluster.broker_id if cluster is not None else 0))
        # A lock per topic being loaded (entries live only while someone holds or waits for them, so the
        # map does not grow with every name anyone asks about), and one for creations, which are rare and
        # check names across topics (a partition against its base name).
        self._load_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._create_lock = asyncio.Lock()
        self._creating: set[str] = set()  # topics whose creation was checked and is being written
        self._reserved = 0  # topics being created or loaded (counted against limits.max_topics_per_broker)
        self.topics_unloaded = 0  # topics forgotten so far (broker/heap.py sweeps after many)
        self._started_at = time.monotonic()
        self._closing = False
        self._reaper: asyncio.Task[None] | None = None
        self._superseded_task: asyncio.Task[None] | None = None
        self._superseded_wakeup = asyncio.Event()
        w = config.wal
        durable = config.storage.durable
        url = config.durable_url(data_dir)
        # The durable tier: closed WAL segments go to objects; readers below the WAL read them back.
        self.objects: ObjectStore | None = open_store(url, durable.options) if url is not None else None
        self._wal_config = WalConfig(
            fsync=w.fsync,
            fsync_interval_ms=w.fsync_interval_ms,
            segment_max_bytes=w.segment_max_bytes,
            segment_max_age_s=durable.segment_max_age_seconds if self.objects is not None else 0.0,
            cache_max_bytes=w.cache_max_bytes,
        )
        self._retention = LocalRetention(
            keep_bytes=durable.local_retention_bytes, keep_seconds=durable.local_retention_seconds
        )
        self.exports = ExportScheduler(
            self._retention, durable.export_interval_seconds, durable.segment_max_age_seconds
        )
        # Every WAL of this broker is written by one pool of threads, and one flock on <data_dir>/wal keeps
        # other processes out of all of them (a thread and two descriptors per topic would not scale).
        self.writers = WriterPool(
            w.writer_threads, idle_close_s=w.idle_close_seconds, max_open_files=w.max_open_segments
        )
        self.wal_root = data_dir / "wal"
        self._release_wal_root: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        # Refused (StorageError) while another process uses this data directory's WALs.
        self._release_wal_root = await asyncio.to_thread(hold_root, self.wal_root)
        await self.store.put(keys.cluster_name(self.config.cluster_name), None)
        policy = {
            name: getattr(self.config.policies, name) for name in self.config.policies.__struct_fields__
        }
        for ns in self.config.bootstrap_namespaces:
            validate_segment(ns, "namespace")
            if await self.store.get(keys.namespace_policy(ns)) is None:
                await self.store.put(keys.namespace_policy(ns), policy)
        self._reaper = asyncio.create_task(self._reap_loop(), name="consumer-reaper")
        if self.cluster is not None:
            self._superseded_task = asyncio.create_task(self._superseded_loop(), name="superseded-wals")
        if self.cluster is not None and self.objects is None:
            log.warning(
                "cluster mode without a durable tier (storage.durable): a reliable topic's records live only "
                "on its owner's disk. Moves of reliable topics that hold records are refused (unload, drain "
                "and rebalancing leave them where they are), and after a broker dies its unexported records "
                "are unreadable until it returns. Configure a shared object store to move topics freely."
            )

    async def close(self) -> None:
        """Graceful shutdown: stop accepting work, flush cursors, close every WAL."""
        self._closing = True
        for task in (self._reaper, self._superseded_task):
            if task is not None:
                task.cancel()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception:
                log.exception("closing topic %s failed", topic.name)
        self.topics.clear()
        self._m_topics.set(0)
        await self.exports.close()
        if not await asyncio.to_thread(self.writers.close):
            log.error("WAL writer threads did not stop in time")
        if self._release_wal_root is not None:
            self._release_wal_root()
            self._release_wal_root = None

    # -- topics --------------------------------------------------------------------------------------------
    async def topic_exists(self, name: TopicName) -> bool:
        return name.full in self.topics or await self.store.get(keys.namespace_topic(name.full)) is not None

    async def _namespace_policy(self, namespace: str) -> dict[str, Any]:
        kv = await self.store.get(keys.namespace_policy(namespace))
        if kv is None:
            raise NotFound(f"namespace {shown(namespace)} does not exist")
        return kv.value if isinstance(kv.value, dict) else {}

    async def _create_topic(self, name: TopicName, delivery: str, *, internal: bool = False) -> None:
        await self._namespace_policy(name.namespace)
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
            self._creating.add(name.full)
        try:
            # One transaction (one metadata commit); if the admin API created it meanwhile, that one stands.
            await self.store.txn(
                [Compare(keys.namespace_topic(name.full), None)],
                [
                    Put(keys.topic_root(name.full), 0),
                    Put(keys.topic_delivery(name.full), delivery),
                    Put(keys.namespace_topic(name.full), None),
                ],
            )
        finally:
            self._creating.discard(name.full)
        if self.cluster is not None:
            await self.cluster.request_assignment(name.full)
        log.info("created topic %s (%s)", name, delivery)

    async def get_topic(
        self, name: TopicName, *, create_as: str | None = None, internal: bool = False
    ) -> Topic:
        """The loaded topic; loads it from metadata (or creates it when `create_as` is given)."""
        if self._closing:
            raise Unavailable("broker is shutting down")
        topic = self.topics.get(name.full)
        if topic is not None:
            return topic
        async with self.topic_lock(name.full):
            topic = self.topics.get(name.full)
            if topic is not None:
                return topic
            if self.cluster is None:
                # Standalone: the topic loads here; over the limit it is refused before anything is written.
                missing = await self.store.get(keys.namespace_topic(name.full)) is None
                if missing and create_as is None:
                    raise NotFound(f"topic {name} does not exist")
                with self._topic_slot(name):
                    if missing:
                        assert create_as is not None
                        await self._create_topic(name, create_as, internal=internal)
                    return await self._load_and_register(name, reserved=True)
            if await self.store.get(keys.namespace_topic(name.full)) is None:
                if create_as is None:
                    raise NotFound(f"topic {name} does not exist")
                await self._create_topic(name, create_as, internal=internal)
            if self.cluster.assigned_here(name.full):
                return await self._load_and_register(name)
        # Cluster mode, not (yet) assigned here: wait for the leader outside the lock, then try again.
        await self._check_served_here(name)
        async with self.topic_lock(name.full):
            topic = self.topics.get(name.full)
            if topic is not None:
                return topic
            return await self._load_and_register(name)

    def check_topic_room(self, count: int, what: str) -> None:
        """Raise ResourceExhausted (before anything is written) when `count` more topics would exceed
        limits.max_topics_per_broker on this broker."""
        limit = self.config.limits.max_topics_per_broker
        held = len(self.topics) + self._reserved
        if limit and held + count > limit:
            raise ResourceExhausted(
                f"cannot {what}: this broker holds {held} topics and limits.max_topics_per_broker is {limit}"
            )

    @contextlib.contextmanager
    def _topic_slot(self, name: TopicName) -> Iterator[None]:
        self.check_topic_room(1, f"create or load topic {name}")
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1

    @contextlib.asynccontextmanager
    async def topic_lock(self, name: str) -> AsyncIterator[None]:
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

    async def _load_and_register(self, name: TopicName, *, reserved: bool = False) -> Topic:
        if reserved:
            topic = await self._load_topic(name)
        else:
            with self._topic_slot(name):
                topic = await self._load_topic(name)
        self.topics[name.full] = topic
        self._m_topics.set(len(self.topics))
        return topic

    async def _check_served_here(self, name: TopicName) -> None:
        """Cluster mode: only the broker the leader assigned a topic to loads it; others send clients away."""
        cluster = self.cluster
        assert cluster is not None
        if cluster.assigned_here(name.full):
            return
        owner = cluster.owner_of(name.full)
        if owner is None:
            await cluster.request_assignment(name.full)
            # Wait briefly for the leader, so the usual case needs no client retry.
            owner = await cluster.wait_owner(name.full, ASSIGNMENT_WAIT_SECONDS)
        if owner == cluster.broker_id:
            return
        where = f"served by broker {owner}" if owner is not None else "waiting for an owner"
        raise Unavailable(f"topic {name} is {where}; redo the lookup")

    async def load_assigned(self, topic: str) -> None:
        """The cluster watcher saw an assignment to this broker: load the topic now."""
        await self.get_topic(TopicName.parse(topic))

    def loaded_topics(self) -> list[str]:
        return list(self.topics)

    def is_loaded(self, topic: str) -> bool:
        return topic in self.topics

    def load_snapshot(self) -> list[tuple[str, Topic, int]]:
        """(name, topic, backlog) of every loaded topic, for the cluster load report."""
        out = []
        for name, topic in self.topics.items():
            out.append((name, topic, topic.backlog()))
        return out

    async def unload(self, topic: str, reason: str) -> None:
        """Drop a topic this broker no longer owns: its clients get CLOSE / UNAVAILABLE and look it up again.

        Its cursors are not flushed here: ownership is already gone, the new owner's cursors are the truth.
        """
        loaded = self._forget_topic(topic)
        if loaded is None:
            return
        try:
            await loaded.close()
        except Exception:
            log.exception("closing unloaded topic %s failed", topic)
        log.info("unloaded topic %s (%s)", topic, reason)

    def _forget_topic(self, topic: str) -> Topic | None:
        loaded = self.topics.pop(topic, None)
        if loaded is None:
            return None
        self._m_topics.set(len(self.topics))
        self.topics_unloaded += 1
        self.exports.remove(loaded)
        self._forget_clients(loaded)
        return loaded

    def _forget_clients(self, loaded: Topic) -> None:
        """Its clients are no longer served here: their calls get UNAVAILABLE, health checks CLOSE."""
        for pid in list(loaded.producers):
            self.producers.pop(pid, None)
        for cid, ref in list(self.consumers.items()):
            if ref.session.topic == loaded.name.full:
                del self.consumers[cid]

    async def request_unload(self, name: TopicName) -> None:
        """Admin unload: standalone seals the topic here (it reloads from the sealed state on next use);
        cluster mode hands it to another broker through the unload marker (seed 000 steps 1-5)."""
        if not await self.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        if self.cluster is None:
            await self.seal(name.full, "admin unload")
        else:
            # Waits for the owner's seal, so the caller hears when the move cannot happen and why.
            await self.cluster.request_unload(name.full, wait_seconds=UNLOAD_WAIT_SECONDS)

    async def seal(self, topic: str, reason: str) -> None:
        """Graceful release: refuse appends, make every acknowledged record readable by the next owner,
        flush cursors, close (fsync) the WAL, write the sealed state {sealed, last_committed_offset,
        broker_id, timestamp, epoch}, then forget the topic here.

        Cluster mode never hands a topic off before its records are safe (DESIGN §2, invariant 8): when the
        tail cannot be exported (no durable tier, the object store failing), this raises FailedPrecondition
        or Unavailable naming the cause and the topic keeps being served here.
        """
        loaded = self.topics.get(topic)
        if loaded is None:
            return
        wal = loaded.wal
        if wal is not None and self.cluster is not None:
            await self._export_before_seal(loaded, wal)
        loaded.closing = True  # producers get UNAVAILABLE from here on and look the topic up again
        # Forget its clients before the streams end: a consumer that reconnects at once must not attach to a
        # subscription that is closing (its stream would never deliver nor end).
        self._forget_clients(loaded)
        guard = loaded.guard
        try:
            await loaded.close()  # cursors flushed while this broker still owns the topic
            if loaded.exporter is not None:
                try:
                    async with asyncio.timeout(SEAL_EXPORT_SECONDS):
                        await loaded.exporter.export_tail()
                except Exception as exc:
                    if self.cluster is not None:
                        # Everything was exported just before; the topic reloads here from its WAL.
                        raise Unavailable(
                            f"cannot move {topic}: exporting its last records failed ({exc}); "
                            "it is reloaded where it was"
                        ) from exc
                    # Standalone reloads the same WAL: the export only has to happen some time.
                    log.warning("%s: exporting the tail at seal failed: %s", topic, exc)
            if wal is not None and wal.committed_offset > 0:
                state = {
                    "sealed": True,
                    "last_committed_offset": wal.committed_offset - 1,
                    "broker_id": self.cluster.broker_id if self.cluster is not None else 0,
                    "timestamp": int(time.time()),
                    "epoch": guard.epoch if guard is not None else 0,
                }
                if guard is not None:
                    await guard.guarded_put(keys.storage_state(topic), state)
                else:
                    await self.store.put(keys.storage_state(topic), state)
                log.info("sealed %s at offset %d (%s)", topic, wal.committed_offset - 1, reason)
        finally:
            self._forget_topic(topic)
            if guard is not None:
                guard.revoke(f"sealed ({reason})")

    async def _export_before_seal(self, loaded: Topic, wal: Wal) -> None:
        """Cluster mode: put every acknowledged record of the topic in the durable tier while it is still
        served here, or raise (and keep serving) when that is impossible."""
        assert self.cluster is not None
        broker = self.cluster.broker_id
        exporter = loaded.exporter
        if exporter is None:
            if wal.committed_offset > wal.first_offset:
                raise FailedPrecondition(
                    f"cannot move {loaded.name}: this cluster has no durable tier (storage.durable), so its "
                    f"offsets {wal.first_offset}..{wal.committed_offset - 1} exist only on broker {broker}; "
                    "configure a shared durable tier to move reliable topics. It stays on this broker"
                )
            return
        loaded.closing = True  # no new offsets while the tail goes out
        try:
            async with asyncio.timeout(SEAL_EXPORT_SECONDS):
                await wal.rotate()  # waits for in-flight appends; the tail is then a closed segment
                await exporter.export_closed()
        except Exception as exc:
            loaded.closing = False
            cause = "timed out" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            log.warning("%s: cannot move it, exporting its tail failed: %s", loaded.name, cause)
            raise Unavailable(
                f"cannot move {loaded.name}: exporting its last records to the durable tier failed "
                f"({cause}); it stays on broker {broker}"
            ) from exc

    async def _wal(self, wal_dir: Path, start_offset: int = 0) -> Wal:
        return await Wal.open(
            wal_dir, self._wal_config, start_offset=start_offset, pool=self.writers, lock_root=self.wal_root
        )

    async def _open_wal(self, name: TopicName) -> tuple[Wal, OwnershipGuard | None]:
        """The topic's WAL; in cluster mode also the ownership claim that decides where its offsets start."""
        wal_dir = self.data_dir / "wal" / name.namespace / name.topic
        sealed = await self.store.get(keys.storage_state(name.full))
        sealed_next = sealed_offset(sealed.value) if sealed is not None else None
        if self.cluster is None:
            standalone = await self._wal(wal_dir, start_offset=sealed_next or 0)
            if sealed is not None:
                await self.store.compare_and_delete(sealed.key, expected_version=sealed.version)
            return standalone, None
        cluster = self.cluster
        record, versions = await cluster.read_owner(name.full, fresh=True)  # decides where offsets start
        epoch_file = self.data_dir / "owners" / name.namespace / f"{name.topic}.epoch"
        local_epoch = read_epoch(epoch_file)
        wal = await self._wal(wal_dir) if local_epoch is not None else None
        if sealed is not None and (
            not isinstance(sealed.value, dict) or sealed.value.get("epoch") != record.loaded_epoch
        ):
            sealed_next = None  # not written by the last owner: it cannot vouch for where offsets stopped
        epoch_written = False
        plan = plan_load(
            record,
            local_epoch,
            wal.next_offset if wal is not None else None,
            sealed_next,
            self.config.cluster.offset_reservation,
        )
        try:
            if wal is not None and not plan.keep_local:
                await wal.close()
                wal = None
            if wal is None:
                if await asyncio.to_thread(superseded.archive, self.data_dir, wal_dir, name, local_epoch):
                    self._superseded_wakeup.set()  # export what only that WAL holds, then delete it
                wal = await self._wal(wal_dir, start_offset=plan.start_offset)
            elif plan.start_offset > wal.next_offset:
                await wal.close()
                wal = await self._wal(wal_dir, start_offset=plan.start_offset)
            # Written before the claim: a crash in between leaves a WAL that is treated as stale (safe: it is
            # then exported as superseded).
            write_epoch(epoch_file, record.epoch)
            epoch_written = True
            guard = await cluster.commit_claim(name.full, versions, plan.record)
        except BaseException:
            if wal is not None:
                await wal.close()
            if epoch_written and plan.keep_local and local_epoch is not None:
                # The claim did not land: this WAL is still the one `loaded_epoch` names. Without this it
                # would look superseded at the next load although it holds the newest records.
                write_epoch(epoch_file, local_epoch)
            raise
        guard.bind(wal)
        if sealed is not None:
            await self.store.compare_and_delete(sealed.key, expected_version=sealed.version)
        log.info(
            "claimed %s at epoch %d: offsets from %d (%s), reserved below %d",
            name,
            record.epoch,
            wal.next_offset,
            "local WAL continued" if plan.keep_local else "new WAL",
            plan.record.reserved_until,
        )
        return wal, guard

    # -- superseded WALs (cluster mode) ---------------------------------------------------------------------
    async def _superseded_loop(self) -> None:
        """Give back what only this broker holds: at start, when a load archived a WAL, and periodically."""
        delay = SUPERSEDED_FIRST_SWEEP_SECONDS
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._superseded_wakeup.wait()
            self._superseded_wakeup.clear()
            try:
                pending = await self.sweep_superseded()
            except Exception as exc:  # the store or etcd is down: the files stay, the next sweep retries
                log.warning("superseded WALs: sweep failed (%s); retrying", exc)
                pending = 1
            delay = SUPERSEDED_RETRY_SECONDS if pending else SUPERSEDED_SWEEP_SECONDS

    async def sweep_superseded(self) -> int:
        """Archive local WALs of topics another broker has loaded since, export archived WALs into the
        durable tier and delete them once every record is there. Returns how many archives remain."""
        cluster = self.cluster
        assert cluster is not None
        for name, epoch_file, local_epoch in await asyncio.to_thread(_local_epochs, self.data_dir):
            if name.full in self.topics or cluster.assigned_here(name.full):
                continue
            exists = await self.store.get(keys.namespace_topic(name.full)) is not None
            kv = await self.store.get(keys.owner(name.full))
            record = OwnerRecord.parse(kv.value) if kv is not None else None
            if exists and (record is None or record.loaded_epoch == local_epoch):
                continue  # nobody loaded it since: this WAL is still the newest copy (it may come back here)
            async with self.topic_lock(name.full):
                if name.full in self.topics:
                    continue
                wal_dir = self.data_dir / "wal" / name.namespace / name.topic
                await asyncio.to_thread(superseded.archive, self.data_dir, wal_dir, name, local_epoch)
                await asyncio.to_thread(epoch_file.unlink, True)
        remaining = 0
        for item in await asyncio.to_thread(superseded.archived, self.data_dir):
            if not await self._give_back(item):
                remaining += 1
        return remaining

    async def _give_back(self, item: superseded.Archived) -> bool:
        """Export one archived WAL and delete it (True), or keep it for now (False)."""
        if await self.store.get(keys.namespace_topic(item.topic.full)) is None:
            log.warning("%s was deleted: removing its superseded WAL %s", item.topic, item.path)
            await asyncio.to_thread(superseded.remove, item.path)
            return True
        if self.objects is None:
            keep = self.config.cluster.superseded_wal_retention_seconds
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
                item, self.objects, self.store, self._wal_config, self.writers
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

    async def _claim_without_wal(self, name: TopicName) -> OwnershipGuard:
        """A non-reliable topic's claim: from the cached owner record first (two fewer round trips per
        load), from the store when the cached one was stale."""
        cluster = self.cluster
        assert cluster is not None
        for fresh in (False, True):
            record, versions = await cluster.read_owner(name.full, fresh=fresh)
            plan = plan_load(record, None, None, None, self.config.cluster.offset_reservation)
            try:
                return await cluster.commit_claim(name.full, versions, plan.record)
            except Unavailable:
                if fresh:
                    raise
        raise AssertionError("unreachable")

    async def _load_topic(self, name: TopicName) -> Topic:
        kv = await self.store.get(keys.topic_delivery(name.full))
        delivery = kv.value if kv is not None and kv.value in (RELIABLE, NON_RELIABLE) else NON_RELIABLE
        policy = await self._namespace_policy(name.namespace)
        max_size = int(policy.get("max_message_size", self.config.policies.max_message_size) or 0)
        wal = None
        guard = None
        if delivery == RELIABLE:
            wal, guard = await self._open_wal(name)
        elif self.cluster is not None:
            guard = await self._claim_without_wal(name)
        topic = Topic(name, delivery=delivery, max_message_size=max_size, wal=wal)
        topic.guard = guard
        if wal is not None and self.objects is not None:
            topic.exporter = SegmentExporter(name, wal, self.objects, self.store)
            self.exports.add(topic)
        for p in await self.store.list(keys.topic_producers_prefix(name.full)):
            rec = p.value if isinstance(p.value, dict) else {}
            try:
                session = ProducerSession(
                    int(rec["producer_id"]),
                    str(rec["producer_name"]),
                    name.full,
                    int(rec.get("access_mode", 0)),
                )
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring malformed producer record %s", p.key)
                continue
            topic.producers[session.id] = session
            self.producers[session.id] = session
        log.info("loaded topic %s (%s)", name, delivery)
        return topic

    async def partitions(self, name: TopicName) -> list[str]:
        if await self.topic_exists(name):
            return [name.full]
        prefix = keys.namespace_topic(name.full) + PARTITION_MARKER
        found: list[tuple[int, str]] = []
        for kv in await self.store.list(prefix):
            index = kv.key[len(prefix) :]
            if index.isdigit():
                found.append((int(index), name.partition_topic(int(index)).full))
        # Unknown topics answer [name] so the following Subscribe reports a clear NOT_FOUND.
        return [n for _, n in sorted(found)] or [name.full]

    async def lookup(self, name: TopicName) -> tuple[str, bool]:
        """(URL of the broker serving the topic, whether that is this broker)."""
        if not await self.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        cluster = self.cluster
        if cluster is None:
            return self.broker_url, True
        owner = cluster.owner_of(name.full)
        if owner is None:
            await cluster.request_assignment(name.full)
            owner = await cluster.wait_owner(name.full, ASSIGNMENT_WAIT_SECONDS)
        if owner is None:
            raise Unavailable(f"topic {name} is waiting for an owner; retry the lookup")
        if owner == cluster.broker_id:
            return self.broker_url, True
        url = cluster.url_of(owner)
        if url is None:
            raise Unavailable(f"the owner of {name} (broker {owner}) is gone; retry while it is reassigned")
        return url, False

    # -- offset reads (batch API Offsets / Read: no subscription, no cursor) ---------------------------------
    async def _reliable_topic(self, topic_name: str) -> Topic:
        """The loaded reliable topic (this broker must own it: UNAVAILABLE otherwise, as for every call)."""
        name = TopicName.parse(topic_name)
        topic = await self.get_topic(name)
        if topic.wal is None:
            raise FailedPrecondition(f"topic {name} is not reliable; only reliable topics have offsets")
        return topic

    def _reader(self, topic: Topic, start: int) -> TieredReader | WalReader:
        """A reader of the topic from `start`: objects → WAL when there is a durable tier, else the WAL."""
        wal = topic.wal
        assert wal is not None
        if self.objects is not None:
            return TieredReader(topic.name, wal, self.objects, self.store, start)
        # No tier: offsets below the WAL (a failover without seal) exist nowhere; start past them.
        return wal.reader(max(start, min(wal.first_offset, wal.committed_offset)))

    async def _earliest(self, topic: Topic) -> int:
        """The lowest stored offset: the first durable object's, else the WAL's first offset."""
        wal = topic.wal
        assert wal is not None
        earliest = wal.first_offset
        if self.objects is not None:
            desc = await first_descriptor(self.store, topic.name)
            if desc is not None:
                earliest = min(earliest, desc.start_offset)
        return min(earliest, wal.committed_offset)

    async def stored_offsets(self, topic_name: str) -> StoredOffsets:
        topic = await self._reliable_topic(topic_name)
        wal = topic.wal
        assert wal is not None
        head = wal.committed_offset
        earliest = await self._earliest(topic)
        if self.objects is None:
            return StoredOffsets(earliest, head, None, "")
        exporter = topic.exporter
        prefix = (
            exporter.key_prefix
            if exporter is not None
            else topic_object_prefix(topic.name.namespace, topic.name.topic)
        )
        return StoredOffsets(earliest, head, self.objects.url, prefix)

    async def read_range(
        self, topic_name: str, start: int, end: int, max_records: int, max_bytes: int
    ) -> AsyncGenerator[list[tuple[int, bytes]], None]:
        """Batches of stored (offset, record) with start <= offset < min(end, head now), in offset order.

        Reads objects, then the WAL, like a subscription's reader, but never waits for new records. Offsets
        that are not stored (below the earliest, a gap after a failover without seal) are absent. Raises
        Unavailable when the topic leaves this broker during the read (the caller resumes elsewhere).
        """
        if start > end:
            raise InvalidArgument(f"bad offset range: start {start} is after end {end}")
        if end > MAX_READ_OFFSET:
            raise InvalidArgument(f"end {end} is above 2^63")
        if max_records < 1 or max_bytes < 1:
            raise InvalidArgument("max_records and max_bytes must be >= 1")
        topic = await self._reliable_topic(topic_name)
        wal = topic.wal
        assert wal is not None
        stop = min(end, wal.committed_offset)
        if start < wal.first_offset:
            start = max(start, await self._earliest(topic))
        if start >= stop:
            return
        reader = self._reader(topic, start)
        reader.strict_start = True  # a read that starts in lost or damaged data with no copy: DATA_LOSS
        expected = start
        try:
            while reader.next_offset < stop:
                if self.topics.get(topic.name.full) is not topic:
                    raise Unavailable(f"topic {topic.name} moved during the read; redo the lookup")
                want = min(max_records, stop - reader.next_offset)
                # timeout=0: what is committed is returned at once; nothing is ever waited for.
                records = await reader.read(want, max_bytes, timeout=0)
                if records and (records[0][0] != expected or records[-1][0] - records[0][0] >= len(records)):
                    _report_gaps(topic, expected, records, stop)
                if not records or records[0][0] >= stop:
                    if reader.next_offset > expected:
                        topic.report_gap(expected, min(reader.next_offset, stop))
                    return
                if records[-1][0] >= stop:  # only after skipping a gap past `stop`
                    records = [r for r in records if r[0] < stop]
                expected = records[-1][0] + 1
                yield records
        finally:
            reader.close()

    # -- producers ----------------------------------------------------------------------------------------
    async def create_producer(
        self, topic_name: str, producer_name: str, reliable: bool, access_mode: int
    ) -> int:
        name = TopicName.parse(topic_name)
        validate_client_name(producer_name, "producer name")
        wanted = RELIABLE if reliable else NON_RELIABLE
        topic = await self.get_topic(name, create_as=wanted)
        if topic.delivery != wanted:
            raise FailedPrecondition(
                f"topic {name} is {topic.delivery} (fixed by its first producer); "
                f"this producer asked for {wanted}"
            )
        existing = topic.producer_by_name(producer_name)
        if existing is not None:
            return existing.id
        policy = await self._namespace_policy(name.namespace)
        limit = int(policy.get("max_producers_per_topic", 0) or 0)
        if limit and len(topic.producers) >= limit:
            raise FailedPrecondition(f"topic {name} already has max_producers_per_topic={limit} producers")
        session = ProducerSession(new_id(), producer_name, name.full, access_mode)
        await self.store.put(
            keys.topic_producer(name.full, session.id),
            {
                "producer_id": session.id,
                "producer_name": producer_name,
                "topic_name": name.full,
                "access_mode": access_mode,
                "status": True,
            },
        )
        topic.producers[session.id] = session
        self.producers[session.id] = session
        return session.id

    async def producer_session(
        self, topic_name: str, producer_name: str, *, reliable: bool
    ) -> ProducerSession:
        """Create (or find, by name) a producer and return its session: the batch API's open step."""
        producer_id = await self.create_producer(topic_name, producer_name, reliable, access_mode=0)
        return self.producers[producer_id]

    async def producer(self, producer_id: int, topic_name: str) -> ProducerSession:
        session = self.producers.get(producer_id)
        if session is None and topic_name:
            # After a restart the topic may not be loaded yet: loading it restores its producers.
            try:
                name = TopicName.parse(topic_name)
            except InvalidArgument:
                name = None
            if (
                name is not None
                and await self.store.get(keys.topic_producer(name.full, producer_id)) is not None
            ):
                await self.get_topic(name)
                session = self.producers.get(producer_id)
        if session is None:
            if self.cluster is not None and topic_name:
                # Its topic moved (or this broker restarted): the client must look it up again.
                raise Unavailable(f"producer {producer_id} is not served by this broker; redo the lookup")
            raise NotFound(f"producer {producer_id} does not exist on this broker")
        if topic_name and topic_name != session.topic:
            raise InvalidArgument(
                f"producer {producer_id} publishes to {session.topic}, not {shown(topic_name)}"
            )
        return session

    async def send(self, session: ProducerSession, message: StoredMessage) -> int:
        """Publish for a producer already resolved by `producer()`; the hot path avoids re-parsing names."""
        topic = self.topics.get(session.topic)
        if topic is None:
            topic = await self.get_topic(TopicName.parse(session.topic))
        return await topic.publish(message)

    # -- consumers ----------------------------------------------------------------------------------------
    async def subscribe(
        self,
        topic_name: str,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        key_filters: list[str],
    ) -> int:
        name = TopicName.parse(topic_name)
        validate_client_name(subscription, "subscription name")
        validate_client_name(consumer_name, "consumer name")
        filters = tuple(key_filters)
        if len(filters) > MAX_KEY_FILTERS:
            raise InvalidArgument(f"too many key filters: {len(filters)} > {MAX_KEY_FILTERS}")
        for f in filters:
            if not f or len(f) > 1024:
                raise InvalidArgument(f"invalid key filter {shown(f)}: 1-1024 characters")
        topic = await self.get_topic(name)
        async with topic.lock:  # subscribe and restore check-then-insert across awaits
            return await self._subscribe_locked(topic, subscription, consumer_name, sub_type, filters)

    async def _subscribe_locked(
        self,
        topic: Topic,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        filters: tuple[str, ...],
    ) -> int:
        name = topic.name
        sub = topic.subscriptions.get(subscription)
        policy = await self._namespace_policy(name.namespace)
        if sub is not None:
            existing = sub.find_consumer(consumer_name)
            if existing is not None and sub.sub_type == sub_type:
                existing.key_filters = filters
                existing.touch()
                return existing.id
            for stale in sub.admit(consumer_name, sub_type):
                await self._drop_consumer(stale, sub)
            if existing is not None:
                await self._drop_consumer(existing, sub)
            if sub.sub_type != sub_type:
                await sub.close()
                del topic.subscriptions[subscription]
                sub = None
        self._check_consumer_limits(topic, sub, subscription, policy)
        if sub is None:
            topic.untrack_cursor(subscription)  # consumed again: its own lag gauge takes over
            sub = await self._open_subscription(topic, subscription, sub_type, consumer_name, filters)
            topic.subscriptions[subscription] = sub
        session = ConsumerSession(new_id(), consumer_name, name.full, subscription, sub_type, filters)
        sub.add_consumer(session)
        self.consumers[session.id] = ConsumerRef(session, sub)
        await self.store.put(
            CONSUMER_INDEX + str(session.id),
            {
                "topic": name.full,
                "subscription": subscription,
                "consumer_name": consumer_name,
                "subscription_type": int(sub_type),
                "key_filters": list(filters),
            },
        )
        return session.id

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(CONSUMER_REAP_INTERVAL_SECONDS)
            try:
                await self.reap_consumers(time.monotonic() - CONSUMER_IDLE_SECONDS)
            except Exception:
                log.exception("consumer reaper failed")

    async def reap_consumers(self, seen_before: float) -> int:
        """Forget consumers with no stream that were last seen before `seen_before` (monotonic seconds).

        The official client has no unsubscribe: without this, every consumer name ever used would stay in
        memory and in the consumer index. A reaped consumer that comes back simply subscribes again.
        """
        stale = [
            ref
            for ref in self.consumers.values()
            if not ref.session.attached and ref.session.last_seen < seen_before
        ]
        for ref in stale:
            await self._drop_consumer(ref.session, ref.subscription)
        if time.monotonic() - self._started_at > CONSUMER_IDLE_SECONDS:
            # Index entries of consumers from before a restart that never came back.
            for kv in await self.store.list(CONSUMER_INDEX, limit=10_000):
                cid = kv.key[len(CONSUMER_INDEX) :]
                if cid.isdigit() and int(cid) not in self.consumers:
                    await self.store.delete(kv.key)
        if stale:
            log.info("forgot %d idle consumers", len(stale))
        return len(stale)

    @staticmethod
    def _check_consumer_limits(
        topic: Topic, sub: Subscription | None, subscription: str, policy: dict[str, Any]
    ) -> None:
        """Namespace policies (0 = unlimited), checked before a new consumer or subscription is added."""

        def limit(key: str) -> int:
            value = policy.get(key, 0)
            return value if isinstance(value, int) and value > 0 else 0

        if sub is None and (n := limit("max_subscriptions_per_topic")) and len(topic.subscriptions) >= n:
            raise FailedPrecondition(f"topic {topic.name} already has max_subscriptions_per_topic={n}")
        if sub is not None and (n := limit("max_consumers_per_subscription")) and len(sub.consumers) >= n:
            raise FailedPrecondition(
                f"subscription {shown(subscription)} already has max_consumers_per_subscription={n}"
            )
        total = sum(len(s.consumers) for s in topic.subscriptions.values())
        if (n := limit("max_consumers_per_topic")) and total >= n:
            raise FailedPrecondition(f"topic {topic.name} already has max_consumers_per_topic={n}")

    async def _drop_consumer(self, session: ConsumerSession, sub: Subscription) -> None:
        sub.remove_consumer(session)
        self.consumers.pop(session.id, None)
        await self.store.delete(CONSUMER_INDEX + str(session.id))

    async def _open_subscription(
        self, topic: Topic, name: str, sub_type: SubType, consumer_name: str, filters: tuple[str, ...]
    ) -> Subscription:
        t = topic.name.full
        record_key = keys.subscription(t, name)
        record = await self.store.get(record_key)
        if topic.wal is None:
            await self.store.put(record_key, self._sub_record(name, sub_type, consumer_name, filters, None))
            return NonReliableSubscription(t, name, sub_type)
        cursor = await self.store.get(keys.subscription_cursor(t, name))
        if cursor is not None and isinstance(cursor.value, int):
            start = cursor.value + 1
        elif (
            record is not None
            and isinstance(record.value, dict)
            and isinstance(record.value.get("start_offset"), int)
        ):
            start = record.value["start_offset"]
        else:
            start = topic.wal.committed_offset  # a new subscription starts at the latest offset
        if start > topic.wal.committed_offset:
            # The WAL holds less than the cursor says (its files were lost): resume at its head.
            log.warning(
                "%s/%s: cursor start %d is past the WAL head %d", t, name, start, topic.wal.committed_offset
            )
            start = topic.wal.committed_offset
        if self.objects is None:
            start = max(start, topic.wal.first_offset)  # older records exist nowhere else
        await self.store.put(record_key, self._sub_record(name, sub_type, consumer_name, filters, start))
        policy = await self._failure_policy(topic, name)
        window = self.config.dispatch.max_unacked_messages
        dc = await self.store.get(keys.subscription_dispatch_config(t, name))
        if (
            dc is not None
            and isinstance(dc.value, dict)
            and isinstance(dc.value.get("max_unacked_messages"), int)
        ):
            window = dc.value["max_unacked_messages"]
        cursor_key = keys.subscription_cursor(t, name)

        async def write_cursor(value: int) -> None:
            await self._owner_put(topic, cursor_key, value)

        async def publish_dead_letter(message: StoredMessage, dead: DeadLetter) -> None:
            await self._publish_dead_letter(topic, name, policy, message, dead)

        sub = ReliableSubscription(
            t,
            name,
            sub_type,
            reader=self._reader(topic, start),
            report_gap=topic.report_gap,
            wal=topic.wal,
            start_offset=start,
            window=window,
            policy=policy,
            write_cursor=write_cursor,
            publish_dead_letter=publish_dead_letter,
        )
        sub.start()
        return sub

    async def _owner_put(self, topic: Topic, key: str, value: object) -> None:
        """A write about a topic that lands only while this broker owns it (cluster mode: fenced)."""
        if topic.guard is not None:
            await topic.guard.guarded_put(key, value)
        else:
            await self.store.put(key, value)

    async def close_idle_subscription(self, topic: Topic, subscription: str) -> None:
        """Take a loaded subscription out of memory (its metadata stays). FailedPrecondition while a
        consumer is attached; consumers that are not (reconnecting or waiting to be reaped) are dropped.
        The caller holds `topic.lock`."""
        sub = topic.subscriptions.get(subscription)
        if sub is None:
            return
        active = [c.name for c in sub.consumers.values() if c.attached]
        if active:
            raise FailedPrecondition(
                f"subscription {shown(subscription)} on {topic.name} has active consumers: "
                + ", ".join(sorted(active))
            )
        for session in list(sub.consumers.values()):
            await self._drop_consumer(session, sub)
        del topic.subscriptions[subscription]
        await sub.close()

    async def set_cursor(self, topic_name: str, subscription: str, next_offset: int) -> int:
        """Move a subscription's cursor so that `next_offset` is the first offset it has not consumed,
        creating the subscription if needed; returns its lag (head - next_offset).

        For readers that keep their own position (Spark's checkpoint) and want their lag visible on the
        broker: the `danube_subscription_lag_messages` gauge and the load report's backlog count it, and a
        consumer that later subscribes under this name starts at `next_offset`. Refused while consumers
        are attached (their acks move the cursor)."""
        validate_client_name(subscription, "subscription name")
        topic = await self._reliable_topic(topic_name)
        wal = topic.wal
        assert wal is not None
        t = topic.name.full
        async with topic.lock:  # against a consumer subscribing under the same name meanwhile
            head = wal.committed_offset
            if next_offset > head:
                raise InvalidArgument(f"{t}: offset {next_offset} is past the head {head}")
            await self.close_idle_subscription(topic, subscription)  # reopens from the new cursor
            record_key = keys.subscription(t, subscription)
            if await self.store.get(record_key) is None:
                record = self._sub_record(subscription, SubType.EXCLUSIVE, "", (), next_offset)
                await self._owner_put(topic, record_key, record)
            # The cursor is the last consumed offset (-1: nothing yet), as consumers' acks leave it.
            await self._owner_put(topic, keys.subscription_cursor(t, subscription), next_offset - 1)
            topic.track_cursor(subscription, next_offset)
        return head - next_offset

    @staticmethod
    def _sub_record(
        name: str, sub_type: SubType, consumer_name: str, filters: tuple[str, ...], start: int | None
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "subscription_name": name,
            "subscription_type": int(sub_type),
            "consumer_id": None,
            "consumer_name": consumer_name,
            "key_filters": list(filters),
        }
        if start is not None:
            record["start_offset"] = start
        return record

    async def _failure_policy(self, topic: Topic, sub: str) -> FailurePolicy:
        key = keys.subscription_failure_policy(topic.name.full, sub)
        kv = await self.store.get(key)
        if kv is not None and isinstance(kv.value, dict):
            try:
                return FailurePolicy.from_json(kv.value)
            except InvalidArgument as exc:
                log.warning("stored failure policy %s is invalid (%s); using defaults", key, exc)
        d = self.config.dispatch
        policy = FailurePolicy(
            max_redelivery_count=d.max_redelivery_count,
            ack_timeout_ms=d.ack_timeout_ms,
            base_redelivery_delay_ms=d.base_redelivery_delay_ms,
            max_redelivery_delay_ms=d.max_redelivery_delay_ms,
            backoff=d.backoff_strategy,
            poison_policy=d.poison_policy,
            dead_letter_topic=topic.name.dlq().full if d.poison_policy == "DeadLetter" else None,
        )
        return policy  # config defaults stay config: only an explicitly stored policy is persisted

    async def _publish_dead_letter(
        self, topic: Topic, sub: str, policy: FailurePolicy, message: StoredMessage, dead: DeadLetter
    ) -> None:
        target = TopicName.parse(policy.dead_letter_topic or topic.name.dlq().full)
        message = repair_for_wire(message)  # a record stored before publishes were checked
        attrs = dict(message.attributes)
        attrs.update(
            {
                "x-original-topic": topic.name.full,
                "x-original-subscription": sub,
                "x-original-topic-offset": str(dead.offset),
                "x-original-producer-id": str(message.producer_id),
                "x-original-broker-addr": self.broker_url,
                "x-poison-policy": "dead_letter",
                "x-delivery-attempt": str(dead.attempts),
            }
        )
        if dead.reason:
            attrs["x-failure-reason"] = dead.reason
        dlq = await self.get_topic(target, create_as=RELIABLE, internal=True)
        if not dlq.reliable:
            raise FailedPrecondition(f"dead-letter topic {target} is NonReliable; it must be Reliable")
        await dlq.publish(
            StoredMessage(
                payload=message.payload,
                publish_time=message.publish_time,
                producer_id=message.producer_id,
                producer_name=message.producer_name,
                attributes=attrs,
                routing_key=message.routing_key,
                schema_id=message.schema_id,
                schema_version=message.schema_version,
            )
        )

    async def consumer(self, consumer_id: int) -> ConsumerRef:
        ref = self.consumers.get(consumer_id)
        if ref is not None:
            return ref
        # A consumer from before a restart: re-create its session with the same id.
        kv = await self.store.get(CONSUMER_INDEX + str(consumer_id))
        if kv is None or not isinstance(kv.value, dict):
            raise NotFound(f"consumer {consumer_id} does not exist on this broker")
        rec = kv.value
        try:
            name = TopicName.parse(str(rec["topic"]))
            sub_name = str(rec["subscription"])
            sub_type = SubType(int(rec["subscription_type"]))
            consumer_name = str(rec["consumer_name"])
            filters = tuple(str(f) for f in rec.get("key_filters", []))
        except (KeyError, TypeError, ValueError, InvalidArgument):
            raise NotFound(f"consumer {consumer_id} does not exist on this broker") from None
        topic = await self.get_topic(name)
        async with topic.lock:
            ref = self.consumers.get(consumer_id)
            if ref is not None:
                return ref
            sub = topic.subscriptions.get(sub_name)
            if sub is None:
                sub = await self._open_subscription(topic, sub_name, sub_type, consumer_name, filters)
                topic.subscriptions[sub_name] = sub
            if sub.sub_type != sub_type or sub.find_consumer(consumer_name) is not None:
                raise NotFound(f"consumer {consumer_id} was replaced")
            session = ConsumerSession(consumer_id, consumer_name, name.full, sub_name, sub_type, filters)
            sub.add_consumer(session)
            ref = ConsumerRef(session, sub)
            self.consumers[consumer_id] = ref
            return ref

    async def open_stream(self, consumer_id: int) -> tuple[ConsumerRef, ConsumerStream]:
        ref = await self.consumer(consumer_id)
        loaded = self.topics.get(ref.session.topic)
        if loaded is None or loaded.closing:
            raise Unavailable(f"topic {ref.session.topic} is moving; subscribe again")
        size = RELIABLE_CONSUMER_BUFFER if ref.subscription.reliable else NON_RELIABLE_CONSUMER_BUFFER
        stream = ConsumerStream(size)
        ref.subscription.attach(ref.session, stream)
        return ref, stream

    def close_stream(self, ref: ConsumerRef, stream: ConsumerStream) -> None:
        ref.subscription.detach(ref.session, stream)

    async def _subscription_for(self, topic_name: str, subscription: str) -> Subscription | None:
        """The open subscription; None when it exists only in metadata (not reopened since a restart: its
        unacknowledged messages will be delivered again, so an ack or nack for them changes nothing)."""
        topic = self.topics.get(topic_name) or await self.get_topic(TopicName.parse(topic_name))
        sub = topic.subscriptions.get(subscription)
        if sub is not None:
            return sub
        validate_client_name(subscription, "subscription name")
        if await self.store.get(keys.subscription(topic.name.full, subscription)) is None:
            raise NotFound(f"subscription {shown(subscription)} does not exist on {topic_name}")
        return None

    async def ack(self, topic_name: str, subscription: str, offset: int) -> None:
        sub = await self._subscription_for(topic_name, subscription)
        if sub is not None:
            await sub.ack(offset)

    async def nack(
        self, topic_name: str, subscription: str, offset: int, delay_ms: int | None, reason: str | None
    ) -> None:
        sub = await self._subscription_for(topic_name, subscription)
        if sub is not None:
            await sub.nack(offset, delay_ms, reason)

    # -- health ---------------------------------------------------------------------------------------------
    def end_streams(self) -> None:
        """End every consumer stream (first step of shutdown, so gRPC's grace period is not waited out)."""
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                sub.end_streams()

    def producer_alive(self, producer_id: int) -> bool:
        return producer_id in self.producers and not self._closing

    def consumer_alive(self, consumer_id: int) -> bool:
        ref = self.consumers.get(consumer_id)
        if ref is None or self._closing:
            return False
        ref.session.touch()
        return True


def read_epoch(path: Path) -> int | None:
    """The ownership epoch this broker's local WAL of a topic was loaded under (None: no usable WAL)."""
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


def _report_gaps(topic: Topic, expected: int, records: list[tuple[int, bytes]], stop: int) -> None:
    """Tell the topic about offsets a ranged read found missing before and between `records`."""
    for offset, _ in records:
        if offset >= stop:
            topic.report_gap(expected, stop)
            return
        if offset > expected:
            topic.report_gap(expected, offset)
        expected = offset + 1


def _local_epochs(data_dir: Path) -> list[tuple[TopicName, Path, int | None]]:
    """(topic, epoch file, epoch) of every topic this broker has loaded in cluster mode (blocking)."""
    out: list[tuple[TopicName, Path, int | None]] = []
    root = data_dir / "owners"
    if not root.is_dir():
        return out
    for epoch_file in sorted(root.glob("*/*.epoch")):
        try:
            name = TopicName.parse(f"/{epoch_file.parent.name}/{epoch_file.name[: -len('.epoch')]}")
        except InvalidArgument:
            continue
        out.append((name, epoch_file, read_epoch(epoch_file)))
    return out


def sealed_offset(value: Any) -> int | None:
    """last_committed_offset + 1 of a sealed-state value, None when it is not a valid sealed state."""
    if not isinstance(value, dict) or value.get("sealed") is not True:
        return None
    last = value.get("last_committed_offset")
    return last + 1 if isinstance(last, int) and not isinstance(last, bool) and last >= 0 else None
