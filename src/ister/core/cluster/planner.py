"""What the leader does with a cluster snapshot: orphaned assignments become unassigned, unassigned topics
get owners. Pure, so the same code runs in the broker and in the seeded membership simulation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ister.core.cluster.assignment import BrokerSelector, Marker, fair_rankings

ACTIVE = "active"
DRAINING = "draining"
DRAINED = "drained"
BROKER_MODES = (ACTIVE, DRAINING, DRAINED)


@dataclass
class ClusterState:
    live: set[int]  # brokers whose registration lease is alive
    assignments: dict[str, int]  # topic -> owner
    unassigned: dict[str, Marker]  # topic -> why it waits
    modes: Mapping[int, str] = field(default_factory=dict)  # missing = active, as Danube

    def active(self) -> set[int]:
        return {b for b in self.live if self.modes.get(b, ACTIVE) == ACTIVE}

    def topic_counts(self) -> dict[int, int]:
        counts = dict.fromkeys(self.live, 0)
        for owner in self.assignments.values():
            if owner in counts:
                counts[owner] += 1
        return counts


@dataclass(frozen=True, slots=True)
class Orphan:
    topic: str
    dead_broker: int


@dataclass(frozen=True, slots=True)
class Assign:
    topic: str
    broker: int
    marker: Marker


def orphans(state: ClusterState) -> list[Orphan]:
    """Assignments that point at a broker whose registration is gone: they must be reassigned."""
    return [Orphan(t, b) for t, b in sorted(state.assignments.items()) if b not in state.live]


def abandoned_moves(state: ClusterState) -> list[Orphan]:
    """Moves whose old owner died before it sealed the topic: an unload marker still waiting for a broker
    whose registration is gone. Nobody else can answer it, so the leader turns it into a failover (the
    topic would otherwise wait for that broker for ever)."""
    return [
        Orphan(t, m.from_broker)
        for t, m in sorted(state.unassigned.items())
        if m.reason == "unload"
        and not m.ready
        and m.from_broker is not None
        and m.from_broker not in state.live
    ]


def plan_assignments(
    state: ClusterState,
    selector: BrokerSelector,
    limit: int | None = None,
    scores: Mapping[int, float] | None = None,
    step: float = 1.0,
    eligible: Mapping[str, set[int]] | None = None,
) -> list[Assign]:
    """Owners for the unassigned topics (in name order), counting each pick at once so a batch spreads.

    `scores`: the configured strategy's score per live broker (lower is better); None means Fair (topic
    counts). Each pick adds `step` (the score of one topic without load yet) to the chosen broker.
    A topic that still has a live owner is skipped: the other half of its move has not happened yet.
    `eligible`: for a replicated topic, the brokers that may take it over (its in-sync replicas): after a
    failover, none of them alive means it waits rather than losing acknowledged records; a move goes to
    one of them (a leadership transfer; a named target outside them is ignored).
    """
    if not state.unassigned:
        return []  # the common case on a busy leader: no O(topics) count for nothing
    current: dict[int, float] = (
        {b: float(c) for b, c in state.topic_counts().items()}
        if scores is None
        else {b: float(scores.get(b, 0.0)) for b in state.live}
    )
    active = state.active()
    plan: list[Assign] = []
    for topic, marker in sorted(state.unassigned.items()):
        if limit is not None and len(plan) >= limit:
            break
        if state.assignments.get(topic) in state.live:
            continue
        rankings = fair_rankings({b: math.floor(v) for b, v in current.items()})
        allowed = eligible.get(topic) if eligible is not None else None
        if allowed is None:
            pool = active
        elif marker.reason == "failover":
            pool = (active & allowed) or (state.live & allowed)
        else:
            pool = active & allowed  # a move of a replicated topic is a transfer to an in-sync replica
        if not pool:
            continue
        broker = selector.choose(rankings, pool, marker)
        if broker is None:
            continue
        current[broker] = current.get(broker, 0.0) + step
        plan.append(Assign(topic, broker, marker))
    return plan
