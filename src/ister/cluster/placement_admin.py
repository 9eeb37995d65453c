"""`ClusterAdmin`: the admin API's view of placement (ister.ports.placement_admin) in cluster mode: owners
from the assignment keys, replicas from the replication manager, brokers from their registrations, drain,
balance and rebalancing through the leader's balancer."""

from __future__ import annotations

import time

from ister.cluster import recovery
from ister.cluster.balancer import set_broker_mode
from ister.cluster.node import ClusterNode
from ister.cluster.replicated import ReplicatedTopics
from ister.core.cluster.health import (
    ClusterHealth,
    clamp_moves,
    failed_moves,
    recent_moves,
    replication_issues,
)
from ister.core.cluster.load import LoadReport, imbalance, rank
from ister.core.cluster.moves import MoveFailure
from ister.core.cluster.ownership import OwnerRecord
from ister.core.cluster.planner import ACTIVE, DRAINED, DRAINING
from ister.core.replication import CopyEnd, Recovery, ReplicaRecord, Survey
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ister.ids import TopicName, shown
from ister.metadata import keys
from ister.metadata.records import BrokerRegistration
from ister.metadata.store import MetadataStore, list_all
from ister.metadata.topic_index import Assignments
from ister.ports.placement_admin import (
    FOLLOWER_ROLE,
    LEADER_ROLE,
    NO_ROLE,
    BrokerInfo,
    BrokerLoad,
    ClusterBalance,
    DrainPlan,
    RebalanceResult,
)


class ClusterAdmin:
    def __init__(self, node: ClusterNode, store: MetadataStore, replicated: ReplicatedTopics) -> None:
        self.node = node
        self.store = store
        self.replicated = replicated

    # -- the admin API's view ---------------------------------------------------------------------------
    async def _assignments(self) -> dict[str, int]:
        """topic -> owner broker, from the assignment keys (exact names; state keys skipped)."""
        return keys.assignments(kv.key for kv in await list_all(self.store, keys.BROKERS_PREFIX))

    async def owners(self, names: list[TopicName]) -> dict[str, int | None]:
        return await self.owners_by_name([n.full for n in names])

    async def owners_by_name(self, names: list[str]) -> dict[str, int | None]:
        assigned = await self._assignments()
        return {n: assigned.get(n) for n in names}

    def owner_index(self) -> Assignments | None:
        return self.node.assignments

    def replica_lag(self, topic: str) -> dict[int, int] | None:
        leader = self.replicated.manager.leaders.get(topic)
        return leader.lag() if leader is not None else None

    def local_copy(self, topic: str) -> CopyEnd | None:
        return self.replicated.manager.local_copy(topic)

    async def recovery_survey(self, name: TopicName) -> Survey:
        return await recovery.survey(self.store, name)

    async def recovery_plan(self, name: TopicName, found: Survey, copies: dict[int, CopyEnd]) -> Recovery:
        return await recovery.plan(self.store, name, found, copies)

    async def write_recovery(self, name: TopicName, found: Survey, plan: Recovery) -> None:
        await recovery.write(self.store, name, found, plan)

    async def owner(self, name: TopicName) -> int | None:
        kv = await self.store.get(keys.owner(name))
        record = OwnerRecord.parse(kv.value) if kv is not None else None
        if (
            record is not None
            and record.broker_id <= keys.U64_MAX
            and await self.store.get(keys.broker_topic(record.broker_id, name)) is not None
        ):
            return record.broker_id
        # No (matching) owner record: fall back to the assignment keys themselves.
        return (await self._assignments()).get(name.full)

    async def broker_topics(self, broker_id: int) -> list[str]:
        listing = await list_all(self.store, keys.broker_topics_prefix(broker_id))
        topics = keys.broker_topics((kv.key for kv in listing), broker_id)
        if not topics and await self.store.get(keys.broker_register(broker_id)) is None:
            raise NotFound(f"broker {broker_id} is not registered and owns no topics")
        return topics

    async def leader(self) -> int | None:
        kv = await self.store.get(keys.LEADER)
        value = kv.value if kv is not None else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    async def brokers(self) -> list[BrokerInfo]:
        leader = await self.leader()
        out: list[BrokerInfo] = []
        for kv in await list_all(self.store, keys.REGISTER_PREFIX):
            ids = keys.broker_ids([kv.key])
            if not ids:
                continue
            bid = ids[0]
            reg = BrokerRegistration.parse(kv.value) or BrokerRegistration()
            state = await self.store.get(keys.broker_state(bid))
            mode = state.value.get("mode") if state is not None and isinstance(state.value, dict) else None
            role = NO_ROLE if leader is None else LEADER_ROLE if bid == leader else FOLLOWER_ROLE
            out.append(
                BrokerInfo(
                    bid,
                    reg.broker_url or reg.broker_addr,
                    reg.admin_addr,
                    reg.prom_exporter,
                    role,
                    mode if isinstance(mode, str) else "active",
                )
            )
        return sorted(out, key=lambda b: b.broker_id)

    async def admin_addr_of(self, broker_id: int) -> str:
        kv = await self.store.get(keys.broker_register(broker_id))
        reg = BrokerRegistration.parse(kv.value) if kv is not None else None
        return reg.admin_addr if reg is not None and reg.admin_addr else "unknown admin address"

    def _registered(self, text: str) -> int:
        if not text.isdigit():
            raise InvalidArgument(f"broker id must be a decimal number, got {shown(text)}")
        broker = int(text)
        if self.node.cache.get(keys.broker_register(broker)) is None:
            raise NotFound(f"broker {broker} is not registered")
        return broker

    async def drain(self, broker: str, dry_run: bool) -> DrainPlan:
        """The broker gets no new topics and the leader moves its topics away one at a time."""
        bid = self._registered(broker)
        state, _, _ = self.node.snapshot()
        owned = [t for t, b in state.assignments.items() if b == bid]
        if dry_run:
            return DrainPlan(started=False, total=len(owned), pending=len(owned))
        if not state.active() - {bid}:
            raise FailedPrecondition(f"cannot drain broker {bid}: no other active broker")
        await set_broker_mode(self.node, bid, DRAINING if owned else DRAINED, "admin_unload")
        return DrainPlan(started=True, total=len(owned), pending=len(owned))

    async def activate(self, broker: str, reason: str) -> None:
        await set_broker_mode(self.node, self._registered(broker), ACTIVE, reason or "admin_activate")

    async def balance(self) -> ClusterBalance:
        balancer = self.node.balancer
        state, _, _ = self.node.snapshot()
        rankings = rank(balancer.strategy, balancer.reports())
        imb = imbalance(rankings, state.active())
        return ClusterBalance(
            coefficient_of_variation=imb.cv,
            mean_load=imb.mean,
            max_load=imb.max_load,
            min_load=imb.min_load,
            std_deviation=imb.std_dev,
            broker_count=imb.broker_count,
            brokers=[
                BrokerLoad(
                    broker_id=b,
                    load=score,
                    topic_count=sum(1 for owner in state.assignments.values() if owner == b),
                    overloaded=b in imb.overloaded,
                    underloaded=b in imb.underloaded,
                )
                for b, score in rankings
            ],
            strategy=balancer.strategy,
        )

    async def load_reports(self) -> list[LoadReport]:
        reports = self.node.balancer.reports()
        return [reports[b] for b in sorted(reports)]

    async def rebalance(self, dry_run: bool, max_moves: int | None) -> RebalanceResult:
        """Dry run: the moves rebalancing would make. Otherwise start one move now (pacing applies)."""
        now = time.time()
        balancer = self.node.balancer
        if dry_run:
            plan = balancer.dry_run(now, max_moves)
            return RebalanceResult(executed=0, moves=list(plan.moves), detail=plan.detail)
        leader = self.node.cache.get(keys.LEADER)
        if leader is None:
            raise Unavailable("no cluster leader right now; retry")
        decision = await balancer.check(leader, now, manual=True)
        moves = [decision.move] if decision.move is not None else []
        return RebalanceResult(executed=len(moves), moves=moves, detail=decision.detail)

    async def cluster_health(self, max_moves: int) -> ClusterHealth:
        """From this broker's metadata cache (it follows the history, the move failures and the replica
        records), so it costs no etcd listing at any topic count. One read of the leader key first: with
        etcd unreachable the answer is UNAVAILABLE, not a picture that may be stale."""
        await self.store.get(keys.LEADER)
        cache = self.node.cache
        moves, total = recent_moves((m for _, m in self.node.balancer.history()), clamp_moves(max_moves))
        notes: list[tuple[str, MoveFailure]] = []
        for kv in cache.list(keys.MOVE_FAILURES_PREFIX):
            topic, note = keys.move_failure_topic_from_key(kv.key), MoveFailure.parse(kv.value)
            if topic is not None and note is not None:
                notes.append((topic, note))
        records: list[tuple[str, ReplicaRecord]] = []
        for kv in cache.list(keys.REPLICAS_PREFIX):
            topic, record = keys.replicas_topic(kv.key), ReplicaRecord.parse(kv.value)
            if topic is not None and record is not None:
                records.append((topic, record))
        under, below_min, replicated = replication_issues(records, set(self.node.live_brokers()))
        return ClusterHealth(
            mode="cluster",
            moves=moves,
            moves_total=total,
            failed_moves=failed_moves(notes, time.time()),
            under_replicated=under,
            under_min_isr=below_min,
            replicated_topics=replicated,
        )
