"""Failover subscriptions on partitioned topics: one consumer per partition, spread and handed off gracefully.

The official client subscribes a partitioned topic as one consumer per partition topic (`<topic>-part-N`),
all with the same consumer name. Each partition's Failover subscription alone would pick its earliest
attached consumer, so every partition lands on the first consumer. A `PartitionGroup` gathers the
partition subscriptions of one (partitioned topic, subscription) loaded on this broker and designates
each partition's consumer with `core.dispatch.partitions`: balanced and sticky, after `rebalance_delay`
(at once when an assigned consumer's stream ends), each moving partition paused, then switched once its
delivered messages are acknowledged or `max_handoff_time` passed, its unacknowledged messages redelivered to
the new consumer. Partitions that do not move never pause.

Members are the consumer names attached on every partition of the group (a client still subscribing its
partitions joins once it has them all); with none, each partition falls back to plain Failover. In
cluster mode the groups of one subscription on every broker serving its partitions are assigned as one
(broker/partition_share.py): the broker serving partition 0 computes the map over every partition, each
broker follows it for the partitions it serves, with the same local handoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ister.broker import metrics
from ister.broker.partition_share import SharedGroups
from ister.broker.reliable import ReliableSubscription
from ister.core.dispatch.partitions import Handoff, RebalanceTimer, assign, common_members, plan_handoffs
from ister.metadata.records import DispatchConfigRecord
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05


@dataclass(slots=True)
class PartitionGroup:
    key: tuple[str, str]  # (base topic, subscription)
    rebalance_delay: float
    max_handoff: float
    subs: dict[int, ReliableSubscription] = field(default_factory=dict)
    assignment: dict[int, str] = field(default_factory=dict)
    handoffs: dict[int, Handoff] = field(default_factory=dict)
    timer: RebalanceTimer = field(init=False)
    handoffs_done: int = 0
    # Cluster mode (broker/partition_share.py): the map this group follows, and on the coordinator (the
    # broker serving partition 0) every partition's attached names and the map it wrote.
    shared: SharedGroups | None = None
    followed: dict[int, str] | None = None
    resync: bool = False
    coordinating: bool = False
    global_view: dict[int, frozenset[str]] = field(default_factory=dict)
    global_assignment: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.timer = RebalanceTimer(self.rebalance_delay)

    def configure(self, rebalance_delay: float | None, max_handoff: float | None) -> None:
        """Per-subscription settings (the admin API's dispatch config); None keeps the current value."""
        if rebalance_delay is not None:
            self.rebalance_delay = self.timer.delay = rebalance_delay
        if max_handoff is not None:
            self.max_handoff = max_handoff
            for h in self.handoffs.values():
                h.max_handoff_s = max_handoff

    def changed(self, kind: str, now: float) -> None:
        if self.shared is not None:
            self.resync = True  # the coordinator decides; here designate again (a consumer's new id)
            return
        self.timer.changed(now)
        if kind == "detach" and self._an_assigned_consumer_left():
            self.timer.due = now  # a consumer that is gone is handled at once

    def _an_assigned_consumer_left(self) -> bool:
        for p, name in self.assignment.items():
            sub = self.subs.get(p)
            if sub is not None and name not in sub.attached_names():
                return True
        return any(
            h.source is not None and h.source not in self.subs[p].attached_names()
            for p, h in self.handoffs.items()
            if p in self.subs
        )

    def members(self) -> list[str]:
        names: set[str] | None = None
        for sub in self.subs.values():
            attached = set(sub.attached_names())
            names = attached if names is None else names & attached
        return sorted(names or ())

    def step(self, now: float) -> None:
        if self.shared is not None:
            self._step_shared(now, self.shared)
        elif self.timer.fire(now):
            self._rebalance(now)
        self._progress(now)

    def _rebalance(self, now: float) -> None:
        members = self.members()
        current = {p: c for p, c in self.assignment.items() if c in members}
        self._apply(now, assign(sorted(self.subs), members, current) if members else {})

    def _step_shared(self, now: float, shared: SharedGroups) -> None:
        """Cluster mode: report the names attached here, coordinate when partition 0 is served here, and
        follow the group's map for the partitions served here."""
        base, sub = self.key
        local = {p: sorted(s.attached_names()) for p, s in self.subs.items()}
        shared.publish_members(base, sub, local)
        if 0 in self.subs:
            self._coordinate(now, shared, {p: frozenset(names) for p, names in local.items()})
        elif self.coordinating:  # partition 0 is served elsewhere now: its broker coordinates
            self.coordinating, self.global_assignment = False, {}
            shared.forget_assignment(base, sub)
        mapping = shared.assignment(base, sub)
        if mapping is not None and (mapping != self.followed or self.resync):
            self.followed, self.resync = dict(mapping), False
            self._apply(now, {p: c for p, c in mapping.items() if p in self.subs})

    def _coordinate(self, now: float, shared: SharedGroups, local: dict[int, frozenset[str]]) -> None:
        base, sub = self.key
        n = shared.partitions(base)
        if n is None:
            return
        if not self.coordinating:  # newly the coordinator: stay sticky to the map the group has
            self.coordinating = True
            self.global_assignment = dict(shared.assignment(base, sub) or {})
            self.global_view = {}
        view = {p: names for p, names in {**shared.members_view(base, sub), **local}.items() if p < n}
        if view != self.global_view:
            self.global_view = view
            self.timer.changed(now)
            anywhere = set().union(*view.values())
            if any(c not in anywhere for c in self.global_assignment.values()):
                self.timer.due = now  # a consumer gone from every partition is handled at once
            # (one missing on some partitions only may be reconnecting, e.g. to a partition's new owner)
        if not self.timer.fire(now):
            return
        members_list = common_members(self.global_view, n)
        current = {p: c for p, c in self.global_assignment.items() if c in members_list}
        new = assign(list(range(n)), members_list, current) if members_list else {}
        if new != self.global_assignment or shared.assignment(base, sub) is None:
            self.global_assignment = new
            shared.publish_assignment(base, sub, new)

    def _apply(self, now: float, new: dict[int, str]) -> None:
        """Move to `new` (partition -> consumer, for partitions served here): each moving partition paused
        and handed off, the others designated at once; empty: plain Failover everywhere."""
        if not new:
            for sub in self.subs.values():
                sub.undesignate()
            self.assignment, self.handoffs = {}, {}
            return
        # Who holds each partition's flow now: its assignment, or (before the first one, after a fallback)
        # the consumer plain Failover chose, so its deliveries are waited for like any other source's.
        holders = dict(self.assignment)
        for p, sub in self.subs.items():
            if p not in holders and (name := sub.active_name()) is not None:
                holders[p] = name
        planned, _resumed = plan_handoffs(holders, new, now, self.max_handoff, self.handoffs)
        self.handoffs = planned
        for p, sub in self.subs.items():  # only a handoff's source has released messages to report
            source = planned[p].source if p in planned else None
            sub.released = {n: c for n, c in sub.released.items() if n == source}
        for p in planned:
            self.subs[p].designate(None)  # step 1: no new deliveries to the old consumer
        for p, name in new.items():
            if p not in planned:  # unchanged (or moved back before it switched): keeps flowing
                self._designate(p, name)
        self.assignment = new

    def _designate(self, p: int, name: str) -> None:
        sub = self.subs[p]
        sub.designate(sub.attached_names().get(name))

    def _progress(self, now: float) -> None:
        for p, h in list(self.handoffs.items()):
            sub = self.subs.get(p)
            if sub is None:
                del self.handoffs[p]
                continue
            names = sub.attached_names()
            if h.target not in names:
                continue  # the next rebalance (already due) replans it
            source_id = names.get(h.source) if h.source is not None else None
            unacked = sub.in_flight_of(source_id) if source_id is not None else 0
            if not h.ready(now, unacked, source_id is not None):
                continue
            # What the source still holds goes back now; what it held when its stream ended went back then.
            redelivered = sub.requeue(source_id) if source_id is not None else 0
            if h.source is not None:
                redelivered += sub.take_released(h.source)
            h.switch(now)
            sub.designate(names[h.target])
            del self.handoffs[p]
            self.handoffs_done += 1
            metrics.partition_handoffs.inc()
            metrics.partition_handoff_seconds.observe(h.paused_for)
            metrics.partition_handoff_redelivered.inc(redelivered)
            log.info(
                "%s/%s: partition %d handed off from %s to %s after %.3f s, %d redelivered",
                self.key[0],
                self.key[1],
                p,
                h.source,
                h.target,
                h.paused_for,
                redelivered,
            )


class PartitionGroups:
    """Every partition group of the broker, stepped by one task."""

    def __init__(self, rebalance_delay: float, max_handoff: float) -> None:
        self.rebalance_delay = rebalance_delay
        self.max_handoff = max_handoff
        self.groups: dict[tuple[str, str], PartitionGroup] = {}
        self._tasks = TaskSupervisor("partition groups")  # the task that steps them
        self._task: asyncio.Task[None] | None = None
        self.shared: SharedGroups | None = None

    def share(self, shared: SharedGroups) -> None:
        """Cluster mode: assign each group together with its partitions on the other brokers."""
        self.shared = shared
        shared.start()
        for group in self.groups.values():
            group.shared = shared
            group.resync = True

    def join(
        self,
        base: str,
        partition: int,
        sub: ReliableSubscription,
        settings: DispatchConfigRecord | None = None,
    ) -> None:
        """A partition's Failover subscription opened here (`settings`: the subscription's stored ones)."""
        key = (base, sub.name)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = PartitionGroup(key, self.rebalance_delay, self.max_handoff)
            group.shared = self.shared
        if settings is not None:
            group.configure(settings.rebalance_delay_seconds, settings.max_handoff_seconds)
        group.subs[partition] = sub
        sub.on_change = lambda kind: group.changed(kind, time.monotonic())
        sub.on_close = lambda: self.leave(base, partition, sub)
        group.changed("attach", time.monotonic())
        if self._task is None and not self._tasks.closed:
            self._task = self._tasks.spawn(self._run(), "partition-groups")

    def leave(self, base: str, partition: int, sub: ReliableSubscription) -> None:
        """A partition's subscription closed (its topic moved away, or it was closed)."""
        key = (base, sub.name)
        group = self.groups.get(key)
        if group is None or group.subs.get(partition) is not sub:
            return
        del group.subs[partition]
        group.assignment.pop(partition, None)
        group.handoffs.pop(partition, None)
        sub.on_change = sub.on_close = None
        sub.released.clear()
        if not group.subs:
            del self.groups[key]
            if self.shared is not None:
                self.shared.publish_members(base, sub.name, {})  # no partition of it served here now
                if group.coordinating:
                    self.shared.forget_assignment(base, sub.name)
            if not self.groups:  # the tick skips an empty registry: zero the spread here
                metrics.partition_spread.labels("max").set(0)
                metrics.partition_spread.labels("min").set(0)
        else:
            group.changed("detach", time.monotonic())

    def configure(self, base: str, subscription: str, settings: DispatchConfigRecord) -> None:
        group = self.groups.get((base, subscription))
        if group is not None:
            group.configure(settings.rebalance_delay_seconds, settings.max_handoff_seconds)

    def assignments(self, base: str, now: float) -> list[tuple[str, int, str | None, str | None, float]]:
        """(subscription, partition, consumer, handing off to, paused for) of every partition of `base`'s
        groups here, by subscription and partition; in cluster mode also the partitions other brokers serve,
        as the group's map assigns them."""
        out: list[tuple[str, int, str | None, str | None, float]] = []
        for (group_base, sub), group in sorted(self.groups.items()):
            if group_base != base:
                continue
            for p in sorted(set(group.subs) | set(group.followed or ())):
                h = group.handoffs.get(p)
                if h is not None:
                    out.append((sub, p, h.source, h.target, now - h.paused_at))
                elif p in group.subs:
                    name = group.assignment.get(p) or group.subs[p].active_name()
                    out.append((sub, p, name, None, 0.0))
                elif group.followed is not None:  # cluster mode: served by another broker, as assigned
                    out.append((sub, p, group.followed[p], None, 0.0))
        return out

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            if not self.groups:
                continue  # every group left (no partitioned Failover subscription open): nothing to do
            now = time.monotonic()
            spread: list[int] = []
            for group in list(self.groups.values()):
                try:
                    group.step(now)
                except Exception:
                    log.exception("partition group %s/%s failed a step", *group.key)
                counts: dict[str, int] = {}
                # Cluster mode: the group's whole map, counted by its coordinator only.
                mapping = group.assignment if group.shared is None else group.global_assignment
                for name in mapping.values():
                    counts[name] = counts.get(name, 0) + 1
                spread.extend(counts.values())
            metrics.partition_spread.labels("max").set(max(spread, default=0))
            metrics.partition_spread.labels("min").set(min(spread, default=0))

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.close()
        self._task = None
        await self._tasks.close()
