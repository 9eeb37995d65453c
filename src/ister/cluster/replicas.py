"""`ReplicaManager`: this broker's part in replicated reliable topics (docs/replication.md).

* Follows every replicated topic whose replica record names this broker and that it does not lead: one
  `ReplicaFollower` each, pointed at the leader the record names (re-pointed when the record changes).
* Keeps the `ReplicaLeader` of every replicated topic it leads, for the `IsterReplica.Fetch` servicer.
* Creates a topic's replica record when its first replicated owner loads it, and picks its followers.
* At start, before this broker registers, leaves the in-sync set of every topic whose copy it lost (an
  empty data directory): it holds nothing, and being promoted would lose every acknowledged record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ister.client.transport import NO_CREDENTIALS, Credentials
from ister.core.cluster.load import rank_replica_candidates, spread_over_zones
from ister.core.replication import NO_LEADER, CopyEnd, ReplicaRecord, clocks_to_forget
from ister.errors import MetadataError
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import BrokerRegistration
from ister.metadata.store import Compare, MetadataStore, Put, list_all
from ister.replication import metrics
from ister.replication.follower import ChannelPool, LeaderTarget, ReplicaFollower
from ister.replication.leader import ReplicaLeader
from ister.security.peer import PEER_METADATA, PeerSecret, new_secret, peer_token
from ister.storage.topic_storage import TopicStorage
from ister.tasks import TaskSupervisor

if TYPE_CHECKING:
    from ister.cluster.node import ClusterNode

log = logging.getLogger(__name__)

SYNC_SECONDS = 0.5  # also without a cache change: a topic unloaded here is followed again this soon
TRIM_SECONDS = 5.0  # how often followers' copies drop segments the durable tier holds


class ReplicaManager:
    def __init__(
        self,
        node: ClusterNode,
        store: MetadataStore,
        storage: TopicStorage,
        peer: PeerSecret | None = None,
        credentials: Credentials = NO_CREDENTIALS,
    ) -> None:
        self.node = node
        self.peer = peer or PeerSecret()
        self.store = store
        self.storage = storage
        self.broker_id = node.broker_id
        self.followers: dict[str, ReplicaFollower] = {}
        self.leaders: dict[str, ReplicaLeader] = {}
        self.leading: set[str] = set()  # being loaded or served here as the leader: never followed
        self.channels = ChannelPool(credentials, self._peer_metadata)
        self.live: set[int] = set()  # registered brokers as of the last sync (leaders read it often)
        self._scanned = False
        self._tasks = TaskSupervisor("replica followers")
        self._committed_hint: dict[str, int] = {}
        self._stranded: set[str] = set()  # topics without a live in-sync replica, as last said

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def load_peer_secret(self) -> None:
        """Read the cluster's peer secret, creating it if this is the first broker that needs it."""
        kv = await self.store.get(keys.PEER_SECRET)
        if kv is None:
            await self.store.compare_and_set(keys.PEER_SECRET, new_secret(), expected_version=None)
            kv = await self.store.get(keys.PEER_SECRET)
        if kv is None or not isinstance(kv.value, str) or not kv.value:
            raise MetadataError(f"{keys.PEER_SECRET} holds no usable secret")
        self.peer.secret = kv.value.encode()

    def _peer_metadata(self) -> list[tuple[str, str]]:
        secret = self.peer.secret
        return [] if secret is None else [(PEER_METADATA, peer_token(secret, self.broker_id, time.time()))]

    async def leave_lost_copies(self) -> None:
        """Before registering: leave the in-sync set of each topic whose local copy is gone."""
        for kv in await list_all(self.store, keys.REPLICAS_PREFIX):
            topic = keys.replicas_topic(kv.key)
            record = ReplicaRecord.parse(kv.value)
            if topic is None or record is None or self.broker_id not in record.isr:
                continue
            if self.storage.wal_dir(TopicName.parse(topic)).exists():
                continue
            isr = [b for b in record.isr if b != self.broker_id]
            new = msgspec.structs.replace(record, isr=isr)
            if await self.store.txn([Compare(kv.key, kv.version)], [Put(kv.key, new.to_json())]):
                log.warning(
                    "%s: this broker's copy is gone (empty data directory): it left the in-sync set %s",
                    topic,
                    record.isr,
                )

    def start(self) -> None:
        self._tasks.spawn(self._watch(), "replica followers")
        self._tasks.spawn(self._trim_loop(), "replica retention")

    async def _trim_loop(self) -> None:
        """Followers' copies keep what the leader's would: segments the durable tier holds are deleted."""
        while True:
            await asyncio.sleep(TRIM_SECONDS)
            for topic, follower in list(self.followers.items()):
                try:
                    await follower.trim()
                except Exception as exc:  # the store or etcd is down: the files stay until the next pass
                    log.warning("%s: trimming this broker's copy failed (%s); retried", topic, exc)

    async def close(self) -> None:
        await self._tasks.close()
        for follower in list(self.followers.values()):
            await follower.stop()
        self.followers.clear()
        for leader in list(self.leaders.values()):
            await leader.close("broker closing")
        self.leaders.clear()
        await self.channels.close()

    async def _watch(self) -> None:
        while True:
            changed = self.node.cache.change_event()
            try:
                self.live = set(self.node.live_brokers())
                await self.sync()
                leaders = list(self.leaders.values())
                metrics.under_replicated.set(sum(1 for x in leaders if x.under_replicated))
                metrics.under_min_isr.set(sum(1 for x in leaders if x.under_min_isr))
            except Exception:
                log.exception("replica followers: sync failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_SECONDS):
                    await changed.wait()

    # -- following -------------------------------------------------------------------------------------
    def record_of(self, topic: str) -> ReplicaRecord | None:
        kv = self.node.cache.get(keys.replicas(topic))
        return ReplicaRecord.parse(kv.value) if kv is not None else None

    async def sync(self) -> None:
        """Follow what the records say this broker follows; stop following what it no longer does."""
        wanted: set[str] = set()
        named: set[int] = set()
        stranded: set[str] = set()
        for kv in self.node.cache.list(keys.REPLICAS_PREFIX):
            topic = keys.replicas_topic(kv.key)
            record = ReplicaRecord.parse(kv.value)
            if record is not None:
                named.update(record.replicas)
                if topic is not None and self.live and not set(record.isr) & self.live:
                    stranded.add(topic)
            if topic is None or record is None or self.broker_id not in record.replicas:
                continue
            if topic in self.leading:
                continue
            wanted.add(topic)
        self._say_stranded(stranded)
        await self._forget_absences(named)
        if not self._scanned:
            # Copies left from before a restart whose topics dropped this broker (or were deleted) meanwhile.
            self._scanned = True
            for topic in await asyncio.to_thread(_local_copies, self.storage.wal_root):
                if topic not in wanted and topic not in self.leading and self._gone(topic):
                    await self._drop_copy(topic)
        for topic in list(self.followers):
            if topic not in wanted and topic not in self.leading:
                await self.stop_following(topic)
                await self._drop_copy(topic)
        for topic in wanted:
            if topic in self.leading:
                continue  # a load began while this pass awaited: its WAL is the leader's now
            follower = self.followers.get(topic)
            if follower is None:
                follower = ReplicaFollower(
                    TopicName.parse(topic),
                    self.storage,
                    self.broker_id,
                    lambda t=topic: self._target(t),  # type: ignore[misc]
                    self.channels,
                )
                self.followers[topic] = follower
                follower.start()
            elif (why := follower.ended) is not None:
                # Its loop must never end while it is wanted; if it did, following resumes here and says so.
                log.error("%s: this broker's copy had stopped following (%r); following again", topic, why)
                follower.start()
            else:
                follower.poke()

    def _gone(self, topic: str) -> bool:
        """A replicated topic that no longer lists this broker, or a deleted one that was replicated: a
        single-copy topic's WAL (no record, not deleted) is the superseded sweep's business."""
        kv = self.node.cache.get(keys.replicas(topic))
        if kv is None:
            return False
        record = ReplicaRecord.parse(kv.value)
        return record is not None and self.broker_id not in record.replicas

    async def _drop_copy(self, topic: str) -> None:
        """This broker no longer holds a copy of `topic` (replaced, or the topic was deleted): its WAL goes.
        The in-sync replicas hold every committed record; one it leads or was assigned is left alone."""
        if self.node.assigned_here(topic):
            return
        record = self.record_of(topic)
        if record is not None and self.broker_id in record.replicas:
            return
        name = TopicName.parse(topic)
        await self.storage.remove_local(name)
        await self.storage.forget_epoch(name)
        log.info("%s: this broker is no longer a replica; its copy was deleted", topic)

    def _target(self, topic: str) -> LeaderTarget | None:
        record = self.record_of(topic)
        if record is None or record.leader == NO_LEADER or record.leader == self.broker_id:
            return None
        url = self.node.url_of(record.leader)
        return LeaderTarget(record.epoch, record.leader, url) if url else None

    async def stop_following(self, topic: str) -> int:
        """Stop this broker's follower of `topic` (its WAL closed); returns the last commit it heard of."""
        follower = self.followers.pop(topic, None)
        if follower is not None:
            await follower.stop()
            self._committed_hint[topic] = max(self._committed_hint.get(topic, 0), follower.leader_committed)
        return self._committed_hint.pop(topic, 0)

    def local_copy(self, topic: str) -> CopyEnd | None:
        """This broker's copy of a replicated topic it follows or leads (None: it holds none open)."""
        follower = self.followers.get(topic)
        if follower is not None and follower.wal is not None:
            wal = follower.wal
            return CopyEnd(follower.history.last_epoch, wal.durable_offset, follower.leader_committed)
        leader = self.leaders.get(topic)
        if leader is not None:
            return CopyEnd(leader.history.last_epoch, leader.wal.durable_offset, leader.committed)
        return None

    def followed(self) -> list[tuple[str, int, int]]:
        """(topic, records appended, bytes appended) of every copy followed here, for the load report."""
        return [(t, f.records_appended, f.bytes_appended) for t, f in self.followers.items()]

    # -- leading ---------------------------------------------------------------------------------------
    def begin_leading(self, topic: str) -> None:
        self.leading.add(topic)

    def end_leading(self, topic: str) -> None:
        self.leading.discard(topic)
        self.leaders.pop(topic, None)  # the next sync follows it again if this broker is still a replica

    def _say_stranded(self, stranded: set[str]) -> None:
        """The cluster leader says which topics have no live in-sync replica (once as each becomes so, and
        in a gauge): nothing can fail them over without losing acknowledged records."""
        if self.node.leader() != self.broker_id:
            metrics.without_live_isr.set(0)
            self._stranded = set()
            return
        for topic in sorted(stranded - self._stranded):
            record = self.record_of(topic)
            log.error(
                "%s: no live in-sync replica (in sync: %s, all gone): it cannot fail over without losing "
                "acknowledged records and waits for one of them to return with its disk",
                topic,
                record.isr if record is not None else "?",
            )
        for topic in sorted(self._stranded - stranded):
            log.warning("%s: an in-sync replica is live again", topic)
        self._stranded = stranded
        metrics.without_live_isr.set(len(stranded))

    # -- absent brokers: the replacement clock, in metadata ----------------------------------------------
    def absences(self) -> dict[int, float]:
        """Broker -> wall-clock time it was first seen gone, as kept in `/ister/absent-brokers/`."""
        out: dict[int, float] = {}
        for kv in self.node.cache.list(keys.ABSENT_BROKERS_PREFIX):
            broker = keys.broker_ids([kv.key], keys.ABSENT_BROKERS_PREFIX)
            since = kv.value.get("since") if isinstance(kv.value, dict) else None
            if broker and isinstance(since, int | float):
                out[broker[0]] = float(since)
        return out

    async def note_absent(self, seen: dict[int, float], restamp: bool) -> None:
        """Start the clock of brokers first seen gone (a clock another leader started is kept), or, with
        `restamp`, start it again now (it was stamped by a clock ahead of this one)."""
        for broker, since in seen.items():
            key = keys.absent_broker(broker)
            if restamp:
                await self.store.put(key, {"since": since})
                log.warning("broker %d's absence was stamped in the future: its wait starts again", broker)
            elif await self.store.txn([Compare(key, None)], [Put(key, {"since": since})]):
                log.info("broker %d is gone: its replicas are replaced if it stays away", broker)

    async def _forget_absences(self, named: set[int]) -> None:
        """The cluster leader deletes the clock of a broker that is back, or that no replica names any more
        (replaced everywhere, or its id lost with its disk)."""
        if self.node.leader() != self.broker_id:
            return
        for broker in clocks_to_forget(self.absences(), self.live, named):
            try:
                await self.store.delete(keys.absent_broker(broker))
            except MetadataError as exc:  # the next pass tries again; following goes on meanwhile
                log.warning("forgetting broker %d's absence failed (%s); retried", broker, exc)

    def peers(self) -> tuple[set[int], set[int]]:
        """(live brokers, active brokers: live and neither draining nor drained)."""
        self.node.view.refresh()
        state = self.node.view.state()
        return set(state.live), state.active()

    def choose_followers(self, count: int, prefer: list[int], exclude: set[int] | None = None) -> list[int]:
        """`count` active brokers other than this one (and `exclude`): those that already hold a copy first,
        then the least loaded (led topics and follower copies, `rank_replica_candidates`), one per zone
        first."""
        _, active = self.peers()
        live = [b for b in sorted(active) if b != self.broker_id and b not in (exclude or set())]
        copies: Counter[int] = Counter()
        for kv in self.node.cache.list(keys.REPLICAS_PREFIX):
            record = ReplicaRecord.parse(kv.value)
            if record is not None:
                copies.update(b for b in record.replicas if b != record.leader)
        ranked = rank_replica_candidates(live, prefer, self.node.balancer.reports(), copies)
        zones = {b: self.zone_of(b) for b in [self.broker_id, *ranked, *(exclude or set())]}
        return spread_over_zones(
            ranked, zones, {zones[b] for b in [self.broker_id, *(exclude or set())]}, count
        )

    def zone_of(self, broker_id: int) -> str:
        kv = self.node.cache.get(keys.broker_register(broker_id))
        reg = BrokerRegistration.parse(kv.value) if kv is not None else None
        return reg.zone if reg is not None else ""


def _local_copies(wal_root: Path) -> list[str]:
    """Full names of the topics this broker has a WAL directory for."""
    out: list[str] = []
    if not wal_root.is_dir():
        return out
    for ns in wal_root.iterdir():
        if ns.is_dir():
            for topic in ns.iterdir():
                name = keys.replicas_topic(f"{keys.REPLICAS_PREFIX}{ns.name}/{topic.name}")
                if topic.is_dir() and name is not None:  # None: not a valid topic name
                    out.append(name)
    return out
