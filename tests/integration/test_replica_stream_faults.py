"""A follower streaming from a leader over real gRPC, in this process (real WALs on disk, the in-memory
metadata store), with the leader's answers damaged in transit: the follower must append nothing from a
damaged answer, reconnect, and end with exactly the leader's records at their offsets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from crc32c import crc32c

from ister.config import load_config
from ister.core.replication import EpochHistory, ReplicaRecord
from ister.devcluster.ports import free_port
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.replication.follower import ChannelPool, LeaderTarget, ReplicaFollower
from ister.replication.leader import ReplicaLeader
from ister.server.replica_api import add_replica_service
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal, WalConfig
from ister.wire.gen import ister_v1_pb2 as pb
from tests.support import until

NAME = TopicName.parse("/default/replicated_faults")
RECORD = ReplicaRecord(replicas=[1, 2], isr=[1, 2], leader=1, epoch=3, min_insync=2)


@dataclass
class Pair:
    leader: ReplicaLeader
    leader_wal: Wal
    follower: ReplicaFollower


@contextlib.asynccontextmanager
async def replica_pair(
    tmp_path: Path, follower_dir: Path, overrides: dict[str, object] | None = None
) -> AsyncIterator[tuple[Pair, TopicStorage]]:
    """A leader (its WAL under `tmp_path`, served on a free port) and a follower broker's storage in
    `follower_dir` (cluster config plus `overrides`) copying from it; both stopped at the end."""
    store = EmbeddedStore.in_memory()
    await store.put(keys.replicas(NAME), RECORD.to_json())
    kv = await store.get(keys.replicas(NAME))
    assert kv is not None
    wal = await Wal.open(tmp_path / "leader", WalConfig())
    history = EpochHistory()
    history.begin(RECORD.epoch, 0)
    leader = ReplicaLeader(NAME, wal, history, RECORD, kv.version, store, 1, 10.0)
    leader.start()
    server = grpc.aio.server()
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    add_replica_service(server, lambda name: leader if name == NAME.full else None)
    await server.start()
    config = load_config(overrides={"mode": "cluster", **(overrides or {})}, environ={})
    storage = TopicStorage(config, store, follower_dir)
    await storage.start()
    channels = ChannelPool()
    target = LeaderTarget(RECORD.epoch, 1, f"http://127.0.0.1:{port}")
    follower = ReplicaFollower(NAME, storage, 2, lambda: target, channels)
    follower.start()
    try:
        yield Pair(leader, wal, follower), storage
    finally:
        await follower.stop()
        await channels.close()
        await storage.close()
        await leader.close("test over")
        await server.stop(None)
        await wal.close()
        await store.close()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with replica_pair(tmp_path, tmp_path / "follower") as (made, _):
        yield made


async def publish(leader: ReplicaLeader, wal: Wal, records: list[bytes]) -> int:
    leader.check_writable()
    first = await wal.append(records)
    leader.appended()
    await asyncio.wait_for(leader.wait_committed(first + len(records)), 20)
    return first


async def follower_records(follower: ReplicaFollower, end: int) -> list[bytes]:
    wal = follower.wal
    assert wal is not None
    reader = wal.reader(0, skip_holes=False, durable=True)
    out: list[bytes] = []
    while len(out) < end:
        got = await reader.read(end - len(out), 1 << 20, 1.0)
        assert isinstance(got, list)
        out += [bytes(r) for _, r in got]
    reader.close()
    return out


def damage_once(monkeypatch: pytest.MonkeyPatch, how: str) -> list[int]:
    """Damage the frames of the leader's first answer that carries any (`how`: 'crc' flips a payload byte
    and leaves the checksum stale; 'header' rewrites the first frame's offset and sends a matching checksum,
    as a leader bug would); returns a list that counts the damaged answers."""
    original = ReplicaLeader._response
    damaged: list[int] = []

    def response(self: ReplicaLeader, got: object, sent: int) -> tuple[pb.ReplicaFetchResponse, int]:
        resp, end = original(self, got, sent)  # type: ignore[arg-type]
        if resp.frames and not damaged:
            frames = bytearray(resp.frames)
            if how == "crc":
                frames[-1] ^= 0xFF
            else:
                frames[0:8] = (resp.first_offset + 7).to_bytes(8, "little")
                resp.frames_crc = crc32c(bytes(frames))
            resp.frames = bytes(frames)
            damaged.append(resp.first_offset)
        return resp, end

    monkeypatch.setattr(ReplicaLeader, "_response", response)
    return damaged


@pytest.mark.parametrize("how", ["crc", "header"])
async def test_damaged_frames_in_transit_are_refused_and_fetched_again(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    damaged = damage_once(monkeypatch, how)
    caplog.set_level(logging.WARNING, logger="ister.replication.follower")
    records = [f"m{i}".encode() for i in range(50)]
    await until(lambda: pair.follower.wal is not None, "the follower opened its copy")
    # The follower's stream must be open before the publish: only then does the leader keep appends as
    # frames (the answer that is damaged). Published earlier, they went as records, undamaged (seen under
    # `pytest -n 3` on a loaded machine).
    await until(lambda: pair.leader_wal._frame_tail is not None, "the follower's stream is open")
    # Acknowledged only once the follower holds them: the damaged answer is refused, the stream reopened,
    # the records sent again.
    first = await publish(pair.leader, pair.leader_wal, records)
    assert first == 0 and damaged == [0]
    assert any("reconnecting" in r.getMessage() for r in caplog.records), caplog.text
    follower = pair.follower
    assert follower.wal is not None and follower.wal.durable_offset == 50
    assert await follower_records(follower, 50) == records
    more = [f"n{i}".encode() for i in range(10)]
    assert await publish(pair.leader, pair.leader_wal, more) == 50
    await until(lambda: follower.wal is not None and follower.wal.durable_offset == 60, "the next records")
    assert await follower_records(follower, 60) == records + more
