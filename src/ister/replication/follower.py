"""`ReplicaFollower`: this broker's copy of a replicated topic it does not lead (docs/replication.md).

It keeps the topic's WAL in the same place an owner would (so a promotion continues it where it stands),
pulls the leader's records with `IsterReplica.Fetch`, appends them with the same frame format and group
commit, and keeps the epoch history next to the WAL. Each fetch reports how far its durable log equals the
leader's: that is the acknowledgement the leader commits on. When the leader says the log diverges, the
suffix is cut; when the leader's WAL no longer holds the follower's next records (they are in the durable
tier), the copy restarts empty at the leader's first offset.

While this broker's data disk is below its headroom (storage/diskspace.py) the follower stops copying: it
ends its stream and waits for space, so the leader soon counts it out of the in-sync set (after
`cluster.replica_max_lag_seconds`) and commits on the other copies; once space returns it reconnects and
catches up from its durable end. An append refused by a full disk (ENOSPC) does the same: nothing of it
was acknowledged, and the next stream starts again at the durable end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from ister.client.transport import END_OF_STREAM, NO_CREDENTIALS, AioRpcError, Credentials, open_channel
from ister.core.backoff import Backoff, Retries
from ister.core.frames import HEADER, HEADER_SIZE
from ister.core.replication import EpochHistory
from ister.errors import StorageExhausted
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.records import parse_start
from ister.storage.objects import catalog
from ister.storage.objects.retention import deletable, file_ages
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal
from ister.storage.wal.epochs import load_epochs, save_epochs
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

ACK_IDLE_SECONDS = 1.0
FETCH_MAX_BYTES = 4 * 1024 * 1024
RETRY_SECONDS = 0.2
MAX_RETRY_SECONDS = 2.0
RETRY_BACKOFF = Backoff(first=RETRY_SECONDS, cap=MAX_RETRY_SECONDS)
WARN_EVERY_SECONDS = 30.0
# A leader's stream says something at least every second (records or a heartbeat) unless this copy's
# window is full; this long in silence means a peer that accepts and never answers (a frozen process,
# a half-open connection): the stream is dropped and opened again.
SILENT_STREAM_SECONDS = 10.0
# Stopping waits this long for the loop and its pending appends, then goes on (closing the WAL fails what
# is left): a load of the topic here waits for the stop, and one that hung kept a topic unserved for
# minutes in a chaos run.
STOP_SECONDS = 10.0


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
        # Cumulative, for the load report's follower rates (what this copy costs its broker in disk writes).
        self.records_appended = 0
        self.bytes_appended = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stream: asyncio.Task[bool] | None = None  # the open stream, cancelled when the leader changes
        self._epoch = 0
        self._warned_at = -WARN_EVERY_SECONDS
        self.paused_for_space = False  # not copying: the data disk is below its headroom (or full)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"follow {self.name.full}")

    @property
    def ended(self) -> BaseException | None:
        """Why this follower's loop is no longer running (None while it runs or before `start`)."""
        task = self._task
        if task is None or not task.done():
            return None
        return asyncio.CancelledError() if task.cancelled() else task.exception() or RuntimeError("returned")

    def poke(self) -> None:
        """The replica record changed: follow whoever leads now (a stream to an old leader is dropped,
        also one still being opened: a cancelled gRPC call may never finish its first write)."""
        target = self._target()
        if self._stream is not None and (target is None or target.epoch != self._epoch):
            self._stream.cancel()
        self._changed.set()

    async def stop(self) -> None:
        """Stop fetching and close the WAL (a promotion reopens it as the owner)."""
        task = self._task
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=STOP_SECONDS)
            if not done:
                log.error(
                    "%s: following did not stop within %.0f s (%r); its copy is closed anyway",
                    self.name,
                    STOP_SECONDS,
                    task,
                )
            elif not task.cancelled() and task.exception() is not None:
                log.warning("%s: following had ended with %r", self.name, task.exception())
            self._task = None
        if self.wal is not None:
            await self.wal.close()
            self.wal = None

    async def trim(self) -> int:
        """Delete this copy's oldest segment files that the durable tier holds (the leader's retention
        rules: `storage.durable.local_retention_*`); returns how many. A promotion then reads them from the
        tier, as the leader would."""
        wal = self.wal
        storage = self.storage
        if wal is None or wal.failed is not None:
            return 0
        # Retention moved the topic's start offset: this copy drops what lies wholly below it too.
        dropped = 0
        if wal.segment_count > 1:  # only closed files can go: no metadata read for a one-file copy
            start = parse_start(await storage.store.get(keys.start_offset(self.name)))
            dropped = await wal.drop_below(start) if start else 0
        if storage.objects is None:
            return dropped
        descriptors = await catalog.list_descriptors(storage.store, self.name)
        segments = wal.segments()
        ages = None
        if storage.retention.keep_seconds > 0:
            ages = await asyncio.to_thread(file_ages, [p for _, p, _ in segments], time.time())
        paths = deletable(segments, descriptors, storage.retention, ages=ages, holes=wal.holes())
        return dropped + (await wal.drop_segments(paths) if paths else 0)

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
        retries = Retries(RETRY_BACKOFF)
        while True:
            try:
                if self.storage.space.refusal is not None:
                    await self._wait_for_room()
                    continue
                self.paused_for_space = False
                if self.wal is None:
                    self.wal = await self._open()
                if await self._fetch_once():
                    retries.reset()
                    continue
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # Raised by a gRPC call cancelled under us, not by `stop`: retried like any failure.
                log.warning("%s: following the leader was cancelled from below; retrying", self.name)
            except AioRpcError as exc:
                self._fetch_failed(exc)
            except StorageExhausted as exc:  # the disk filled between two checks: wait as for headroom
                self.paused_for_space = True
                self.storage.space.wake()
                log.debug("%s: an append was refused (%s); waiting for space", self.name, exc)
            except Exception as exc:
                log.warning("%s: following the leader failed (%s); retrying", self.name, exc)
                if self.wal is not None and self.wal.failed is not None:
                    with contextlib.suppress(Exception):
                        await self.wal.close()
                    self.wal = None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(retries.next()):
                    await self._changed.wait()

    async def _wait_for_room(self) -> None:
        """Stop copying until the data disk has its headroom free again (the broker logs the episode
        once, storage/diskspace.py; the leader sees this copy fall behind)."""
        if not self.paused_for_space:
            log.debug("%s: the data disk is below its headroom; this copy stops following", self.name)
        self.paused_for_space = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(MAX_RETRY_SECONDS):
                await self.storage.space.room.wait()

    def _fetch_failed(self, exc: AioRpcError) -> None:
        """Logged as a warning at most every `WARN_EVERY_SECONDS` (a leader that moved or died answers like
        this for a moment; one that cannot be reached at all, e.g. a TLS peer CA missing, must be seen)."""
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning("%s: following the leader failed: %s %s", self.name, exc.code(), exc.details())
        else:
            log.debug("%s: fetch failed: %s %s", self.name, exc.code(), exc.details())

    async def _fetch_once(self) -> bool:
        """One stream from the leader, until it ends; False when there is nobody to follow right now.

        The stream runs in its own task so that `poke` can end it wherever it waits (gRPC answers a write
        on a call cancelled before it opened by waiting forever); True then: follow the new leader now."""
        target = self._target()
        wal = self.wal
        assert wal is not None
        if target is None or target.broker_id == self.broker_id:
            return False
        stream = asyncio.get_running_loop().create_task(self._stream_from(target, wal))
        self._stream, self._epoch = stream, target.epoch
        try:
            return await stream
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this follower is stopping
            return True  # `poke` dropped the stream: the record names another leader
        except TimeoutError:
            log.warning(
                "%s: the leader (broker %d) sent nothing for %.0f s; reconnecting",
                self.name,
                target.broker_id,
                SILENT_STREAM_SECONDS,
            )
            return False
        finally:
            self._stream = None
            if not stream.done():
                stream.cancel()
                with contextlib.suppress(BaseException):
                    await stream

    async def _stream_from(self, target: LeaderTarget, wal: Wal) -> bool:
        req = pb.ReplicaFetchRequest(
            topic=self.name.full,
            follower=self.broker_id,
            epoch=target.epoch,
            log_start=wal.first_offset,
            log_end=wal.durable_offset,
            max_bytes=FETCH_MAX_BYTES,
            frames_ok=True,
        )
        req.history.extend(pb.EpochStart(epoch=e, start=s) for e, s in self.history.entries)
        call = self._channels.stub(target.url).Replicate(metadata=self._channels.metadata())
        stream = _Acks(call, wal)
        try:
            async with asyncio.timeout(SILENT_STREAM_SECONDS):
                await call.write(pb.ReplicaUp(open=req))
            stream.start()
            while True:
                async with asyncio.timeout(SILENT_STREAM_SECONDS):
                    resp = await call.read()
                if resp is END_OF_STREAM:
                    return True
                ended = await self._handle(resp, target, stream)
                if ended is not None:
                    return ended
        finally:
            await stream.close()
            call.cancel()

    async def _handle(self, resp: Any, target: LeaderTarget, stream: _Acks) -> bool | None:
        """Apply one answer; True/False: the stream is over (reconnect at once / after a pause)."""
        self.fetches += 1
        if resp.epoch < target.epoch:
            return False  # a stale leader answered: wait for the new one
        self.leader_committed = max(self.leader_committed, resp.committed)
        if resp.HasField("truncate_to") or resp.HasField("reset_to") or resp.HasField("skip_to"):
            await stream.drain()
            if resp.HasField("truncate_to"):
                await self._truncate(resp.truncate_to)
            elif resp.HasField("reset_to"):
                await self._reset(resp.reset_to)
            else:
                wal, self.wal = self.wal, None  # reopened by `_run` if the skip fails half way
                assert wal is not None
                log.warning(
                    "%s: offsets up to %d are gone on the leader; this copy skips them",
                    self.name,
                    resp.skip_to,
                )
                self.wal = await self.storage.skip_to(self.name, wal, resp.skip_to)
            return True
        stream.check()
        count = resp.frame_count if resp.frames else len(resp.records)
        if not count:
            return None
        if self.storage.space.refusal is not None:
            return False  # below the headroom: end the stream, _run waits for space

        if resp.first_offset != stream.expected:
            log.warning(
                "%s: the leader sent records from %d, the local log ends at %d; reconnecting",
                self.name,
                resp.first_offset,
                stream.expected,
            )
            return False
        before = list(self.history.entries)
        for e in resp.epochs:
            self.history.begin(e.epoch, e.start)
        if self.history.entries != before:
            # Before the records: an entry whose records did not land is dropped at the next open.
            await asyncio.to_thread(save_epochs, stream.wal.directory, self.history)
        if resp.frames:
            frames = resp.frames
            problem = check_frames(frames, resp.first_offset, count, resp.frames_crc)
            if problem is not None:
                log.warning(
                    "%s: the leader's frames from %d %s; reconnecting", self.name, resp.first_offset, problem
                )
                return False
            stream.append_frames(resp.first_offset, count, frames)
            self.bytes_appended += len(frames) - HEADER_SIZE * count
        else:
            records = list(resp.records)
            stream.append(records)
            self.bytes_appended += sum(len(r) for r in records)
        self.records_appended += count
        return None

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


def check_frames(frames: bytes, first: int, count: int, crc: int) -> str | None:
    """Why `frames` cannot be appended as `count` frames from offset `first` (None: they can). Checks the
    checksum of the whole, the first header and the size only: a walk of every header would cost about two
    thirds of encoding the frames again. The leader's WAL encoded them; each payload's own CRC is checked
    whenever it is read back (and at recovery)."""
    if crc32c(frames) != crc:
        return "fail their checksum"
    if len(frames) < HEADER_SIZE * count:
        return f"are {len(frames)} bytes, too short for {count} frames"
    offset, length, _ = HEADER.unpack_from(frames, 0)
    if offset != first or HEADER_SIZE + length > len(frames):
        return f"begin with a frame for offset {offset} of {length} bytes"
    return None


class ChannelPool:
    """One gRPC channel per peer broker URL, shared by all followers of this broker; `metadata` gives
    the credentials each new stream carries (security/peer.py)."""

    def __init__(
        self,
        credentials: Credentials = NO_CREDENTIALS,
        metadata: Callable[[], list[tuple[str, str]]] = list,
    ) -> None:
        self.credentials = credentials
        self.metadata = metadata
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []

    def stub(self, url: str) -> Any:
        stub = self._stubs.get(url)
        if stub is None:
            channel = open_channel(url, self.credentials)
            self._channels.append(channel)
            stub = self._stubs[url] = pb_grpc.IsterReplicaStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels:
            with contextlib.suppress(Exception):
                await channel.close()
        self._channels.clear()
        self._stubs.clear()


class _Acks:
    """A follower stream's appends and acknowledgements: records are appended in order without waiting
    (the next ones arrive while these are fsync'd), and one writer tells the leader the durable end each
    time it moves, and about every second while idle (the leader counts a silent follower as gone)."""

    def __init__(self, call: Any, wal: Wal) -> None:
        self.call = call
        self.wal = wal
        self.expected = wal.next_offset
        self._durable = asyncio.Event()
        self._appends: list[asyncio.Task[int]] = []
        self._writer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(self._write())

    def append(self, records: list[bytes]) -> None:
        self._track(self.wal.append(records, at=self.expected), len(records))

    def append_frames(self, first: int, count: int, frames: bytes) -> None:
        self._track(self.wal.append_frames(first, count, frames), count)

    def _track(self, append: Coroutine[Any, Any, int], count: int) -> None:
        # In order, without waiting: the offsets are checked as each append starts, and one refused (disk
        # full) fails every later one (`at`), so the copy never gets records at the wrong offsets.
        task = asyncio.get_running_loop().create_task(append)
        task.add_done_callback(self._appended)
        self._appends.append(task)
        self.expected += count

    def _appended(self, task: asyncio.Task[int]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._durable.set()

    def check(self) -> None:
        """Raise what failed: an append, or the writer."""
        pending = []
        for task in self._appends:
            if task.done():
                task.result()
            else:
                pending.append(task)
        self._appends = pending
        if self._writer is not None and self._writer.done():
            if self._writer.cancelled():  # not by us (close cancels it after the last check)
                raise RuntimeError("the acknowledgement writer stopped")
            self._writer.result()

    async def drain(self) -> None:
        await asyncio.gather(*self._appends)
        self._appends.clear()

    async def _write(self) -> None:
        told = -1
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ACK_IDLE_SECONDS):
                    await self._durable.wait()
            moved = self._durable.is_set()
            self._durable.clear()  # after waking: a set during the write below wakes the next wait
            end = self.wal.durable_offset
            if end != told or not moved:
                await self.call.write(pb.ReplicaUp(acked=end))
                told = end

    async def close(self) -> None:
        """Stop the writer and wait for the pending appends, at most `STOP_SECONDS`: an append that never
        finishes must not hold the stream (and a load of the topic here) forever."""
        if self._writer is not None:
            self._writer.cancel()
        pending = [t for t in (self._writer, *self._appends) if t is not None]
        if not pending:
            return
        done, late = await asyncio.wait(pending, timeout=STOP_SECONDS)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a failed append was already seen by `check` or is moot now
        if late:
            log.warning(
                "%d append(s) of a follower stream still pending after %.0f s", len(late), STOP_SECONDS
            )
