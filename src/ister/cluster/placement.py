"""`ClusterPlacement`: the broker's `Placement` (ister.ports) in cluster mode, over the `ClusterNode`.

Serving: a topic is served by the broker its assignment key names; others send clients there. Claiming a
reliable topic decides where its offsets continue (`core.cluster.ownership.plan_load`): the local WAL when it
was the last one loaded, else after the sealed state or the last reservation; a local WAL another owner went
on without is archived as superseded and given back to the durable tier by a periodic sweep. Moves go
through the unload marker. The admin API's cluster views are cluster/placement_admin.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from ister.cluster.guard import OwnershipGuard
from ister.cluster.node import ClusterNode
from ister.cluster.replicated import FirstLoad, ReplicatedTopics
from ister.config import BrokerConfig
from ister.core.cluster.ownership import OwnerRecord, plan_load
from ister.core.replication_policy import ReplicationSetting, resolve
from ister.errors import AskAnother, Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import NamespacePolicy, SealedState, TopicReplication
from ister.metadata.store import KeyValue, MetadataStore, list_all
from ister.ports.host import TopicHost
from ister.ports.placement import LogPlan
from ister.storage.topic_log import LogStart, OpenedLog
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

ASSIGNMENT_WAIT_SECONDS = 3.0  # how long a call for an unassigned topic waits for the leader
UNLOAD_WAIT_SECONDS = 65.0  # admin unload: the owner's answer (two bounds on exporting the tail, + 5 s)
SUPERSEDED_FIRST_SWEEP_SECONDS = 2.0  # after start: the cluster view is loaded by then
SUPERSEDED_SWEEP_SECONDS = 10.0  # a topic this broker lost (paused, fenced) is given back this soon after
SUPERSEDED_RETRY_SECONDS = 10.0  # while an archive could not be exported yet


@dataclass(frozen=True, slots=True)
class _Single:
    """What a one-copy load read before opening its log: the claim compares against it."""

    record: OwnerRecord
    versions: tuple[int, int]
    sealed_kv: KeyValue | None


class ClusterPlacement:
    def __init__(
        self,
        node: ClusterNode,
        config: BrokerConfig,
        store: MetadataStore,
        storage: TopicStorage,
        replicated: ReplicatedTopics,
    ) -> None:
        self.node = node
        self.config = config
        self.store = store
        self.storage = storage
        self.replicated = replicated
        self._host: TopicHost | None = None
        self._tasks = TaskSupervisor("cluster placement")  # the superseded-WAL sweeper
        self._wakeup = asyncio.Event()

    @property
    def broker_id(self) -> int:
        return self.node.broker_id

    @property
    def moves_need_export(self) -> bool:
        return True

    @property
    def loads_new_topics_here(self) -> bool:
        return False

    def bind(self, host: TopicHost) -> None:
        self._host = host

    async def start(self) -> None:
        """Join the cluster (after the servers are up: the watcher may load topics at once)."""
        assert self._host is not None
        if self.storage.objects is None:
            log.warning(
                "cluster mode without a durable tier (storage.durable): a reliable topic's records live only "
                "on its owner's disk. Moves of reliable topics that hold records are refused (unload, drain "
                "and rebalancing leave them where they are), and after a broker dies its unexported records "
                "are unreadable until it returns. Configure a shared object store to move topics freely."
            )
        # Before registering: a broker must not be promoted for a copy it lost with its disk.
        await self.replicated.manager.load_peer_secret()
        await self.replicated.manager.leave_lost_copies()
        self._tasks.spawn(self._superseded_loop(), "superseded-wals")
        await self.node.start(self._host)
        self.replicated.manager.start()

    async def close(self) -> None:
        """Leave the cluster last (the lease is revoked after cursors were flushed as the owner)."""
        await self._tasks.close()
        await self.replicated.manager.close()
        await self.node.close()

    # -- serving ----------------------------------------------------------------------------------------
    def serves(self, topic: str) -> bool:
        return self.node.assigned_here(topic)

    async def _owner_now(self, name: TopicName) -> int | None:
        """The owner; an unassigned topic is queued for the leader and waited for briefly, so the usual
        case needs no client retry."""
        owner = self.node.owner_of(name.full)
        if owner is None:
            await self.node.request_assignment(name.full)
            owner = await self.node.wait_owner(name.full, ASSIGNMENT_WAIT_SECONDS)
        return owner

    async def ensure_served_here(self, name: TopicName) -> None:
        if self.node.assigned_here(name.full):
            return
        owner = await self._owner_now(name)
        if owner == self.node.broker_id:
            return
        where = f"served by broker {owner}" if owner is not None else "waiting for an owner"
        raise Unavailable(f"topic {name} is {where}; redo the lookup")

    async def locate(self, name: TopicName) -> str | None:
        owner = await self._owner_now(name)
        if owner is None:
            raise Unavailable(f"topic {name} is waiting for an owner; retry the lookup")
        if owner == self.node.broker_id:
            if not self.node.clock.valid():
                # Cut off from the metadata store, this broker may have been replaced as the owner without
                # knowing: answering "here" kept a client that asked it first on a broker that refuses every
                # publish until the heal. Another broker knows (or, in an etcd-wide outage, still names it).
                raise AskAnother(f"broker {self.node.broker_id} cannot renew its lease; ask another broker")
            return None
        url = self.node.url_of(owner)
        if url is None:
            raise Unavailable(f"the owner of {name} (broker {owner}) is gone; retry while it is reassigned")
        return url

    def not_served_error(self, what: str) -> Exception:
        # Its topic moved (or this broker restarted): the client must look it up again.
        return Unavailable(f"{what} is not served by this broker; redo the lookup")

    async def topics_created(self, names: list[TopicName]) -> None:
        for name in names:
            await self.node.request_assignment(name.full)

    def check_room_for_new(self, count: int, what: str) -> None:
        return None  # the leader places new topics; each broker checks its limit when it loads them

    # -- claiming ---------------------------------------------------------------------------------------
    async def plan_log(self, name: TopicName) -> LogPlan:
        """Where the owner record and the seal say offsets continue (one copy, or a topic's first replicated
        load). A topic with a replica record is led by continuing this broker's own copy
        (cluster/replicated.py), so its plan has no start."""
        replica_kv = await self.store.get(keys.replicas(name))
        if replica_kv is not None:
            return LogPlan(None, replica_kv)
        wanted, placed, min_insync = await self._replication_of(name)
        sealed_kv = await self.store.get(keys.storage_state(name.full))
        sealed = SealedState.parse(sealed_kv.value) if sealed_kv is not None else None
        record, versions = await self.node.read_owner(name.full, fresh=True)  # decides where offsets start
        start = LogStart.cluster(record, sealed, self.config.cluster.offset_reservation)
        if placed > 1:
            return LogPlan(start, FirstLoad(record, versions, sealed_kv, wanted, min_insync))
        return LogPlan(start, _Single(record, versions, sealed_kv))

    async def claim_log(
        self, name: TopicName, plan: LogPlan, opened: OpenedLog | None
    ) -> tuple[Wal, OwnershipGuard]:
        """The committed claim that fences the topic's log, opened where its offsets continue."""
        context = plan.context
        if isinstance(context, KeyValue):
            return await self.replicated.lead(name, context)
        assert opened is not None
        if isinstance(context, FirstLoad):
            return await self.replicated.lead_first(name, context, opened.wal)
        assert isinstance(context, _Single)
        return await self._claim_single(name, context, opened)

    async def _replication_of(self, name: TopicName) -> tuple[int, int, int]:
        """(replication factor, copies it can have now (capped by the live brokers), min in-sync) for a
        topic loaded without a replica record: the topic's own setting, else the namespace policy's, else
        the broker's, field by field. A topic placed on fewer brokers than its factor gets its missing
        followers when brokers join."""
        topic_kv = await self.store.get(keys.topic_replication(name))
        topic = (
            TopicReplication.parse(topic_kv.value) if topic_kv is not None else None
        ) or TopicReplication()
        ns_kv = await self.store.get(keys.namespace_policy(name.namespace))
        policy = NamespacePolicy.lenient(ns_kv.value if ns_kv is not None else None)
        c = self.config.cluster
        layers = [
            ReplicationSetting(topic.replication_factor, topic.min_insync_replicas),
            ReplicationSetting(policy.replication_factor, policy.min_insync_replicas),
            ReplicationSetting(c.replication_factor, c.min_insync_replicas),
        ]
        r = resolve(layers, len(self.node.live_brokers()))
        return r.factor, r.placed, r.min_insync

    async def _claim_single(
        self, name: TopicName, read: _Single, opened: OpenedLog
    ) -> tuple[Wal, OwnershipGuard]:
        """One copy: the local WAL of the last loader, else a new one after the seal or the reservation."""
        storage = self.storage
        if opened.archived:
            self._wakeup.set()  # export what only the superseded WAL holds, then delete it
        wal, local_epoch, plan, record = opened.wal, opened.local_epoch, opened.plan, read.record
        assert plan is not None
        epoch_written = False
        try:
            # Written before the claim: a crash in between leaves a WAL that is treated as stale (safe: it is
            # then exported as superseded).
            storage.write_epoch(name, record.epoch)
            epoch_written = True
            guard = await self.node.commit_claim(name.full, read.versions, plan.record)
        except BaseException:
            if epoch_written and plan.keep_local and local_epoch is not None:
                # The claim did not land: this WAL is still the one `loaded_epoch` names. Without this it
                # would look superseded at the next load although it holds the newest records.
                storage.write_epoch(name, local_epoch)
            raise
        guard.bind(wal)
        sealed_kv = read.sealed_kv
        if sealed_kv is not None:
            await self.store.compare_and_delete(sealed_kv.key, expected_version=sealed_kv.version)
        log.info(
            "claimed %s at epoch %d: offsets from %d (%s), reserved below %d",
            name,
            record.epoch,
            wal.next_offset,
            "local WAL continued" if plan.keep_local else "new WAL",
            plan.record.reserved_until,
        )
        return wal, guard

    async def claim_volatile(self, name: TopicName) -> OwnershipGuard:
        """A non-reliable topic's claim: from the cached owner record first (two fewer round trips per
        load), from the store when the cached one was stale."""
        for fresh in (False, True):
            record, versions = await self.node.read_owner(name.full, fresh=fresh)
            plan = plan_load(record, None, None, None, self.config.cluster.offset_reservation)
            try:
                return await self.node.commit_claim(name.full, versions, plan.record)
            except Unavailable:
                if fresh:
                    raise
        raise AssertionError("unreachable")

    async def request_unload(self, name: TopicName) -> None:
        # Waits for the owner's seal, so the caller hears when the move cannot happen and why.
        await self.node.request_unload(name.full, wait_seconds=UNLOAD_WAIT_SECONDS)

    async def topic_deleted(self, name: TopicName) -> None:
        # Deleting the assignment makes the owner fence the topic at once and unload it.
        for kv in await list_all(self.store, keys.BROKERS_PREFIX):
            if keys.assignments([kv.key]).get(name.full) is not None:
                await self.store.delete(kv.key)
        await self.store.delete(keys.unassigned(name))
        await self.store.delete(keys.replicas(name))  # its followers stop and drop their copies

    # -- superseded WALs --------------------------------------------------------------------------------
    async def _superseded_loop(self) -> None:
        """Give back what only this broker holds: at start, when a load archived a WAL, and periodically."""
        delay = SUPERSEDED_FIRST_SWEEP_SECONDS
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()
            self._wakeup.clear()
            try:
                pending = await self.sweep_superseded()
            except Exception as exc:  # the store or etcd is down: the files stay, the next sweep retries
                log.warning("superseded WALs: sweep failed (%s); retrying", exc)
                pending = 1
            delay = SUPERSEDED_RETRY_SECONDS if pending else SUPERSEDED_SWEEP_SECONDS

    async def sweep_superseded(self) -> int:
        """Archive local WALs of topics another broker has loaded since, export archived WALs into the
        durable tier and delete them once every record is there. Returns how many archives remain."""
        host = self._host
        assert host is not None
        storage = self.storage
        for name, local_epoch in await storage.local_epochs():
            if host.is_loaded(name.full) or self.node.assigned_here(name.full):
                continue
            if self.node.cache.get(keys.replicas(name)) is not None:
                # Replicated: never exported from here (its suffix may be uncommitted); this copy is
                # followed, cut where it diverges, or dropped when this broker is no longer a replica.
                continue
            exists = await self.store.get(keys.namespace_topic(name.full)) is not None
            kv = await self.store.get(keys.owner(name.full))
            record = OwnerRecord.parse(kv.value) if kv is not None else None
            if exists and (record is None or record.loaded_epoch == local_epoch):
                continue  # nobody loaded it since: this WAL is still the newest copy (it may come back here)
            async with host.topic_lock(name.full):
                if host.is_loaded(name.full):
                    continue
                await storage.archive_superseded(name, local_epoch)
                await storage.forget_epoch(name)
        remaining = 0
        for item in await storage.archived():
            exists = await self.store.get(keys.namespace_topic(item.topic.full)) is not None
            if not await storage.give_back(item, exists):
                remaining += 1
        return remaining
