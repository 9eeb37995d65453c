"""`IsterAdmin.RecoverTopic` and `DescribeLocalCopy` (issue 39, docs/replication.md): an unclean recovery of
a replicated topic whose in-sync replicas are all gone. Any broker's admin API takes it: it asks every live
replica for its copy's end (its own directly, the others' admin APIs), writes the recovery record, and
answers once the chosen broker leads the topic."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ister.broker.admin_ops import AdminOps
from ister.core.replication import CopyEnd, Recovery, ReplicaRecord
from ister.errors import FailedPrecondition, Unavailable
from ister.metadata import keys
from ister.server.stats_forward import PeerAdmin, admin_peer_credentials, forwarded_metadata
from ister.wire.gen import ister_v1_pb2 as pb

LEAD_WAIT_SECONDS = 30.0  # the chosen broker loads the topic like any failover: usually within seconds


class RecoveryService:
    def __init__(self, ops: AdminOps, peers: PeerAdmin | None = None) -> None:
        self.ops = ops
        self.peers = peers if peers is not None else PeerAdmin(admin_peer_credentials(ops.broker.config))

    async def local_copy(self, request: pb.LocalCopyRequest) -> pb.LocalCopyResponse:
        name = await self.ops.require_topic(request.topic)
        copy = self.ops.placement_admin.local_copy(name.full)
        if copy is None:
            return pb.LocalCopyResponse(present=False)
        return pb.LocalCopyResponse(
            present=True, end=copy.end, last_epoch=copy.last_epoch, committed_heard=copy.committed_heard
        )

    async def recover(self, request: pb.RecoverTopicRequest, context: Any) -> pb.RecoverTopicResponse:
        admin = self.ops.placement_admin
        name = await self.ops.require_topic(request.topic)
        found = await admin.recovery_survey(name)
        metadata = forwarded_metadata(context)
        copies: dict[int, CopyEnd] = {}
        for broker in found.survivors:  # a survivor that does not answer may hold the longest copy: stop
            if broker == self.ops.broker_id:
                copy = admin.local_copy(name.full)
            else:
                addr = await admin.admin_addr_of(broker)
                answer = await self.peers.local_copy(broker, addr, name.full, metadata)
                copy = (
                    CopyEnd(answer.last_epoch, answer.end, answer.committed_heard) if answer.present else None
                )
            if copy is not None:
                copies[broker] = copy
        plan = await admin.recovery_plan(name, found, copies)
        if not request.accept_data_loss:
            raise FailedPrecondition(
                f"topic {name} has no live in-sync replica (in sync: {found.record.isr}). A recovery would "
                f"restart it on broker {plan.leader} keeping offsets below {plan.kept_end}; {_gone(plan)}. "
                "Pass accept_data_loss (ister admin topics recover TOPIC --accept-data-loss) to do it"
            )
        await admin.write_recovery(name, found, plan)
        record = await self._led(name.full, plan)
        return pb.RecoverTopicResponse(
            topic=name.full,
            leader=record.leader,
            epoch=record.epoch,
            kept_end=plan.kept_end,
            resume_at=plan.resume_at,
            acked_end=plan.acked_end,
            survivors=found.survivors,
        )

    async def _led(self, topic: str, plan: Recovery) -> ReplicaRecord:
        """The record once the chosen broker leads (it writes the next epoch, `resume_at` cleared)."""
        deadline = time.monotonic() + LEAD_WAIT_SECONDS
        while True:
            kv = await self.ops.store.get(keys.replicas(topic))
            record = ReplicaRecord.parse(kv.value) if kv is not None else None
            if record is not None and record.epoch > plan.record.epoch and record.leader >= 0:
                return record
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the recovery of {topic} is written (broker {plan.leader} alone in sync) but no broker "
                    f"leads it after {LEAD_WAIT_SECONDS:.0f} s; that broker takes it over once it loads it"
                )
            await asyncio.sleep(0.2)  # polls the store: the admin API keeps no watch of replica records


def _gone(plan: Recovery) -> str:
    if plan.resume_at <= plan.kept_end:
        return "nothing acknowledged is lost"
    certain = (
        f" ({plan.kept_end}..{plan.acked_end - 1} acknowledged for certain)"
        if plan.acked_end > plan.kept_end
        else ""
    )
    return f"offsets {plan.kept_end}..{plan.resume_at - 1} would be gone{certain}, never reused"
