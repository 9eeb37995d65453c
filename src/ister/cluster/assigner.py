"""The cluster leader's assignment pass (run by `ClusterNode` while it leads): dead brokers' topics become
unassigned (failover), moves whose old owner died become failovers, unassigned topics get owners (Fair,
round-robin among near-equal brokers, or the load reports' scores; replicated topics only to their in-sync
replicas), each assignment bumping the topic's epoch in one transaction guarded by the leader key and by
what the decision was based on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ister.cluster import metrics as cluster_metrics
from ister.core.cluster.assignment import BrokerSelector
from ister.core.cluster.load import FOLLOWER_WEIGHT, rank
from ister.core.cluster.ownership import OwnerRecord, assign
from ister.core.cluster.planner import ClusterState, abandoned_moves, orphans, plan_assignments
from ister.core.replication import ReplicaRecord
from ister.errors import IsterError
from ister.metadata import keys
from ister.metadata.store import MAX_TXN_OPS, Compare, Delete, KeyValue, Op, Put

if TYPE_CHECKING:
    from ister.cluster.node import ClusterNode

log = logging.getLogger(__name__)

RECENT_ASSIGNMENT_SECONDS = 30.0  # a leader's own assignments count until its cache shows them
ASSIGN_CONCURRENCY = 32


class Assigner:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.selector = BrokerSelector()
        self.assignments_made = 0
        self.leader_since: float | None = None  # when this broker last became the leader (monotonic)
        # Markers (key -> version) this leader already consumed, until its cache shows them gone: a pass
        # that runs before the cache caught up must not plan them again (the write would only fail).
        self._consumed: dict[str, int] = {}
        self._recent: dict[str, tuple[int, float]] = {}  # topic -> (broker, when) assigned, not yet cached

    def _strategy_scores(self, state: ClusterState) -> dict[int, float] | None:
        """Balanced / WeightedLoad: the brokers' scores from their latest load reports, plus one unit per
        topic assigned since a report was written (so a burst spreads before fresh reports arrive).
        Fair counts assignments directly, plus FOLLOWER_WEIGHT per follower copy its report names (None:
        no broker reports copies, plain counts)."""
        reports = self.node.balancer.reports()
        if self.node.balancer.strategy == "fair":
            followed = {b: r.followed_topics for b, r in reports.items() if r.followed_topics}
            if not followed:
                return None
            return {b: n + FOLLOWER_WEIGHT * followed.get(b, 0) for b, n in state.topic_counts().items()}
        scores = {b: float(v) for b, v in rank(self.node.balancer.strategy, reports)}
        for topic, broker in state.assignments.items():
            report = reports.get(broker)
            if broker in scores and (report is None or report.topic(topic) is None):
                scores[broker] += 1.0
        return scores

    async def assign(self, leader: KeyValue) -> None:
        state, assignment_kvs, unassigned_kvs = self.node.snapshot()
        guard = Compare(keys.LEADER, leader.version)
        writes: list[_Write] = []
        # Brokers that restart together need a moment to re-register before their topics are taken away.
        settled = time.monotonic() - (self.leader_since or 0.0) >= self.node.membership.ttl
        if settled:
            writes.extend(self._abandoned_move_writes(state, unassigned_kvs))
        if settled and self.node.view.has_orphans():
            for orphan in orphans(state):
                kv = assignment_kvs[orphan.topic]
                # The broker must still be unregistered: it may have come back and reloaded the topic.
                dead = Compare(keys.broker_register(orphan.dead_broker), None)
                compares = [Compare(kv.key, kv.version), dead]
                ops: list[Op] = [Delete(kv.key)]
                marker = keys.unassigned(orphan.topic)
                if orphan.topic not in unassigned_kvs:
                    compares.append(Compare(marker, None))
                    ops.append(Put(marker, {"reason": "failover", "from_broker": orphan.dead_broker}))
                writes.append(_Write(f"failover {orphan.topic} from {orphan.dead_broker}", compares, ops))
        # Assignments this leader made that its cache does not show yet count for the next choices too;
        # otherwise a lagging cache makes the same "lightest" broker win pass after pass.
        now = time.monotonic()
        for topic, (broker, at) in list(self._recent.items()):
            if topic in state.assignments or now - at > RECENT_ASSIGNMENT_SECONDS:
                del self._recent[topic]
            else:
                state.assignments[topic] = broker
        self._consumed = {
            k: v
            for k, v in self._consumed.items()
            if (seen := self.node.cache.get(k)) is not None and seen.version == v
        }
        for t in [t for t, kv in unassigned_kvs.items() if self._consumed.get(kv.key) == kv.version]:
            del state.unassigned[t]
        plan = plan_assignments(
            state, self.selector, scores=self._strategy_scores(state), eligible=self._eligible(state)
        )
        for step in plan:
            topic = step.topic
            marker_kv = unassigned_kvs[topic]
            owner_kv = self.node.cache.get(keys.owner(topic))
            previous = OwnerRecord.parse(owner_kv.value) if owner_kv is not None else None
            target = self.node.cache.get(keys.broker_register(step.broker))
            if target is None:
                continue
            compares = [
                Compare(marker_kv.key, marker_kv.version),
                Compare(keys.owner(topic), owner_kv.version if owner_kv is not None else None),
                Compare(target.key, target.version),  # the new owner is still registered as seen
            ]
            ops = [
                Put(keys.broker_topic(step.broker, topic), None),
                Put(keys.owner(topic), assign(previous, step.broker).to_json()),
                Delete(marker_kv.key),
            ]
            old = assignment_kvs.get(topic)
            if old is not None and old.key != keys.broker_topic(step.broker, topic):
                compares.append(Compare(old.key, old.version))
                ops.append(Delete(old.key))
            write = _Write(f"assign {topic} to {step.broker}", compares, ops)
            write.assigned = (topic, step.broker, marker_kv)
            writes.append(write)
        if writes:
            await self._apply_writes(guard, writes)

    def _eligible(self, state: ClusterState) -> dict[str, set[int]]:
        """Replicated topics waiting for an owner: only their in-sync replicas may take them over."""
        out: dict[str, set[int]] = {}
        for topic in state.unassigned:
            kv = self.node.cache.get(keys.replicas(topic))
            record = ReplicaRecord.parse(kv.value) if kv is not None else None
            if record is not None:
                out[topic] = set(record.isr)
        return out

    @staticmethod
    def _abandoned_move_writes(state: ClusterState, unassigned_kvs: dict[str, KeyValue]) -> list[_Write]:
        """Unload markers whose old owner died before sealing become failovers (assigned next pass)."""
        writes = []
        for move in abandoned_moves(state):
            kv = unassigned_kvs[move.topic]
            dead = Compare(keys.broker_register(move.dead_broker), None)
            failover = {"reason": "failover", "from_broker": move.dead_broker}
            writes.append(
                _Write(
                    f"failover {move.topic}: broker {move.dead_broker} died while it was being moved",
                    [Compare(kv.key, kv.version), dead],
                    [Put(kv.key, failover)],
                )
            )
            del state.unassigned[move.topic]
        return writes

    async def _apply_writes(self, guard: Compare, writes: list[_Write]) -> None:
        """Apply the pass's writes, several per transaction (each guarded by the leader key); a batch that
        fails is retried write by write, so one lost race does not hold back the others."""
        slots = asyncio.Semaphore(ASSIGN_CONCURRENCY)

        async def commit(batch: list[_Write]) -> None:
            compares = [guard, *(c for w in batch for c in w.compares)]
            ops = [op for w in batch for op in w.ops]
            try:
                async with slots:
                    ok = await self.node.store.txn(compares, ops)
            except IsterError:
                if len(batch) == 1:
                    raise
                ok = False  # retried one by one below, where the failing write shows itself
            if ok:
                for w in batch:
                    self._applied(w)
            elif len(batch) > 1:
                await asyncio.gather(*(commit([w]) for w in batch))
            else:
                log.debug("leader %d: %s lost a race; will re-plan", self.node.broker_id, batch[0].what)

        # A batch stays within the transaction limits and never touches one key twice (etcd refuses that).
        batches: list[list[_Write]] = [[]]
        n_compares, n_ops, touched = 1, 0, set[str]()
        for w in writes:
            written = {op.key for op in w.ops}
            if batches[-1] and (
                n_compares + len(w.compares) > MAX_TXN_OPS
                or n_ops + len(w.ops) > MAX_TXN_OPS
                or not touched.isdisjoint(written)
            ):
                batches.append([])
                n_compares, n_ops, touched = 1, 0, set()
            batches[-1].append(w)
            n_compares += len(w.compares)
            n_ops += len(w.ops)
            touched |= written
        results = await asyncio.gather(*(commit(b) for b in batches), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("leader %d: assignment write failed: %s", self.node.broker_id, result)

    def _applied(self, write: _Write) -> None:
        for op in write.ops:
            if isinstance(op, Put) and (b := _assigned_broker(op.key)) is not None:
                cluster_metrics.topic_assignments.labels(str(b), "assign").inc()
            elif isinstance(op, Delete) and (b := _assigned_broker(op.key)) is not None:
                cluster_metrics.topic_assignments.labels(str(b), "unassign").inc()
        if write.assigned is not None:
            topic, broker, marker_kv = write.assigned
            self.assignments_made += 1
            self._consumed[marker_kv.key] = marker_kv.version
            self._recent[topic] = (broker, time.monotonic())
        log.info("leader %d: %s", self.node.broker_id, write.what)


@dataclass(slots=True)
class _Write:
    """One decision of the leader's pass: its compares and ops (without the leader guard)."""

    what: str
    compares: list[Compare]
    ops: list[Op]
    assigned: tuple[str, int, KeyValue] | None = None  # (topic, broker, marker) for an assignment


def _assigned_broker(key: str) -> int | None:
    """The broker of an assignment key `/cluster/brokers/{id}/{ns}/{topic}` (None for other keys)."""
    if not key.startswith(keys.BROKERS_PREFIX):
        return None
    parts = key[len(keys.BROKERS_PREFIX) :].split("/")
    return int(parts[0]) if len(parts) == 3 and parts[0].isdigit() else None
