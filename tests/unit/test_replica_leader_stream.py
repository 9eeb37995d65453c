"""A replicated topic leader's stream to one follower (`ReplicaLeader.replicate`), on a real WAL: frames for a
follower that takes them, records for one that does not, and the commit moving with its acknowledgements."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from crc32c import crc32c

from ister.clock import REAL_CLOCK, Clock, VirtualClock
from ister.core.frames import scan_frames
from ister.core.replication import EpochHistory, ReplicaRecord
from ister.errors import Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.replication.insync import ISR_CHECK_SECONDS
from ister.replication.leader import ReplicaLeader
from ister.storage.wal import Wal, WalConfig
from ister.wire.gen import ister_v1_pb2 as pb
from tests.support import advance_until

NAME = TopicName.parse("/default/replicated")
RECORD = ReplicaRecord(replicas=[1, 2], isr=[1, 2], leader=1, epoch=3, min_insync=2)


class Acks:
    """The follower's side of the stream: acknowledgements pushed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[int]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[int]:
        while (end := await self.queue.get()) is not None:
            yield end


def fetch_request(frames_ok: bool) -> pb.ReplicaFetchRequest:
    """Follower 2 opening its stream at offset 0 of epoch 3."""
    req = pb.ReplicaFetchRequest(topic=NAME.full, follower=2, epoch=3, log_end=0, frames_ok=frames_ok)
    req.history.append(pb.EpochStart(epoch=3, start=0))
    return req


async def leader_on(
    wal: Wal, store: EmbeddedStore, max_lag_s: float = 10.0, clock: Clock = REAL_CLOCK
) -> ReplicaLeader:
    await store.put(keys.replicas(NAME), RECORD.to_json())
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None
    history = EpochHistory()
    history.begin(RECORD.epoch, wal.next_offset)
    leader = ReplicaLeader(NAME, wal, history, RECORD, kv.version, store, 1, max_lag_s, clock=clock)
    leader.start()
    return leader


async def test_a_follower_that_takes_frames_gets_the_leaders_frames_and_its_acks_commit(
    tmp_path: Path,
) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    store = EmbeddedStore.in_memory()
    leader = await leader_on(wal, store)
    acks = Acks()
    req = fetch_request(frames_ok=True)
    stream = leader.replicate(req, acks)
    try:
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)  # the stream waits for records
        assert wal.frames(0, 10, 10, 1 << 20) is None
        publish = asyncio.ensure_future(leader_publish(leader, wal, [b"a", b"b", b"c"]))
        resp = await asyncio.wait_for(first, 5)
        while not resp.frames:  # heartbeats may come first
            resp = await asyncio.wait_for(stream.__anext__(), 5)
        assert (resp.first_offset, resp.frame_count, list(resp.records)) == (0, 3, [])
        assert crc32c(resp.frames) == resp.frames_crc
        scan = scan_frames(resp.frames, expect_offset=0)
        assert [bytes(p) for _, p, _ in scan.frames] == [b"a", b"b", b"c"]
        assert leader.committed == 0 and not publish.done()  # on the leader only: not acknowledged
        await acks.queue.put(3)
        await asyncio.wait_for(publish, 5)
        assert leader.committed == 3 and wal.committed_offset == 3
    finally:
        await acks.queue.put(None)
        await stream.aclose()
    assert wal.frames(0, 10, 10, 1 << 20) is None  # nobody streams: no frames kept
    await leader.close("test over")
    await wal.close()
    await store.close()


async def test_a_follower_that_does_not_take_frames_gets_records(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    store = EmbeddedStore.in_memory()
    leader = await leader_on(wal, store)
    acks = Acks()
    req = fetch_request(frames_ok=False)
    stream = leader.replicate(req, acks)
    try:
        publish = asyncio.ensure_future(leader_publish(leader, wal, [b"x", b"y"]))
        resp = await asyncio.wait_for(stream.__anext__(), 5)
        while not resp.records:
            resp = await asyncio.wait_for(stream.__anext__(), 5)
        assert (resp.first_offset, list(resp.records), resp.frames) == (0, [b"x", b"y"], b"")
        await acks.queue.put(2)
        await asyncio.wait_for(publish, 5)
    finally:
        await acks.queue.put(None)
        await stream.aclose()
    await leader.close("test over")
    await wal.close()
    await store.close()


async def leader_publish(leader: ReplicaLeader, wal: Wal, records: list[bytes]) -> None:
    """What a publish does on a replicated topic: append, then wait for the replication commit."""
    leader.check_writable()
    first = await wal.append(records)
    leader.appended()
    await leader.wait_committed(first + len(records))


async def test_a_leader_that_closes_ends_its_followers_streams_with_unavailable(tmp_path: Path) -> None:
    """A move or a fence closes the leader: each follower's stream ends with UNAVAILABLE naming why, so the
    follower looks for the new leader (it ended with INTERNAL "reader closed")."""
    wal = await Wal.open(tmp_path, WalConfig())
    store = EmbeddedStore.in_memory()
    leader = await leader_on(wal, store)
    acks = Acks()
    req = fetch_request(frames_ok=True)
    stream = leader.replicate(req, acks)
    waiting = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.05)  # the stream waits for records
    await leader.close("moved")
    with pytest.raises(Unavailable, match="no longer led here"):
        while True:
            await asyncio.wait_for(waiting, 5)  # heartbeats may come first
            waiting = asyncio.ensure_future(stream.__anext__())
    await acks.queue.put(None)
    await wal.close()
    await store.close()


async def test_a_move_waits_for_an_in_sync_follower_that_stalled(tmp_path: Path) -> None:
    """The only other in-sync member stops acknowledging past the lag time (it cannot leave: the set is at
    its minimum), so publishes are refused; a move then waits for it instead of failing at once (a failed
    move holds the topic for the load manager's back-off), and completes once it acknowledges."""
    wal = await Wal.open(tmp_path, WalConfig())
    store = EmbeddedStore.in_memory()
    clock = VirtualClock()
    leader = await leader_on(wal, store, max_lag_s=0.3, clock=clock)
    acks = Acks()
    req = fetch_request(frames_ok=True)
    stream = leader.replicate(req, acks)
    reading = asyncio.ensure_future(drain_stream(stream))
    try:
        await wal.append([b"a", b"b"])
        leader.appended()
        await advance_until(clock, lambda: leader.stalled, "the follower stalled", ISR_CHECK_SECONDS, 5)
        with pytest.raises(Unavailable, match="stopped following"):
            leader.check_writable()
        move = asyncio.ensure_future(leader.hand_over(10))
        for _ in range(2):  # two in-sync checks: before the change the move had failed by now
            await clock.advance(ISR_CHECK_SECONDS)
        assert not move.done()
        await acks.queue.put(2)
        await advance_until(clock, move.done, "the move", ISR_CHECK_SECONDS, 5)
        await move
        assert leader.committed == 2
    finally:
        await acks.queue.put(None)
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await stream.aclose()
    await leader.close("test over")
    await wal.close()
    await store.close()


async def drain_stream(stream: AsyncIterator[pb.ReplicaFetchResponse]) -> None:
    async for _ in stream:
        pass
