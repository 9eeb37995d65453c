"""What every part of a `ClusterNode` (node.py) shares: its membership, caches and feeds, the ownership
guards of its topics, and claiming a topic (the owner record read, the claim committed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path

from ister.cluster.assigner import Assigner
from ister.cluster.balancer import Balancer
from ister.cluster.guard import OwnershipGuard
from ister.cluster.load_report import LoadReporter
from ister.cluster.membership import LeaseClock, Membership, load_broker_id
from ister.cluster.view import ClusterView
from ister.config import BrokerConfig
from ister.core.cluster.ownership import OwnerRecord
from ister.errors import Unavailable
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.store import Compare, MetadataStore, Put
from ister.metadata.topic_index import Assignments
from ister.ports.host import TopicHost
from ister.tasks import TaskSupervisor

LOAD_CONCURRENCY = 8


class NodeBase:
    # made by `ClusterNode.__init__`: they are given the whole node
    membership: Membership
    balancer: Balancer
    assigner: Assigner

    def __init__(self, config: BrokerConfig, store: MetadataStore, data_dir: Path) -> None:
        self.config = config
        self.store = store
        self.broker_id = load_broker_id(data_dir)
        self.cache = LocalCache(
            store,
            [
                keys.CLUSTER_PREFIX,
                keys.OWNERS_PREFIX,
                keys.MOVE_FAILURES_PREFIX,
                keys.REPLICAS_PREFIX,
                keys.ABSENT_BROKERS_PREFIX,
            ],
        )
        self.view = ClusterView(self.cache)
        self.reporter = LoadReporter(self.broker_id, durable_tier=config.durable_url(data_dir) is not None)
        # (topic, records appended, bytes appended) of each follower copy kept here, for the load report.
        self.followed: Callable[[], Iterable[tuple[str, int, int]]] = tuple
        self.guards: dict[str, OwnershipGuard] = {}
        self._host: TopicHost | None = None
        self._tasks = TaskSupervisor("cluster node")  # its loops and the topic loads in progress
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._load_slots = asyncio.Semaphore(LOAD_CONCURRENCY)
        self._mine: set[str] = set()  # topics assigned to this broker
        self._mine_feed = self.cache.feed(keys.broker_topics_prefix(self.broker_id))
        self._owners_feed = self.cache.feed(keys.OWNERS_PREFIX)
        # Each topic's owner and the counts per broker, for the admin API's topic listing.
        self.assignments = Assignments(self.cache)
        self._swept = 0.0
        self._markers_feed = self.cache.feed(keys.UNASSIGNED_PREFIX)

    @property
    def clock(self) -> LeaseClock:
        return self.membership.clock

    def assigned_here(self, topic: str) -> bool:
        return self.cache.get(keys.broker_topic(self.broker_id, topic)) is not None

    # -- claiming a topic (called by the broker service while loading) -------------------------------------
    async def read_owner(self, topic: str, *, fresh: bool = False) -> tuple[OwnerRecord, tuple[int, int]]:
        """The owner record and the versions (record, assignment key) a claim compares.

        From the cache when it has both (a stale pair only makes the claim's compare fail: the caller then
        asks again with `fresh=True`), else from the store. Unavailable unless the record names this broker
        and its assignment key exists.
        """
        kv = None if fresh else self.cache.get(keys.owner(topic))
        assignment = None if fresh else self.cache.get(keys.broker_topic(self.broker_id, topic))
        if kv is None or assignment is None:
            kv = await self.store.get(keys.owner(topic))
            assignment = await self.store.get(keys.broker_topic(self.broker_id, topic))
        record = OwnerRecord.parse(kv.value) if kv is not None else None
        if kv is None or record is None or record.broker_id != self.broker_id:
            raise Unavailable(f"topic {topic} is not assigned to this broker; redo the lookup")
        if assignment is None:
            raise Unavailable(f"topic {topic} is being reassigned; redo the lookup")
        return record, (kv.version, assignment.version)

    async def commit_claim(
        self, topic: str, versions: tuple[int, int], record: OwnerRecord
    ) -> OwnershipGuard:
        """Write the loading owner's record and return the guard that fences the topic.

        Compares the record and the assignment key as read: a failover that deleted the assignment meanwhile
        (it leaves the record alone) makes the claim fail instead of producing a second writer.
        """
        self.clock_check(topic)
        key = keys.owner(topic)
        ok = await self.store.txn(
            [Compare(key, versions[0]), Compare(keys.broker_topic(self.broker_id, topic), versions[1])],
            [Put(key, record.to_json())],
        )
        if not ok:
            raise Unavailable(f"topic {topic} was reassigned while loading; redo the lookup")
        kv = await self.store.get(key)
        if kv is None or OwnerRecord.parse(kv.value) != record:
            raise Unavailable(f"topic {topic} was reassigned while loading; redo the lookup")
        guard = OwnershipGuard(
            topic, self.store, self.clock, record, kv.version, self.config.cluster.offset_reservation
        )
        old = self.guards.pop(topic, None)
        if old is not None:
            old.revoke("reloaded")
        self.guards[topic] = guard
        return guard

    def clock_check(self, topic: str) -> None:
        if not self.clock.valid():
            raise Unavailable(f"topic {topic}: this broker cannot renew its lease right now")

    def forget(self, topic: str) -> None:
        guard = self.guards.pop(topic, None)
        if guard is not None:
            guard.revoke("unloaded")
