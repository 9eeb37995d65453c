"""`storage.topic_log.open_topic_log`: where a reliable topic's log continues in each mode, from what the
metadata says (a standalone seal; a cluster's owner record, seal and local epoch)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister.config import load_config
from ister.core.cluster.ownership import OwnerRecord, vouched_seal
from ister.ids import TopicName
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import SealedState
from ister.storage.topic_log import LogStart, open_topic_log
from ister.storage.topic_storage import TopicStorage

T = TopicName.parse("/default/t")
RESERVATION = 1_000


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[TopicStorage]:
    store = EmbeddedStore.in_memory()
    storage = TopicStorage(load_config(environ={}), store, tmp_path)
    await storage.start()
    try:
        yield storage
    finally:
        await storage.close()
        await store.close()


async def write(storage: TopicStorage, records: int, start: LogStart) -> int:
    """Open the log as `start` says, append `records`, close it; the next offset."""
    opened = await open_topic_log(storage, T, start)
    for i in range(records):
        await opened.wal.append([f"r{i}".encode()])
    end = opened.wal.next_offset
    await opened.wal.close()
    return end


def sealed(next_offset: int, epoch: int | None = None) -> SealedState:
    return SealedState(sealed=True, last_committed_offset=next_offset - 1, epoch=epoch)


async def test_standalone_continues_its_wal_and_never_below_a_seal(storage: TopicStorage) -> None:
    assert await write(storage, 3, LogStart.standalone(None)) == 3
    opened = await open_topic_log(storage, T, LogStart.standalone(None))
    assert (opened.wal.next_offset, opened.plan, opened.archived) == (3, None, False)
    await opened.wal.close()
    opened = await open_topic_log(storage, T, LogStart.standalone(sealed(10)))
    assert opened.wal.next_offset == 10
    await opened.wal.close()


async def test_cluster_continues_the_local_wal_of_the_last_loader(storage: TopicStorage) -> None:
    first = OwnerRecord(broker_id=1, epoch=1)
    opened = await open_topic_log(storage, T, LogStart.cluster(first, None, RESERVATION))
    assert opened.plan is not None and opened.wal.next_offset == 0  # a new topic starts at 0
    assert opened.plan.record.reserved_until == RESERVATION
    await opened.wal.append([b"a", b"b"])
    await opened.wal.close()
    storage.write_epoch(T, 1)
    again = OwnerRecord(broker_id=1, epoch=2, loaded_epoch=1, reserved_until=RESERVATION)
    opened = await open_topic_log(storage, T, LogStart.cluster(again, None, RESERVATION))
    assert opened.plan is not None and opened.plan.keep_local
    assert (opened.wal.next_offset, opened.local_epoch, opened.archived) == (2, 1, False)
    await opened.wal.close()


async def test_cluster_sets_a_superseded_wal_aside_and_starts_after_the_reservation(
    storage: TopicStorage,
) -> None:
    storage.write_epoch(T, 1)
    assert await write(storage, 2, LogStart.standalone(None)) == 2
    # Another broker loaded it at epoch 2 since: this WAL is superseded, offsets go on after its reservation.
    record = OwnerRecord(broker_id=1, epoch=3, loaded_epoch=2, reserved_until=5_000)
    opened = await open_topic_log(storage, T, LogStart.cluster(record, None, RESERVATION))
    assert opened.plan is not None and not opened.plan.keep_local
    assert (opened.wal.next_offset, opened.archived) == (5_000, True)
    assert [item.epoch for item in await storage.archived()] == [1]
    await opened.wal.close()


async def test_cluster_starts_after_the_last_loaders_seal_only(storage: TopicStorage) -> None:
    record = OwnerRecord(broker_id=1, epoch=3, loaded_epoch=2, reserved_until=5_000)
    by_last = LogStart.cluster(record, sealed(40, epoch=2), RESERVATION)
    assert by_last.sealed_next == 40
    opened = await open_topic_log(storage, T, by_last)
    assert opened.wal.next_offset == 40
    await opened.wal.close()
    # An older owner's seal predates the last loader's appends: the reservation end is where offsets go on.
    assert LogStart.cluster(record, sealed(40, epoch=1), RESERVATION).sealed_next is None
    assert vouched_seal(record, None, 40) is None
    assert vouched_seal(record, 2, None) is None
