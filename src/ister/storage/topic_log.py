"""Opening a reliable topic's log where its offsets continue, for both modes, from what the metadata says.

Standalone is the only writer: its local WAL continues, starting no lower than a seal's end (an admin unload
seals the topic and it reloads here). In a cluster the owner record decides (`core.cluster.ownership.
plan_load`): the local WAL when it was the last one loaded, else a new one after the seal or the last
reservation, the local one moved aside as superseded (given back to the durable tier later). Writing the
claim is the caller's: this only touches local files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ister.core.cluster.ownership import DEFAULT_RESERVATION, LoadPlan, OwnerRecord, plan_load, vouched_seal
from ister.ids import TopicName
from ister.metadata.records import SealedState
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal


@dataclass(frozen=True, slots=True)
class LogStart:
    """What the metadata says about where a topic's offsets continue."""

    sealed_next: int | None  # the end of a seal that vouches for where offsets stopped
    owner: OwnerRecord | None = None  # the owner record this load claims (None: standalone, one writer)
    reservation: int = DEFAULT_RESERVATION  # offsets a cluster claim reserves ahead

    @classmethod
    def standalone(cls, sealed: SealedState | None) -> LogStart:
        return cls(sealed.next_offset if sealed is not None else None)

    @classmethod
    def cluster(cls, owner: OwnerRecord, sealed: SealedState | None, reservation: int) -> LogStart:
        seal = vouched_seal(owner, sealed.epoch, sealed.next_offset) if sealed is not None else None
        return cls(seal, owner, reservation)


@dataclass(frozen=True, slots=True)
class OpenedLog:
    wal: Wal
    plan: LoadPlan | None  # cluster: what the claim writes and whether the local WAL was continued
    local_epoch: int | None  # the epoch the local WAL was loaded under before this load
    archived: bool  # a superseded local WAL holding records was moved aside (to be given back)


async def open_topic_log(storage: TopicStorage, name: TopicName, start: LogStart) -> OpenedLog:
    owner = start.owner
    if owner is None:
        wal = await storage.open_wal(name, start_offset=start.sealed_next or 0)
        return OpenedLog(wal, None, None, False)
    local_epoch = storage.read_epoch(name)
    local = await storage.open_wal(name) if local_epoch is not None else None
    plan = plan_load(
        owner,
        local_epoch,
        local.next_offset if local is not None else None,
        start.sealed_next,
        start.reservation,
    )
    archived = False
    try:
        if local is not None and not plan.keep_local:
            await local.close()
            local = None
        if local is None:
            archived = await storage.archive_superseded(name, local_epoch)
            local = await storage.open_wal(name, start_offset=plan.start_offset)
        elif plan.start_offset > local.next_offset:
            await local.close()
            local = await storage.open_wal(name, start_offset=plan.start_offset)
    except BaseException:
        if local is not None:
            await local.close()
        raise
    return OpenedLog(local, plan, local_epoch, archived)
