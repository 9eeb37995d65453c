"""Cluster rates and load for the overview, from what the admin API exposes.

Publish rates come from the brokers' load reports (IsterAdmin.ListBrokerLoads: messages/s and MB/s into the
topics each leads), which only a cluster writes. Dispatch rates and the lagging count are the totals each
broker keeps of its loaded topics' subscriptions (IsterAdmin.ListSubscriptionStats with `totals_only`, summed
over every broker; no metadata read, so the same cost at any topic count), which a standalone broker answers
too. The load reports carry no dispatch rate and the totals no publish rate, hence two sources.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from ister.wire.gen import DanubeAdmin_pb2 as pb
from ister.wire.gen import ister_v1_pb2 as ister_pb

CALL_TIMEOUT_SECONDS = 5.0
MB = 1_000_000


@dataclass(frozen=True)
class BrokerLoad:
    broker_id: str
    reported: float  # unix seconds; 0: no report yet
    cpu: float
    memory: float
    led: int
    followed: int
    msg_in: float
    mb_in: float
    load: float | None  # the balance strategy's score (None: not ranked)
    overloaded: bool

    @property
    def age(self) -> str:
        return "no report yet" if not self.reported else f"{max(0.0, time.time() - self.reported):.0f} s ago"


@dataclass
class Rates:
    """None for a figure the admin API did not give; `notes` say why."""

    publish_msgs: float | None = None
    publish_bytes: float | None = None
    dispatch_msgs: float | None = None
    dispatch_bytes: float | None = None
    replication_msgs: float | None = None
    lagging: int | None = None  # subscriptions with a backlog
    loads: list[BrokerLoad] = field(default_factory=list)
    balance_cv: float | None = None
    strategy: str = ""
    notes: list[str] = field(default_factory=list)


def _why(exc: grpc.RpcError, what: str) -> str:
    """A note in place of the figures: the rest of the overview still shows (the broker list decides
    whether the API is reachable, not these)."""
    code = exc.code()
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return f"this token may not read {what}: {exc.details()}"
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return f"no {what}: {exc.details()}"
    return f"could not read {what}: {exc.details()} ({code.name})"


async def rates(brokers: Any, ister_admin: Any) -> Rates:
    """The overview's rates; a figure the API did not give is None, with a note saying why."""
    out = Rates()
    try:
        loads = await ister_admin.ListBrokerLoads(
            ister_pb.ListBrokerLoadsRequest(), timeout=CALL_TIMEOUT_SECONDS
        )
        balance = await brokers.GetClusterBalance(pb.ClusterBalanceRequest(), timeout=CALL_TIMEOUT_SECONDS)
    except grpc.RpcError as exc:
        out.notes.append(_why(exc, "load reports (publish rates)"))
    else:
        ranked = {b.broker_id: b for b in balance.brokers}
        out.loads = [
            BrokerLoad(
                str(r.broker_id),
                float(r.timestamp),
                r.cpu_percent,
                r.memory_percent,
                r.topics,
                r.followed_topics,
                float(r.message_rate),
                r.throughput_mbps,
                ranked[r.broker_id].load if r.broker_id in ranked else None,
                ranked[r.broker_id].is_overloaded if r.broker_id in ranked else False,
            )
            for r in loads.brokers
        ]
        out.publish_msgs = sum(b.msg_in for b in out.loads)
        out.publish_bytes = sum(b.mb_in for b in out.loads) * MB
        out.replication_msgs = float(sum(r.follower_message_rate for r in loads.brokers))
        out.balance_cv = balance.coefficient_of_variation
        out.strategy = balance.assignment_strategy
    try:
        subs = await ister_admin.ListSubscriptionStats(
            ister_pb.ListSubscriptionStatsRequest(totals_only=True), timeout=CALL_TIMEOUT_SECONDS
        )
    except grpc.RpcError as exc:
        out.notes.append(_why(exc, "subscription stats (dispatch rates)"))
    else:
        out.dispatch_msgs = subs.totals.msg_rate_out
        out.dispatch_bytes = subs.totals.byte_rate_out
        out.lagging = subs.totals.lagging
        for f in subs.failed_brokers:
            out.notes.append(f"broker {f.broker_id} did not give its subscriptions: {f.error}")
    return out
