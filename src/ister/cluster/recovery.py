"""Unclean recovery of a replicated topic whose in-sync replicas are all gone (issue 39, docs/replication.md):
the metadata side. The admin API gathers the surviving copies' ends (`ReplicaManager.local_copy` on each
live replica) and calls `survey` then `write`; the chosen broker then loads the topic like any failover,
continuing at `resume_at` (cluster/replicated.py)."""

from __future__ import annotations

import logging

from ister.core.cluster.ownership import OwnerRecord
from ister.core.replication import (
    CopyEnd,
    Recovery,
    ReplicaRecord,
    Survey,
    replication_state,
    unclean_recovery,
)
from ister.errors import FailedPrecondition, NotFound, Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.store import Compare, MetadataStore, Put
from ister.storage.objects import catalog

log = logging.getLogger(__name__)


async def survey(store: MetadataStore, name: TopicName) -> Survey:
    """The topic's replica record and the live brokers; refused unless no in-sync replica is live."""
    kv = await store.get(keys.replicas(name))
    record = ReplicaRecord.parse(kv.value) if kv is not None else None
    if kv is None or record is None:
        raise NotFound(f"topic {name} is not replicated (it has no replica record): nothing to recover")
    live = set(keys.broker_ids(k.key for k in await store.list(keys.REGISTER_PREFIX)))
    state = replication_state(record, live)
    if record.isr and set(record.isr) & live:
        raise FailedPrecondition(
            f"topic {name} is {state}: in-sync replica(s) {sorted(set(record.isr) & live)} are live, so it "
            "fails over without losing anything; no recovery is needed"
        )
    if not live:
        raise Unavailable("no broker is registered")
    return Survey(record, kv.version, live)


async def plan(store: MetadataStore, name: TopicName, found: Survey, copies: dict[int, CopyEnd]) -> Recovery:
    """What a recovery would do now, from the copies' ends, the durable tier and the owner's reservation."""
    descriptors = await catalog.list_descriptors(store, name)
    tier_end = max((d.end_offset + 1 for d in descriptors), default=0)
    owner_kv = await store.get(keys.owner(name))
    owner = OwnerRecord.parse(owner_kv.value) if owner_kv is not None else None
    reserved = owner.reserved_until if owner is not None else 0
    return unclean_recovery(found.record, found.live, copies, tier_end, reserved)


async def write(store: MetadataStore, name: TopicName, found: Survey, recovery: Recovery) -> None:
    """Write the recovery's record (compare-and-set on the surveyed version: anything that changed in
    between, a replica back among them, refuses it)."""
    key = keys.replicas(name)
    if not await store.txn([Compare(key, found.version)], [Put(key, recovery.record.to_json())]):
        raise Unavailable(f"topic {name}: its replica record changed meanwhile; look again and retry")
    log.warning(
        "%s: unclean recovery on broker %d: offsets below %d kept, %d..%d gone (%d..%d acknowledged for "
        "certain); new offsets from %d",
        name,
        recovery.leader,
        recovery.kept_end,
        recovery.kept_end,
        recovery.resume_at - 1,
        recovery.kept_end,
        recovery.acked_end - 1,
        recovery.resume_at,
    )
