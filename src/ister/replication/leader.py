"""`ReplicaLeader`: the owner's side of a replicated reliable topic (docs/replication.md).

It answers its followers' fetches from the WAL (records past the replication commit included), counts what
each follower holds, moves the commit (`core.replication.LeaderState`), caps what the topic's readers see at
it (`Wal.cap_visible`), releases publishes waiting for it, and keeps the in-sync set in the replica record
with compare-and-set: a lagging follower leaves, one that caught up rejoins. A compare-and-set that finds
another leader or epoch fences the topic here.

Its parts: here the publishes' waits and the followers' streams; `insync.py` the in-sync set; both over
`leader_base.py` (the record, the commit, waiting publishes, fencing).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import AsyncIterator

from crc32c import crc32c

from ister.core.replication import (
    EpochHistory,
    FollowerProgress,
    divergence,
)
from ister.errors import (
    CorruptRange,
    FailedPrecondition,
    InvalidArgument,
    StorageError,
    Unavailable,
)
from ister.replication import metrics
from ister.replication.insync import ISR_CHECK_SECONDS, InSyncSet
from ister.storage.wal.frametail import FrameRun
from ister.wire.gen import ister_v1_pb2 as pb

log = logging.getLogger(__name__)

FETCH_MAX_BYTES = 4 * 1024 * 1024
FETCH_MAX_RECORDS = 65_536
WINDOW_RECORDS = 262_144  # records sent to a follower and not yet acknowledged by it, at most
IDLE_SECONDS = 1.0  # a stream with nothing new still says so (and the commit) this often
# The newest appends' frames kept to ship as they are (Wal.keep_frames), while any follower streams: trimmed
# below what every stream sent, so this bounds only what a slow stream leaves behind.
FRAME_TAIL_BYTES = 2 * 1024 * 1024


class ReplicaLeader(InSyncSet):
    def start(self) -> None:
        self._advance()
        self._tasks.spawn(self._isr_loop(), f"isr {self.name.full}")

    async def close(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
        self._fail_waiters(
            Unavailable(f"topic {self.name} is no longer led here ({reason}); redo the lookup")
        )
        for reader in list(self._sent):
            reader.close()  # ends the followers' streams now
        self.wal.keep_frames(0)
        await self._tasks.close()
        self.forget_metrics()
        if self._on_closed is not None:
            self._on_closed()
            self._on_closed = None

    # -- publishes ----------------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Refuse a publish up front when the in-sync set is below the minimum (nothing would commit)."""
        if self.fenced is not None:
            raise Unavailable(f"topic {self.name} is no longer led here ({self.fenced}); redo the lookup")
        record = self.record
        if len(record.isr) < record.min_insync:
            raise Unavailable(
                f"topic {self.name}: {len(record.isr)} in-sync replica(s) {record.isr}, fewer than "
                f"min_insync_replicas {record.min_insync}; publishes are refused until a follower catches up"
            )
        if self.stalled:
            raise Unavailable(
                f"topic {self.name}: in-sync replica(s) {self.stalled} stopped following and the in-sync set "
                f"{record.isr} cannot shrink below min_insync_replicas {record.min_insync}; publishes are "
                "refused until a follower catches up"
            )

    async def wait_committed(self, end: int) -> None:
        """Return once every offset below `end` is on enough replicas (Unavailable if that cannot happen
        here any more: the topic lost its leadership or its in-sync set fell below the minimum)."""
        self._advance()
        if end <= self.state.committed:
            return
        self.check_writable()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end, next(self._seq), future))
        await future

    async def hand_over(self, within: float) -> None:
        """Return once the in-sync replicas hold every record (the next owner takes over from its own copy);
        Unavailable after `within` seconds, or at once when this leader is fenced. An in-sync member that
        stalled (a pause, a loaded machine) is waited for: failing the move at once would hold the topic
        here for the load manager's whole back-off over a hiccup."""
        end = self.wal.next_offset
        await self.wal.flush()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with self._clock.timeout(within):
                while self.fenced is None:
                    self._advance()
                    if self.state.committed >= end:
                        return
                    future: asyncio.Future[None] = loop.create_future()
                    heapq.heappush(self._waiters, (end, next(self._seq), future))
                    try:
                        await future
                    except Unavailable:
                        # Waiters are failed when a member stalls or the set shrinks: look again at the
                        # next in-sync check rather than at once.
                        await self._clock.sleep(ISR_CHECK_SECONDS)
        raise Unavailable(
            f"cannot move {self.name}: its in-sync replicas {self.record.isr} do not hold offsets up to "
            f"{end - 1} yet ({self.state.committed} committed); it stays on this broker"
            + (f" ({self.fenced})" if self.fenced is not None else "")
        )

    def appended(self) -> None:
        """Records became durable here (an RF-1 in-sync set commits them at once)."""
        self._advance()

    # -- followers' streams -------------------------------------------------------------------------------
    async def replicate(
        self, req: pb.ReplicaFetchRequest, acks: AsyncIterator[int]
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        """One follower's stream: where its log must be cut or restarted (one answer, then the end), else
        records as they become durable here, at most `WINDOW_RECORDS` ahead of what it acknowledged."""
        if self.fenced is not None:
            raise Unavailable(f"topic {self.name} is no longer led here ({self.fenced})")
        follower = req.follower
        if follower not in self.record.replicas or follower == self.broker_id:
            raise FailedPrecondition(f"broker {follower} is not a follower of {self.name}")
        if req.epoch > self.epoch:
            raise FailedPrecondition(
                f"{self.name}: the follower knows epoch {req.epoch}, this leader's is {self.epoch} (stale)"
            )
        wal = self.wal
        theirs = EpochHistory([(e.epoch, e.start) for e in req.history])
        cut = divergence(self.history, wal.durable_offset, theirs, req.log_end)
        if cut < req.log_end:
            yield pb.ReplicaFetchResponse(epoch=self.epoch, truncate_to=cut, committed=self.state.committed)
            return
        start = req.log_end
        if start < wal.first_offset or req.log_start > start:
            # The records after the follower's end are only in the durable tier now: it restarts empty at
            # this WAL's first offset (it reads older ones from the tier if it ever leads).
            yield pb.ReplicaFetchResponse(
                epoch=self.epoch, reset_to=wal.first_offset, committed=self.state.committed
            )
            return
        # Its log equals ours below `start`: exactly that (not the most it ever had: a copy that lost its
        # disk comes back shorter and must not be counted for what it no longer holds).
        self._progress(follower, start, reset=True)
        async for resp in self._stream(follower, start, req.frames_ok, acks):
            yield resp

    async def _stream(
        self, follower: int, start: int, frames_ok: bool, acks: AsyncIterator[int]
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        wal = self.wal
        sent = start
        acked = start
        moved = asyncio.Event()
        trips = metrics.RoundTrips()

        async def take_acks() -> None:
            nonlocal acked
            async for end in acks:
                if not acked <= end <= sent:
                    raise InvalidArgument(f"acknowledged {end}, outside [{acked}, {sent}] of {self.name}")
                acked = end
                trips.acked(end)
                self._progress(follower, end)
                moved.set()

        acks_task = asyncio.get_running_loop().create_task(take_acks())
        reader = wal.reader(start, skip_holes=False, durable=True)
        self._sent[reader] = sent
        if frames_ok:
            wal.keep_frames(FRAME_TAIL_BYTES)
        try:
            while not acks_task.done():
                if self.fenced is not None:
                    raise Unavailable(f"topic {self.name} is no longer led here ({self.fenced})")
                room = WINDOW_RECORDS - (sent - acked)
                if room <= 0:
                    moved.clear()
                    with contextlib.suppress(TimeoutError):
                        async with self._clock.timeout(IDLE_SECONDS):
                            await moved.wait()
                    continue
                wanted = min(room, FETCH_MAX_RECORDS)
                try:
                    if frames_ok:
                        got = await reader.read_run(wanted, FETCH_MAX_BYTES, IDLE_SECONDS)
                    else:
                        got = await reader.read(wanted, FETCH_MAX_BYTES, IDLE_SECONDS)
                except CorruptRange as exc:
                    hole = wal.hole_at(sent)
                    if hole is not None and hole.lost and hole.first <= sent:
                        # Offsets lost here for good (an unclean recovery): the follower skips them too.
                        yield pb.ReplicaFetchResponse(
                            epoch=self.epoch, skip_to=hole.end, committed=self.committed
                        )
                        return
                    why = f"{self.name}: the leader's WAL cannot serve offsets from {sent} ({exc})"
                    raise Unavailable(why) from exc
                except StorageError:
                    if not reader.closed:
                        raise
                    # This leader closed or was fenced: the follower looks for the new one.
                    why = self.fenced or "closed"
                    raise Unavailable(f"topic {self.name} is no longer led here ({why})") from None
                resp, sent = self._response(got, sent)
                if got:
                    trips.sent(sent)
                    self._sent[reader] = sent
                    wal.trim_frames(min(self._sent.values()))
                yield resp  # with no records: a heartbeat carrying the commit
            acks_task.result()  # the follower ended its side: its error, if any
        finally:
            self._sent.pop(reader, None)
            if not self._sent:
                wal.keep_frames(0)  # nobody to ship to: no frames kept
            reader.close()
            acks_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acks_task

    def _response(
        self, got: list[tuple[int, bytes]] | FrameRun, sent: int
    ) -> tuple[pb.ReplicaFetchResponse, int]:
        """The answer carrying `got` (records or frames from `sent`; none: a heartbeat), and where the
        stream then stands."""
        resp = pb.ReplicaFetchResponse(epoch=self.epoch, first_offset=sent, committed=self.committed)
        if isinstance(got, FrameRun):
            end = got.end
            frames = got.blobs[0] if len(got.blobs) == 1 else b"".join(got.blobs)
            resp.frames = frames
            resp.frame_count = got.count
            resp.frames_crc = crc32c(frames)
        elif got:
            end = got[-1][0] + 1
            # the cache may hold msgspec.Raw views of the publishers' buffers
            resp.records.extend([bytes(r) for _, r in got])
        else:
            return resp, sent
        resp.epochs.append(pb.EpochStart(epoch=self.history.epoch_at(sent), start=sent))
        resp.epochs.extend(pb.EpochStart(epoch=e, start=s) for e, s in self.history.entries if sent < s < end)
        return resp, end

    def _progress(self, follower: int, end: int, *, reset: bool = False) -> None:
        now = self._clock.monotonic()
        self.last_fetch[follower] = now
        if reset:
            p = self.state.followers.setdefault(follower, FollowerProgress(caught_up_at=now))
            p.matched = min(end, self.state.log_end)
        self.state.acked(follower, end, now)
        self._advance()
