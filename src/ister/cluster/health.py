"""Readiness of a cluster broker (broker/health.py serves it): its lease, its state, its topics."""

from __future__ import annotations

from ister.cluster.node import ClusterNode
from ister.core.cluster.planner import ACTIVE
from ister.ports.health import Check

SHOWN_TOPICS = 5  # topics named in a "not loaded" detail


async def cluster_checks(node: ClusterNode) -> list[Check]:
    """Ready when the registration lease is valid, the broker is `active` (not draining or drained), and
    every topic assigned to it is loaded."""
    checks = [
        Check("lease", True, f"registered as broker {node.broker_id}")
        if node.clock.valid()
        else Check("lease", False, "the registration lease lapsed (etcd not reached in time); re-registering")
    ]
    node.view.refresh()
    mode = node.view.modes.get(node.broker_id, ACTIVE)
    if mode == ACTIVE:
        checks.append(Check("state", True, ACTIVE))
    else:
        checks.append(Check("state", False, f"{mode}: it gets no new topics (ister admin brokers activate)"))
    missing = node.not_loaded_here()
    if missing:
        shown = ", ".join(missing[:SHOWN_TOPICS]) + (" ..." if len(missing) > SHOWN_TOPICS else "")
        checks.append(Check("topics", False, f"{len(missing)} assigned topic(s) not loaded yet: {shown}"))
    else:
        checks.append(Check("topics", True, "every assigned topic is loaded"))
    return checks
