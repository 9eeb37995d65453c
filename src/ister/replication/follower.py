"""`ReplicaFollower`: this broker's copy of a replicated topic it does not lead (docs/replication.md).

It keeps the topic's WAL in the same place an owner would (so a promotion continues it where it stands),
pulls the leader's records with `IsterReplica.Fetch`, appends them with the same frame format and group
commit, and keeps the epoch history next to the WAL. Each fetch reports how far its durable log equals the
leader's: that is the acknowledgement the leader commits on. When the leader says the log diverges, the
suffix is cut; when the leader's WAL no longer holds the follower's next records (they are in the durable
tier), the copy restarts empty at the leader's first offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ister.client._conn import open_channel
from ister.core.replication import EpochHistory
from ister.ids import TopicName
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal
from ister.storage.wal.epochs import load_epochs, save_epochs
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 500
FETCH_MAX_BYTES = 4 * 1024 * 1024
RETRY_SECONDS = 0.2
MAX_RETRY_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class LeaderTarget:
    epoch: int
    broker_id: int
    url: str


class ReplicaFollower:
    def __init__(
        self,
        name: TopicName,
        storage: TopicStorage,
        broker_id: int,
        target: Callable[[], LeaderTarget | None],
        channels: ChannelPool,
    ) -> None:
        self.name = name
        self.storage = storage
        self.broker_id = broker_id
        self._target = target
        self._channels = channels
        self.wal: Wal | None = None
        self.history = EpochHistory()
        self.leader_committed = 0  # the newest commit the leader told us (a promotion starts from it)
        self.fetches = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"follow {self.name.full}")

    def poke(self) -> None:
        """The replica record changed (a new leader or epoch): fetch from whoever leads now."""
        self._changed.set()

    async def stop(self) -> None:
        """Stop fetching and close the WAL (a promotion reopens it as the owner)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.wal is not None:
            await self.wal.close()
            self.wal = None

    async def _open(self) -> Wal:
        loaded = await asyncio.to_thread(load_epochs, self.storage.wal_dir(self.name))
        if loaded.status == "damaged":
            log.warning(
                "%s: the epoch history is damaged (%s): the leader will cut this copy where "
                "the histories agree",
                self.name,
                loaded.problem,
            )
        self.history = loaded.history
        wal = await self.storage.open_wal(self.name)
        self.history.truncate(wal.next_offset)  # entries saved before a crash cut their records short
        return wal

    async def _run(self) -> None:
        delay = RETRY_SECONDS
        while True:
            try:
                if self.wal is None:
                    self.wal = await self._open()
                if await self._fetch_once():
                    delay = RETRY_SECONDS
                    continue
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.debug("%s: fetch failed: %s %s", self.name, exc.code(), exc.details())
            except Exception as exc:
                log.warning("%s: following the leader failed (%s); retrying", self.name, exc)
                if self.wal is not None and self.wal.failed is not None:
                    with contextlib.suppress(Exception):
                        await self.wal.close()
                    self.wal = None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._changed.wait()
            delay = min(delay * 2, MAX_RETRY_SECONDS)

    async def _fetch_once(self) -> bool:
        """One fetch and what it says; False when there is nobody to fetch from right now."""
        target = self._target()
        wal = self.wal
        assert wal is not None
        if target is None or target.broker_id == self.broker_id:
            return False
        req = pb.ReplicaFetchRequest(
            topic=self.name.full,
            follower=self.broker_id,
            epoch=target.epoch,
            log_start=wal.first_offset,
            log_end=wal.durable_offset,
            max_bytes=FETCH_MAX_BYTES,
            wait_ms=FETCH_WAIT_MS,
        )
        req.history.extend(pb.EpochStart(epoch=e, start=s) for e, s in self.history.entries)
        stub = self._channels.stub(target.url)
        resp = await stub.Fetch(req, timeout=FETCH_WAIT_MS / 1000 + 10)
        self.fetches += 1
        if resp.epoch < target.epoch:
            return False  # a stale leader answered: wait for the new one
        self.leader_committed = max(self.leader_committed, resp.committed)
        if resp.HasField("truncate_to"):
            await self._truncate(resp.truncate_to)
            return True
        if resp.HasField("reset_to"):
            await self._reset(resp.reset_to)
            return True
        if not resp.records:
            return True
        if resp.first_offset != wal.next_offset:
            log.warning(
                "%s: the leader sent records from %d, the local log ends at %d; asking again",
                self.name,
                resp.first_offset,
                wal.next_offset,
            )
            return False
        before = list(self.history.entries)
        for e in resp.epochs:
            self.history.begin(e.epoch, e.start)
        if self.history.entries != before:
            # Before the records: an entry whose records did not land is dropped at the next open.
            await asyncio.to_thread(save_epochs, wal.directory, self.history)
        await wal.append(list(resp.records))
        return True

    async def _truncate(self, end: int) -> None:
        wal = self.wal
        assert wal is not None
        log.info("%s: cutting the local copy at %d (it diverges from the leader's)", self.name, end)
        if end < wal.first_offset:
            await self._reset(end)
            return
        await wal.truncate(end)  # the WAL first, then the history (an entry past the log is dropped at open)
        self.history.truncate(end)
        await asyncio.to_thread(save_epochs, wal.directory, self.history)

    async def _reset(self, start: int) -> None:
        """Drop the local copy and restart it empty at `start`."""
        log.info("%s: restarting the local copy empty at offset %d", self.name, start)
        wal = self.wal
        assert wal is not None
        await wal.reset(start)
        self.history = EpochHistory()
        await asyncio.to_thread(save_epochs, wal.directory, self.history)


class ChannelPool:
    """One gRPC channel per peer broker URL, shared by all followers of this broker."""

    def __init__(self) -> None:
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []

    def stub(self, url: str) -> Any:
        stub = self._stubs.get(url)
        if stub is None:
            channel = open_channel(url)
            self._channels.append(channel)
            stub = self._stubs[url] = pb_grpc.IsterReplicaStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels:
            with contextlib.suppress(Exception):
                await channel.close()
        self._channels.clear()
        self._stubs.clear()
