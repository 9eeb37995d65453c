"""A replica follower whose data disk is full (issue 37, item 7): over real gRPC in this process, the
follower's data directory on a small tmpfs. Below its headroom it stops copying (the leader's commit waits
for it, or goes on without it once it leaves the in-sync set); a disk that fills under its WAL writer
(ENOSPC, headroom off) is retried the same way; it never crashes, and once space returns it catches up and
holds exactly the leader's records."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ister.core.replication import ReplicaRecord
from ister.ids import TopicName
from ister.limits import MiB
from ister.storage.topic_storage import TopicStorage
from tests.integration.test_disk_full import fill
from tests.integration.test_replica_stream_faults import Pair, follower_records, publish, replica_pair
from tests.support import small_tmpfs, until

NAME = TopicName.parse("/default/replicated_disk_full")
RECORD = ReplicaRecord(replicas=[1, 2], isr=[1, 2], leader=1, epoch=3, min_insync=2)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "16m") as mount:
        yield mount


@pytest.mark.parametrize("headroom", [4 * MiB, 0], ids=["below-headroom", "enospc"])
async def test_a_follower_with_a_full_disk_waits_and_catches_up(
    tmp_path: Path, disk: Path, headroom: int
) -> None:
    overrides = {"storage.min_free_bytes": headroom, "storage.min_free_ratio": 1.0}
    async with replica_pair(tmp_path, disk / "data", overrides) as (pair, storage):
        await follower_copes(pair, storage, disk, headroom)


async def follower_copes(pair: Pair, storage: TopicStorage, disk: Path, headroom: int) -> None:
    follower = pair.follower
    before = [b"a%d" % i for i in range(20)]
    assert await publish(pair.leader, pair.leader_wal, before) == 0
    wal = follower.wal
    assert wal is not None and wal.durable_offset == 20

    # Headroom 4 MiB: leave 2 MiB (the follower stops copying). Headroom off: leave nothing (the next
    # append meets ENOSPC; the segment's preallocated reserve is used up first by the larger records).
    filler = fill(disk, leave=2 * MiB if headroom else 0)
    if headroom:
        await until(lambda: storage.space.refusal is not None, "the follower's broker below its headroom")
    big = [bytes([i]) * (256 * 1024) for i in range(12)]  # 3 MiB: more than the reserve and the space
    committed = asyncio.ensure_future(publish(pair.leader, pair.leader_wal, big))
    await until(lambda: follower.paused_for_space, "the follower stops copying")
    assert not committed.done()  # min_insync 2: not committed without the follower
    assert follower.wal is not None and follower.wal.durable_offset == 20  # nothing half-copied
    assert follower._task is not None and not follower._task.done()  # not crashed

    filler.unlink()
    assert await asyncio.wait_for(committed, 30) == 20
    await until(lambda: not follower.paused_for_space, "the follower copies again")
    assert await follower_records(follower, 32) == before + big
