"""The answers of `IsterAdmin.GetClusterHealth` (core/cluster/health.py computes it) and `ListTopics`
(broker/admin_listing.py) on the wire."""

from __future__ import annotations

from ister.broker.admin_listing import TopicPage
from ister.core.cluster.health import ClusterHealth, ReplicationIssue
from ister.core.replication import NO_LEADER
from ister.wire.gen import ister_v1_pb2 as ipb


def _issue(i: ReplicationIssue) -> ipb.ReplicationIssue:
    r = i.record
    out = ipb.ReplicationIssue(
        topic=i.topic,
        state=i.state,
        replicas=r.replicas,
        in_sync_replicas=r.isr,
        live_in_sync=i.live_isr,
        min_insync_replicas=r.min_insync,
    )
    if r.leader != NO_LEADER:
        out.leader = r.leader
    return out


def health_pb(h: ClusterHealth) -> ipb.ClusterHealthResponse:
    return ipb.ClusterHealthResponse(
        mode=h.mode,
        note=h.note,
        moves=[
            ipb.RebalancingMove(
                topic=m.topic,
                from_broker=m.from_broker,
                to_broker=m.to_broker,
                reason=m.reason,
                estimated_load=m.estimated_load,
                timestamp=m.timestamp,
            )
            for m in h.moves
        ],
        moves_total=h.moves_total,
        failed_moves=[
            ipb.FailedMove(
                topic=f.topic,
                from_broker=f.note.from_broker,
                cause=f.note.cause,
                code=f.note.code,
                at=f.note.at,
                failures=f.note.failures,
                backing_off=f.backing_off,
                retry_at=f.retry_at,
            )
            for f in h.failed_moves
        ],
        under_replicated=[_issue(i) for i in h.under_replicated],
        under_min_isr=[_issue(i) for i in h.under_min_isr],
        replicated_topics=h.replicated_topics,
    )


def topic_page_pb(page: TopicPage) -> ipb.ListTopicsResponse:
    out = ipb.ListTopicsResponse(
        total=page.total,
        matched=page.matched,
        per_broker=page.per_broker,
        unassigned=page.unassigned,
        namespaces=page.namespaces,
    )
    for t in page.topics:
        row = out.topics.add(name=t.name, delivery=t.delivery)
        if t.broker_id is not None:
            row.broker_id = t.broker_id
    return out
