"""Loading a replicated reliable topic as its leader (docs/replication.md).

The owner the cluster leader assigned becomes the topic's replication leader at the next epoch:

* after a failover it must be an in-sync replica (the cluster leader only picks those) and it continues its
  own copy of the WAL where it ends: no reservation gap, nothing acknowledged is missing from it;
* after a graceful move (the old owner sealed the topic and exported up to its commit) any broker may lead:
  a broker without an in-sync copy starts an empty WAL after the sealed offset;
* the first load of a topic that should be replicated picks its followers and writes the replica record.

A broker asked to lead a topic it cannot (not in sync, its copy gone) gives the assignment back, so the
cluster leader assigns it to an in-sync replica instead.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec

from ister.client.transport import NO_CREDENTIALS, Credentials
from ister.cluster.guard import OwnershipGuard
from ister.cluster.node import ClusterNode
from ister.cluster.replicas import ReplicaManager
from ister.config import BrokerConfig
from ister.core.cluster.ownership import OwnerRecord, vouched_seal
from ister.core.replication import MAX_REPLICATION_FACTOR, EpochHistory, ReplicaRecord
from ister.errors import Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import SealedState
from ister.metadata.store import Compare, Delete, KeyValue, MetadataStore, Put
from ister.replication.leader import ReplicaLeader
from ister.security.peer import PeerSecret
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal
from ister.storage.wal.epochs import load_epochs, save_epochs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FirstLoad:
    """What a topic's first replicated load read before its owner opened the log."""

    owner: OwnerRecord
    versions: tuple[int, int]
    sealed_kv: KeyValue | None
    factor: int
    min_insync: int


class ReplicatedTopics:
    def __init__(
        self,
        node: ClusterNode,
        config: BrokerConfig,
        store: MetadataStore,
        storage: TopicStorage,
        peer: PeerSecret | None = None,
    ) -> None:
        self.node = node
        self.config = config
        self.store = store
        self.storage = storage
        self.manager = ReplicaManager(node, store, storage, peer, peer_credentials(config))

    @property
    def broker_id(self) -> int:
        return self.node.broker_id

    async def lead(self, name: TopicName, replica_kv: KeyValue) -> tuple[Wal, OwnershipGuard]:
        """Lead a topic that has a replica record: this broker continues its own copy (opened here)."""
        manager = self.manager
        manager.begin_leading(name.full)
        try:
            return await self._lead(name, replica_kv)
        except BaseException:
            manager.end_leading(name.full)
            raise

    async def lead_first(self, name: TopicName, first: FirstLoad, wal: Wal) -> tuple[Wal, OwnershipGuard]:
        """The topic's first replicated load, its WAL opened by the topic's owner where offsets continue
        (the single-copy rules: the last loader's WAL, else after the seal or the reservation); its
        followers are chosen here. A failure leaves closing `wal` to the owner."""
        manager = self.manager
        manager.begin_leading(name.full)
        try:
            return await self._first_load(name, first, wal)
        except BaseException:
            manager.end_leading(name.full)
            raise

    async def _lead(self, name: TopicName, replica_kv: KeyValue) -> tuple[Wal, OwnershipGuard]:
        me = self.broker_id
        storage = self.storage
        hint = await self.manager.stop_following(name.full)  # its WAL is ours from here on
        sealed_kv = await self.store.get(keys.storage_state(name.full))
        sealed = SealedState.parse(sealed_kv.value) if sealed_kv is not None else None
        owner, versions = await self.node.read_owner(name.full, fresh=True)
        sealed_next = vouched_seal(owner, sealed.epoch, sealed.next_offset) if sealed is not None else None
        record = ReplicaRecord.parse(replica_kv.value)
        if record is None:
            raise Unavailable(f"topic {name}: its replica record is malformed; redo the lookup")
        wal_dir = storage.wal_dir(name)
        has_copy = wal_dir.exists()
        # An unclean recovery names this broker alone in sync, with or without a copy (`resume_at`).
        in_sync = me in record.isr and (has_copy or owner.loaded_epoch == 0 or record.resume_at > 0)
        if not in_sync and sealed_next is None:
            await self._give_back(name, record, replica_kv)
            raise Unavailable(
                f"topic {name}: broker {me} holds no in-sync copy (in-sync: {record.isr}); "
                "it is handed to an in-sync replica, redo the lookup"
            )
        wal = await storage.open_wal(name)
        try:
            if sealed_next is not None and (not in_sync or wal.next_offset < sealed_next):
                # A graceful move here without a complete copy: every record below the seal is in the
                # durable tier; this copy restarts empty after it.
                await wal.reset(sealed_next)
                await asyncio.to_thread(save_epochs, wal.directory, EpochHistory())
            if record.resume_at > wal.next_offset:
                log.warning(
                    "%s: unclean recovery: offsets %d..%d are gone; new offsets start at %d",
                    name,
                    wal.next_offset,
                    record.resume_at - 1,
                    record.resume_at,
                )
                wal = await storage.skip_to(name, wal, record.resume_at)
            known = max(hint, wal.first_offset, sealed_next or 0)
            replicas = record.replicas
            if me not in replicas:
                keep = [r for r in replicas if r != record.leader][: len(replicas) - 1]
                replicas = [me, *keep]
            isr = sorted(set(record.isr) | {me}) if in_sync else sorted(replicas)
            new = ReplicaRecord(
                replicas=replicas,
                isr=isr,
                leader=me,
                epoch=max(owner.epoch, record.epoch + 1),
                min_insync=record.min_insync,
                factor=record.factor,
            )
            return await self._serve(name, wal, owner, versions, new, replica_kv, known, sealed_kv)
        except BaseException:
            await wal.close()
            raise

    async def _first_load(self, name: TopicName, first: FirstLoad, wal: Wal) -> tuple[Wal, OwnershipGuard]:
        me = self.broker_id
        followers = self.manager.choose_followers(first.factor - 1, [])
        replicas = [me, *followers]
        new = ReplicaRecord(
            replicas=replicas,
            isr=sorted(replicas),
            leader=me,
            epoch=first.owner.epoch,
            min_insync=min(first.min_insync, len(replicas)),
            factor=first.factor,
        )
        # Everything below the WAL's start is in the durable tier or was never written: committed.
        return await self._serve(
            name, wal, first.owner, first.versions, new, None, wal.next_offset, first.sealed_kv
        )

    async def _serve(
        self,
        name: TopicName,
        wal: Wal,
        owner: OwnerRecord,
        versions: tuple[int, int],
        record: ReplicaRecord,
        replica_kv: KeyValue | None,
        known_committed: int,
        sealed_kv: KeyValue | None,
    ) -> tuple[Wal, OwnershipGuard]:
        """Write the replica record naming this broker leader (compare-and-set: followers stop taking the
        old leader's records as they see it), claim the topic, and start leading."""
        key = keys.replicas(name)
        expected = replica_kv.version if replica_kv is not None else None
        if not await self.store.txn([Compare(key, expected)], [Put(key, record.to_json())]):
            raise Unavailable(f"topic {name}: its replica record changed while loading; redo the lookup")
        kv = await self.store.get(key)
        if kv is None or ReplicaRecord.parse(kv.value) != record:
            raise Unavailable(f"topic {name}: its replica record changed while loading; redo the lookup")
        start = wal.next_offset
        claimed = msgspec.structs.replace(
            owner,
            loaded_epoch=owner.epoch,
            reserved_until=max(start + self.config.cluster.offset_reservation, owner.reserved_until),
        )
        guard = await self.node.commit_claim(name.full, versions, claimed)
        history = (await asyncio.to_thread(load_epochs, wal.directory)).history
        history.truncate(start)
        history.begin(record.epoch, start)
        await asyncio.to_thread(save_epochs, wal.directory, history)
        if sealed_kv is not None:  # consumed: the next load must not trust it again
            await self.store.compare_and_delete(sealed_kv.key, expected_version=sealed_kv.version)
        leader = ReplicaLeader(
            name,
            wal,
            history,
            record,
            kv.version,
            self.store,
            self.broker_id,
            self.config.cluster.replica_max_lag_seconds,
            known_committed=known_committed,
            on_fenced=guard.revoke,
            on_closed=lambda: self.manager.end_leading(name.full),
            peers=self.manager.peers,
            choose=lambda exclude: self.manager.choose_followers(MAX_REPLICATION_FACTOR, [], exclude),
            replace_after_s=self.config.cluster.replica_replace_after_seconds,
            live=lambda: self.manager.live,
            absences=self.manager.absences,
            note_absent=self.manager.note_absent,
            on_step_down=lambda: self._hand_back(name, "its disk failed"),
        )
        guard.bind(wal)
        guard.replication = leader
        self.manager.leaders[name.full] = leader
        leader.start()
        log.info(
            "leading %s at epoch %d: offsets from %d, replicas %s, in sync %s, committed %d",
            name,
            record.epoch,
            start,
            record.replicas,
            record.isr,
            leader.committed,
        )
        return wal, guard

    async def _hand_back(self, name: TopicName, reason: str) -> None:
        """Delete this broker's assignment of `name` and mark it for a failover (to an in-sync replica)."""
        me = self.broker_id
        marker = keys.unassigned(name)
        await self.store.txn(
            [Compare(marker, None)],
            [Delete(keys.broker_topic(me, name)), Put(marker, {"reason": "failover", "from_broker": me})],
        )
        log.warning("%s: handed back for a failover (%s)", name, reason)

    async def _give_back(self, name: TopicName, record: ReplicaRecord, replica_kv: KeyValue | None) -> None:
        """This broker cannot lead the topic: leave its in-sync set and hand the assignment back for a
        failover to an in-sync replica."""
        me = self.broker_id
        if replica_kv is not None and me in record.isr:
            left = record.with_isr([b for b in record.isr if b != me])
            await self.store.txn(
                [Compare(replica_kv.key, replica_kv.version)], [Put(replica_kv.key, left.to_json())]
            )
        await self._hand_back(name, f"no in-sync copy here; for a failover to {record.isr}")


def peer_credentials(config: BrokerConfig) -> Credentials:
    """How this broker connects to the others' client ports: their CA when they serve TLS, and this
    broker's own certificate when they require client certificates (mutual TLS)."""
    tls = config.security.tls
    client = tls.for_port("client")
    if client is None:
        return NO_CREDENTIALS
    mutual = client.client_ca_file is not None
    if tls.peer_ca_file is None and not mutual:
        log.warning(
            "TLS on the client port without security.tls.peer_ca_file: replication streams verify the "
            "other brokers' certificates against the system roots; set it when they come from a private CA"
        )
    return Credentials(
        tls_ca=tls.peer_ca_file or client.client_ca_file,
        cert_file=client.cert_file if mutual else None,
        key_file=client.key_file if mutual else None,
    )
