"""Ownership epochs and offset continuity across owners.

Every assignment bumps the topic's epoch in its owner record. The owner appends only inside an offset
range it reserved in that record with compare-and-set, so:

* a stale owner cannot extend its reservation (the record changed), and its appends stop at the range end;
* the next owner starts at the reservation end: offsets are never reused, even when the old owner died
  with frames nobody else can read (those leave a gap until the durable tier makes them reachable);
* a broker whose local WAL was the last one loaded (same epoch lineage) continues it densely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

# Offsets reserved per record update; a new reservation is taken when half of it is used.
DEFAULT_RESERVATION = 100_000


class OwnerRecord(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    epoch: int  # bumped by the leader at every assignment
    loaded_epoch: int = 0  # epoch of the last owner that loaded the topic (its WAL holds the newest data)
    reserved_until: int = 0  # no offset at or above this was ever assigned

    @classmethod
    def parse(cls, value: Any) -> OwnerRecord | None:
        try:
            record = msgspec.convert(value, cls)
        except msgspec.ValidationError:
            return None
        if min(record.broker_id, record.epoch, record.loaded_epoch, record.reserved_until) < 0:
            return None
        return record

    def to_json(self) -> dict[str, int]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


def assign(previous: OwnerRecord | None, broker_id: int) -> OwnerRecord:
    """The record the leader writes when it gives the topic to `broker_id`."""
    if previous is None:
        return OwnerRecord(broker_id=broker_id, epoch=1)
    return msgspec.structs.replace(previous, broker_id=broker_id, epoch=previous.epoch + 1)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    keep_local: bool  # continue the local WAL (it holds the newest data)
    start_offset: int  # the WAL's first offset when it starts empty
    record: OwnerRecord  # what the loading owner writes (compare-and-set) before serving


def plan_load(
    record: OwnerRecord,
    local_epoch: int | None,
    local_next: int | None,
    sealed_next: int | None = None,
    reservation: int = DEFAULT_RESERVATION,
) -> LoadPlan:
    """How the owner named in `record` starts the topic.

    `local_epoch`/`local_next`: the epoch this broker's local WAL was loaded under and its next offset (None
    when there is no local WAL). `sealed_next`: last_committed_offset + 1 of a sealed hand-off written by the
    last loader (the caller checks the sealed state's epoch against `record.loaded_epoch`), if any: that owner
    stopped appending before it sealed, so the next owner continues densely from there.
    """
    keep = local_epoch is not None and local_next is not None and local_epoch == record.loaded_epoch
    if keep:
        assert local_next is not None
        # The local WAL is the newest copy; anything reserved beyond its end was never written.
        start = max(local_next, sealed_next or 0)
    elif sealed_next is not None:
        start = sealed_next
    else:
        start = record.reserved_until
    return LoadPlan(
        keep_local=keep,
        start_offset=start,
        record=msgspec.structs.replace(
            record, loaded_epoch=record.epoch, reserved_until=max(start + reservation, record.reserved_until)
        ),
    )


def vouched_seal(record: OwnerRecord, sealed_epoch: int | None, sealed_next: int | None) -> int | None:
    """Where a sealed state says offsets continue, when the last loader wrote it: only that owner's seal
    vouches for where offsets stopped (an older one predates appends made since)."""
    return sealed_next if sealed_next is not None and sealed_epoch == record.loaded_epoch else None


def needs_extension(record: OwnerRecord, next_offset: int, reservation: int = DEFAULT_RESERVATION) -> bool:
    return record.reserved_until - next_offset < reservation // 2


def extend(record: OwnerRecord, next_offset: int, reservation: int = DEFAULT_RESERVATION) -> OwnerRecord:
    return msgspec.structs.replace(
        record, reserved_until=max(record.reserved_until, next_offset + reservation)
    )
