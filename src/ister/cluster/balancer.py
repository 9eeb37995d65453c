"""The leader's load manager loop (docs/architecture.md §13): balance metrics, automated rebalancing and
broker drain.

Every move — rebalancing or drain — goes through the unload path of the durable tier: one transaction
deletes the assignment and writes `{"reason":"unload","from_broker","to_broker"?,"ready":false}`; the owner
seals the topic and flips `ready`; the leader then assigns it (to `to_broker` when that broker is active).
An owner that cannot seal (no durable tier, the store down) keeps the topic and records why; the planner and
the drain then leave that topic alone for a growing backoff (`core/cluster/moves.py`). Nothing is ever
deleted. Moves are recorded under `/cluster/rebalancing_history/{unix_secs}`, which is also the history
the rate limits read, so a new leader keeps honouring them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ister.cluster import metrics as cluster_metrics
from ister.core.cluster.assignment import Marker
from ister.core.cluster.load import LoadReport, imbalance, rank
from ister.core.cluster.moves import MoveFailure, backing_off
from ister.core.cluster.planner import ACTIVE, DRAINED, DRAINING
from ister.core.cluster.rebalance import Decision, DryRun, Move, RebalanceConfig, RebalancePlanner
from ister.metadata import keys
from ister.metadata.store import Compare, Delete, KeyValue, Op, Put

if TYPE_CHECKING:
    from ister.cluster.node import ClusterNode

log = logging.getLogger(__name__)

HISTORY_KEEP_SECONDS = 2 * 3600
STEP_SECONDS = 1.0  # older history entries no longer affect any limit


class Balancer:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        lm = node.config.load_manager
        self.strategy = lm.assignment_strategy
        self.config = RebalanceConfig.from_mapping(lm.rebalancing or None)  # ConfigError at start
        self.planner = RebalancePlanner(self.config, self.strategy)
        self.first_seen: dict[str, float] = {}  # topic -> when this leader first saw it assigned
        self.last_check = 0.0
        self.last_step = 0.0
        self._stuck_logged: set[tuple[int, str, int]] = set()
        self._parsed: dict[str, tuple[int, LoadReport | None]] = {}  # report key -> (version, report)

    # -- views ------------------------------------------------------------------------------------------
    def reports(self) -> dict[int, LoadReport]:
        live = set(self.node.live_brokers())
        found: dict[int, LoadReport] = {}
        parsed: dict[str, tuple[int, LoadReport | None]] = {}
        for kv in self.node.cache.list(keys.LOAD_PREFIX):
            # Parsed once per version: every follower placement reads them too, not only the leader.
            cached = self._parsed.get(kv.key)
            if cached is None or cached[0] != kv.version:
                cached = (kv.version, LoadReport.parse(kv.value))
            parsed[kv.key] = cached
            report = cached[1]
            if report is not None and report.broker_id in live:
                found[report.broker_id] = report
        self._parsed = parsed
        for broker in live - set(found):
            found[broker] = LoadReport.empty(broker)
        return found

    def history(self) -> list[tuple[KeyValue, Move]]:
        out = []
        for kv in self.node.cache.list(keys.REBALANCING_HISTORY_PREFIX):
            move = Move.parse(kv.value)
            if move is not None:
                out.append((kv, move))
        return out

    def failed_moves(self, now: float) -> dict[str, MoveFailure]:
        """Topics whose last move failed and that are still in their backoff (the owner recorded why)."""
        out: dict[str, MoveFailure] = {}
        for kv in self.node.cache.list(keys.MOVE_FAILURES_PREFIX):
            topic = keys.move_failure_topic_from_key(kv.key)
            note = MoveFailure.parse(kv.value)
            if topic is not None and note is not None and backing_off(note, now):
                out[topic] = note
        return out

    def movable(self, assignments: dict[str, int], now: float) -> dict[str, int]:
        """The assignments the planner may move: not the topics backing off after a failed move."""
        failed = self.failed_moves(now)
        return {t: b for t, b in assignments.items() if t not in failed} if failed else assignments

    def decide(self, now: float, manual: bool = False) -> Decision:
        state, _, _ = self.node.snapshot()
        for topic in state.assignments:
            self.first_seen.setdefault(topic, now)
        for gone in set(self.first_seen) - set(state.assignments):
            del self.first_seen[gone]
        return self.planner.plan(
            self.reports(),
            state.active(),
            self.first_seen,
            [m for _, m in self.history()],
            now,
            owners=self.movable(state.assignments, now),
            manual=manual,
        )

    def dry_run(self, now: float, max_moves: int | None = None) -> DryRun:
        state, _, _ = self.node.snapshot()
        return self.planner.dry_run(
            self.reports(),
            state.active(),
            {t: self.first_seen.get(t, now) for t in state.assignments},
            [m for _, m in self.history()],
            now,
            owners=state.assignments,
            max_moves=max_moves,
        )

    def publish_balance(self) -> None:
        state, _, _ = self.node.snapshot()
        active = state.active()
        imb = imbalance(rank(self.strategy, self.reports()), active)
        cluster_metrics.balance_cv.set(imb.cv)
        cluster_metrics.balance_mean.set(imb.mean)
        cluster_metrics.balance_max.set(imb.max_load)
        cluster_metrics.balance_min.set(imb.min_load)
        cluster_metrics.balance_std.set(imb.std_dev)
        cluster_metrics.active_brokers.set(len(active))

    # -- one leader step ---------------------------------------------------------------------------------
    async def step(self, leader: KeyValue) -> None:
        """Called by the node's leader loop: balance gauges, drains, and a rebalancing check when due.

        At most once per STEP_SECONDS: the leader loop runs on every metadata change, and a burst of
        assignments must not pay for three cluster snapshots per change.
        """
        if time.monotonic() - self.last_step < STEP_SECONDS:
            return
        self.last_step = time.monotonic()
        self.publish_balance()
        await self.drain_step(leader)
        now = time.time()
        if self.config.enabled and now - self.last_check >= self.config.check_interval_seconds:
            self.last_check = now
            await self.check(leader, now)
        await self.prune_history(leader, now)

    async def check(self, leader: KeyValue, now: float, manual: bool = False) -> Decision:
        started = time.monotonic()
        cluster_metrics.rebalancing_checks.inc()
        try:
            decision = self.decide(now, manual)
            if decision.move is not None:
                if await self.execute(leader, decision.move):
                    cluster_metrics.rebalancing_moves.inc()
                else:
                    cluster_metrics.rebalancing_failures.inc()
            else:
                log.debug("rebalancing: %s", decision.detail)
            return decision
        finally:
            cluster_metrics.rebalancing_cycle.observe(time.monotonic() - started)

    async def execute(self, leader: KeyValue, move: Move) -> bool:
        """Start one move through the unload path; False when the cluster changed under it."""
        ok = await self.unload(leader, move.topic, move.from_broker, move.to_broker, [
            Put(keys.rebalancing_history(int(move.timestamp)), move.to_json())
        ])  # fmt: skip
        if ok:
            log.info("rebalancing: moving %s from %d to %d", move.topic, move.from_broker, move.to_broker)
        return ok

    async def unload(
        self, leader: KeyValue, topic: str, owner: int, to_broker: int | None, extra: list[Op] | None = None
    ) -> bool:
        assignment = self.node.cache.get(keys.broker_topic(owner, topic))
        if assignment is None:
            return False
        marker = Marker(reason="unload", from_broker=owner, to_broker=to_broker, ready=False).to_json()
        return await self.node.store.txn(
            [
                Compare(keys.LEADER, leader.version),
                Compare(assignment.key, assignment.version),
                Compare(keys.unassigned(topic), None),
            ],
            [Delete(assignment.key), Put(keys.unassigned(topic), marker), *(extra or [])],
        )

    async def prune_history(self, leader: KeyValue, now: float) -> None:
        for kv, move in self.history():
            if now - move.timestamp > max(HISTORY_KEEP_SECONDS, self.config.recent_move_window):
                await self.node.store.txn([Compare(keys.LEADER, leader.version)], [Delete(kv.key)])

    # -- drain -------------------------------------------------------------------------------------------
    async def drain_step(self, leader: KeyValue) -> None:
        """Move a draining broker's topics away one at a time; mark it drained when none is left."""
        state, _, unassigned_kvs = self.node.snapshot()
        for broker, mode in state.modes.items():
            if mode != DRAINING:
                continue
            owned = sorted(t for t, b in state.assignments.items() if b == broker)
            moving = [t for t, kv in unassigned_kvs.items() if Marker.parse(kv.value).from_broker == broker]
            if moving:
                continue  # one move at a time per broker: the next once this one is assigned
            if owned:
                if not state.active() - {broker}:
                    log.warning("cannot drain broker %d: no other active broker", broker)
                    continue
                failed = self.failed_moves(time.time())
                ready = [t for t in owned if t not in failed]
                self._report_stuck(broker, {t: failed[t] for t in owned if t in failed})
                if ready and await self.unload(leader, ready[0], broker, None):
                    log.info("draining broker %d: moving %s (%d left)", broker, ready[0], len(owned) - 1)
                continue
            await self.node.store.txn(
                [Compare(keys.LEADER, leader.version)],
                [Put(keys.broker_state(broker), {"mode": DRAINED, "reason": "drain_complete"})],
            )
            log.info("broker %d is drained", broker)

    def _report_stuck(self, broker: int, stuck: dict[str, MoveFailure]) -> None:
        """Log once per topic and failure why a draining broker keeps it (the drain retries after backoff)."""
        for topic, note in stuck.items():
            seen = (broker, topic, note.failures)
            if seen not in self._stuck_logged:
                self._stuck_logged.add(seen)
                log.warning(
                    "draining broker %d: cannot move %s (%d failed attempts, retried later): %s",
                    broker,
                    topic,
                    note.failures,
                    note.cause,
                )
        if len(self._stuck_logged) > 10_000:
            self._stuck_logged.clear()


async def set_broker_mode(node: ClusterNode, broker: int, mode: str, reason: str) -> None:
    """Admin: drain (`draining`; `drained` when it owns nothing) or reactivate (`active`) a broker."""
    if mode not in (ACTIVE, DRAINING, DRAINED):
        raise ValueError(mode)
    await node.store.put(keys.broker_state(broker), {"mode": mode, "reason": reason})
