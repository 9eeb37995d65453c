"""A follower re-pointed at a new leader while its stream to the old one is still being opened (issue 39:
a follower restarted just before its leader died never followed the next one). gRPC answers a write on a
call cancelled locally with `asyncio.CancelledError`; taken for the follower's own cancellation, it ended
the follower's task, silently, and the new leader kept waiting for a copy that no longer followed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ister.devcluster.ports import free_port
from ister.replication import follower as follower_module
from ister.replication.follower import LeaderTarget
from ister.server.replica_api import add_replica_service
from ister.storage.wal import Wal
from ister.wire.gen import ister_v1_pb2 as pb
from tests.integration.test_replica_stream_faults import RECORD, publish, replica_pair
from tests.support import until


@contextlib.asynccontextmanager
async def silent_listener() -> AsyncIterator[str]:
    """A TCP port that accepts and never speaks HTTP/2: a gRPC call to it stays unopened (the leader's
    process is gone or frozen and its port not yet closed)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    port = free_port()
    server = await asyncio.start_server(accept, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for w in held:
            w.close()
        server.close()


@pytest.mark.timeout(60)
async def test_a_follower_repointed_while_its_stream_opens_follows_the_new_leader(tmp_path: Path) -> None:
    async with replica_pair(tmp_path, tmp_path / "follower") as (pair, _), silent_listener() as dead_url:
        follower = pair.follower
        await until(lambda: follower.wal is not None, "the follower opened its copy")
        await publish(pair.leader, pair.leader_wal, [b"before"])
        # The follower is re-pointed at a leader that never answers (an older epoch's, as a record read
        # before the failover would name), and waits in the stream's first write.
        real = follower._target()
        assert real is not None
        stale = LeaderTarget(RECORD.epoch - 1, 1, dead_url)
        follower._target = lambda: stale
        follower.poke()
        await until(
            lambda: follower._stream is not None and follower._epoch == stale.epoch, "waiting on the old"
        )
        # The record names the real leader: the pending call is cancelled and the follower must go there.
        follower._target = lambda: real
        follower.poke()
        for round_ in range(3):
            first = await publish(pair.leader, pair.leader_wal, [f"after {round_}".encode()])
            assert first == 1 + round_
        assert follower._task is not None and not follower._task.done()


class FrozenLeader:
    """A leader whose process answers HTTP/2 (gRPC's threads run) but whose stream never says anything:
    a broker whose event loop is stuck."""

    async def replicate(
        self, req: object, acks: AsyncIterator[int]
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        await asyncio.Event().wait()
        yield pb.ReplicaFetchResponse()


@contextlib.asynccontextmanager
async def frozen_leader() -> AsyncIterator[str]:
    server = grpc.aio.server()
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    frozen = FrozenLeader()
    add_replica_service(server, lambda name: frozen)  # type: ignore[arg-type,return-value]
    await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.mark.timeout(60)
async def test_a_leader_that_never_answers_its_stream_is_left_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A gray failure: the named leader takes the stream and says nothing. The follower gives it up after
    `SILENT_STREAM_SECONDS` and looks again at whom the record names, even when no change woke it (here
    the target changes without a `poke`)."""
    monkeypatch.setattr(follower_module, "SILENT_STREAM_SECONDS", 1.0)
    async with replica_pair(tmp_path, tmp_path / "follower") as (pair, _), frozen_leader() as frozen_url:
        follower = pair.follower
        await until(lambda: follower.wal is not None, "the follower opened its copy")
        real = follower._target()
        assert real is not None
        follower._target = lambda: LeaderTarget(RECORD.epoch - 1, 1, frozen_url)
        follower.poke()
        await until(
            lambda: any("sent nothing for 1 s" in r.getMessage() for r in caplog.records),
            "the silence noticed",
        )
        follower._target = lambda: real
        assert await publish(pair.leader, pair.leader_wal, [b"after"]) == 0


@pytest.mark.timeout(60)
async def test_stopping_a_follower_whose_append_hangs_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A load of the topic here stops its follower first; an append that never finishes (a disk that
    hangs) must not hold that stop, and the topic, forever (a chaos run saw a topic unserved for minutes)."""
    monkeypatch.setattr(follower_module, "STOP_SECONDS", 0.5)
    async with replica_pair(tmp_path, tmp_path / "follower") as (pair, _):
        follower = pair.follower
        await until(lambda: follower.wal is not None, "the follower opened its copy")
        await publish(pair.leader, pair.leader_wal, [b"before"])
        wal = follower.wal
        assert wal is not None
        hung = asyncio.Event()

        real_frames, real_append = Wal.append_frames, Wal.append

        async def frames(self: Wal, *args: Any, **kwargs: Any) -> int:
            if self is not wal:
                return await real_frames(self, *args, **kwargs)
            hung.set()
            await asyncio.Event().wait()
            return 0

        async def append(self: Wal, *args: Any, **kwargs: Any) -> int:
            if self is not wal:
                return await real_append(self, *args, **kwargs)
            hung.set()
            await asyncio.Event().wait()
            return 0

        monkeypatch.setattr(Wal, "append_frames", frames)
        monkeypatch.setattr(Wal, "append", append)
        pair.leader.check_writable()
        await pair.leader_wal.append([b"stuck"])
        pair.leader.appended()
        await asyncio.wait_for(hung.wait(), 10)
        await asyncio.wait_for(follower.stop(), 10)  # before: waited for the append forever
        assert any("still pending" in r.getMessage() for r in caplog.records), caplog.text
