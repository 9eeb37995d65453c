"""`ReplicaLeader`: the owner's side of a replicated reliable topic (docs/replication.md).

It answers its followers' fetches from the WAL (records past the replication commit included), counts what
each follower holds, moves the commit (`core.replication.LeaderState`), caps what the topic's readers see at
it (`Wal.cap_visible`), releases publishes waiting for it, and keeps the in-sync set in the replica record
with compare-and-set: a lagging follower leaves, one that caught up rejoins. A compare-and-set that finds
another leader or epoch fences the topic here.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from crc32c import crc32c

from ister.clock import REAL_CLOCK, Clock
from ister.core.replication import (
    NO_LEADER,
    EpochHistory,
    FollowerProgress,
    LeaderState,
    ReplicaRecord,
    divergence,
    leaving_replicas,
    replacement_step,
)
from ister.errors import (
    CorruptRange,
    FailedPrecondition,
    InvalidArgument,
    MetadataError,
    StorageError,
    Unavailable,
)
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.store import Compare, MetadataStore, Put
from ister.replication import metrics
from ister.storage.wal import Wal, WalReader
from ister.storage.wal.frametail import FrameRun
from ister.tasks import TaskSupervisor
from ister.wire.gen import ister_v1_pb2 as pb

log = logging.getLogger(__name__)

ISR_CHECK_SECONDS = 0.25
PEERS_CHECK_SECONDS = 1.0  # dead and draining replicas are looked for this often
FETCH_MAX_BYTES = 4 * 1024 * 1024
FETCH_MAX_RECORDS = 65_536
WINDOW_RECORDS = 262_144  # records sent to a follower and not yet acknowledged by it, at most
IDLE_SECONDS = 1.0  # a stream with nothing new still says so (and the commit) this often
# The newest appends' frames kept to ship as they are (Wal.keep_frames), while any follower streams: trimmed
# below what every stream sent, so this bounds only what a slow stream leaves behind.
FRAME_TAIL_BYTES = 2 * 1024 * 1024


class ReplicaLeader:
    def __init__(
        self,
        name: TopicName,
        wal: Wal,
        history: EpochHistory,
        record: ReplicaRecord,
        version: int,
        store: MetadataStore,
        broker_id: int,
        max_lag_s: float,
        *,
        known_committed: int = 0,
        on_fenced: Callable[[str], None] | None = None,
        on_closed: Callable[[], None] | None = None,
        peers: Callable[[], tuple[set[int], set[int]]] | None = None,
        choose: Callable[[set[int]], list[int]] | None = None,
        replace_after_s: float = 120.0,
        live: Callable[[], set[int]] | None = None,
        clock: Clock = REAL_CLOCK,
        absences: Callable[[], dict[int, float]] | None = None,
        note_absent: Callable[[dict[int, float], bool], Awaitable[None]] | None = None,
        on_step_down: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.wal = wal
        self.history = history
        self.record = record
        self.version = version
        self.store = store
        self.broker_id = broker_id
        self.max_lag_s = max_lag_s
        self._clock = clock
        self._on_fenced = on_fenced
        self._on_closed = on_closed
        self._peers = peers  # (live brokers, active brokers) as the cluster view shows them
        self._live = live  # registered brokers, cheap to ask often
        self._choose = choose  # brokers for a new follower, best first, none of the given ones
        self.replace_after_s = replace_after_s
        # Broker -> wall-clock time it was first seen gone. Kept in metadata (`absences`, `note_absent`) so
        # that the replacement deadline survives a change of leader: under continuing faults a leader kept
        # in memory never lasted the whole wait. Without them, this leader's own memory.
        self._absences = absences
        self._note_absent = note_absent
        self._absent_since: dict[int, float] = {}
        self._on_step_down = on_step_down  # hands the topic back for a failover (its disk failed here)
        self._peers_checked = float("-inf")
        # Followers' streams (ended when this leader closes) and what each has sent: frames below all
        # of them are dropped.
        self._sent: dict[WalReader, int] = {}
        followers = [r for r in record.replicas if r != broker_id]
        self.state = LeaderState.take_over(
            record.epoch, wal.durable_offset, known_committed, clock.monotonic(), followers
        )
        self.fenced: str | None = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap of (end, seq, future)
        self._seq = itertools.count()
        self._tasks = TaskSupervisor(f"replica leader {name.full}")  # the in-sync checks
        self._isr_changed = asyncio.Event()
        self.last_fetch: dict[int, float] = dict.fromkeys(followers, clock.monotonic())
        # In-sync members that stopped following but cannot leave (the set would fall below the
        # minimum): nothing commits while there are any, so publishes are refused at once.
        self.stalled: list[int] = []
        wal.cap_visible(self.state.committed)

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def committed(self) -> int:
        return self.state.committed

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

    def _release_waiters(self) -> None:
        committed = self.state.committed
        waiters = self._waiters
        while waiters and waiters[0][0] <= committed:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    def _fail_waiters(self, exc: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(type(exc)(str(exc)))

    def _advance(self) -> None:
        """Move the commit to what every in-sync member holds (never with fewer than the minimum)."""
        record = self.record
        if len(record.isr) < record.min_insync or self.fenced is not None:
            return
        self.state.appended(self.wal.durable_offset, self._clock.monotonic())
        before = self.state.committed
        self.state.advance(record.isr, self.broker_id, self.wal.durable_offset)
        if self.state.committed != before:
            self.wal.cap_visible(self.state.committed)
            self._release_waiters()

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

    # -- the in-sync set ----------------------------------------------------------------------------------
    async def _isr_loop(self) -> None:
        while True:
            try:
                if self.wal.failed is not None and self.fenced is None:
                    if await self._step_down(f"its WAL failed here ({self.wal.failed})"):
                        return
                else:
                    await self._check_isr()
            except MetadataError as exc:
                log.warning("%s: updating the in-sync set failed (%s); retrying", self.name, exc)
            await self._clock.sleep(ISR_CHECK_SECONDS)

    async def _check_isr(self) -> None:
        record = self.record
        now = self._clock.monotonic()
        self.state.appended(self.wal.durable_offset, now)
        isr = list(record.isr)
        lagging = set(self.state.lagging(isr, self.broker_id, now, self.max_lag_s))
        # A member that stopped fetching lags too, even when no record was appended since (Kafka's rule).
        lagging |= {
            m for m in isr if m != self.broker_id and now - self.last_fetch.get(m, now) > self.max_lag_s
        }
        # A member whose broker is gone (its registration lapsed) leaves at once: waiting out its lag time
        # would only delay the commit after a failover.
        live = self._live() if self._live is not None else set()
        if live:  # empty: not known yet
            lagging |= {m for m in isr if m != self.broker_id and m not in live}
        # Leave, but never below the minimum: a dead member keeps its place rather than leaving a set that
        # one more failure would empty (found by the simulation).
        for member in sorted(lagging, key=lambda m: self._matched(m)):
            if len(isr) > record.min_insync:
                isr.remove(member)
        self._publish_lag(now)
        stalled = sorted(m for m in lagging if m in isr)
        if stalled and not self.stalled:
            self._fail_waiters(Unavailable(f"{self.name}: in-sync replica(s) {stalled} stopped following"))
        self.stalled = stalled
        # Rejoin only while it follows: a dead member still "holds everything" when nothing was appended.
        # Never one that lags now: a slow member gates the commit, so it always "holds everything
        # committed" and would rejoin in the pass that dropped it (a follower whose fsyncs take seconds
        # stalled every producer; found by tests/integration/test_gray_failures.py).
        isr += [
            r
            for r in self.state.rejoining(isr, record.replicas)
            if r not in lagging
            and now - self.last_fetch.get(r, float("-inf")) <= self.max_lag_s
            and (not live or r in live)
        ]
        if sorted(isr) != record.isr:
            await self._write_record(record.with_isr(isr))
        elif (replaced := await self._replacement(now)) is not None:
            await self._write_record(replaced)
        self._advance()

    async def _replacement(self, now: float) -> ReplicaRecord | None:
        """The next step replacing replicas on brokers gone for `replace_after_s` or draining."""
        if self._peers is None or self._choose is None:
            return None
        if now - self._peers_checked < PEERS_CHECK_SECONDS:
            return None
        self._peers_checked = now
        live, active = self._peers()
        record = self.record
        kept = self._absences() if self._absences is not None else self._absent_since
        wall = self._clock.time()
        # A clock set back (here or where the absence was first seen) restarts the wait instead of
        # stretching it by the jump; one set forward replaces early, which is safe (the new follower
        # joins before the old one leaves).
        ahead = {r: wall for r, since in kept.items() if since > wall}
        absent = {**kept, **ahead}
        leaving = leaving_replicas(record, self.broker_id, live, active, absent, wall, self.replace_after_s)
        if self._absences is None:
            self._absent_since = absent
        elif self._note_absent is not None:
            if ahead:
                await self._note_absent(ahead, True)  # stamped again, now
            if seen := {r: t for r, t in absent.items() if r not in kept}:
                await self._note_absent(seen, False)
        if not leaving and len(record.replicas) >= record.target:
            return None
        choose = self._choose
        return replacement_step(record, leaving, lambda: choose(set(record.replicas)))

    async def _step_down(self, reason: str) -> bool:
        """This broker's disk failed: leave the in-sync set with no leader at the next epoch (followers stop
        taking records from here), then hand the topic back so the cluster gives it to an in-sync replica.
        Not when no other in-sync replica exists (the topic would have none): it stays, refusing writes."""
        record = self.record
        others = [b for b in record.isr if b != self.broker_id]
        if not others:
            log.error(
                "%s: %s, and no other replica is in sync: it stays here, refusing writes", self.name, reason
            )
            return False
        new = msgspec.structs.replace(record, isr=sorted(others), leader=NO_LEADER, epoch=record.epoch + 1)
        key = keys.replicas(self.name)
        if not await self.store.txn([Compare(key, self.version)], [Put(key, new.to_json())]):
            self.fence("the replica record changed (another leader or epoch)")
            return True
        log.error("%s: %s: stepping down for a failover to %s", self.name, reason, sorted(others))
        self.record = new
        self.fence(f"stepped down: {reason}")
        if self._on_step_down is not None:
            await self._on_step_down()
        return True

    def _matched(self, member: int) -> int:
        p = self.state.followers.get(member)
        return p.matched if p is not None else 0

    async def _write_record(self, new: ReplicaRecord) -> None:
        key = keys.replicas(self.name)
        if await self.store.txn([Compare(key, self.version)], [Put(key, new.to_json())]):
            kv = await self.store.get(key)
            if kv is not None and ReplicaRecord.parse(kv.value) == new:
                log.info(
                    "%s: replicas %s -> %s, in sync %s -> %s (epoch %d)",
                    self.name,
                    self.record.replicas,
                    new.replicas,
                    self.record.isr,
                    new.isr,
                    new.epoch,
                )
                now = self._clock.monotonic()
                for r in new.replicas:
                    if r != self.broker_id and r not in self.state.followers:
                        self.state.followers[r] = FollowerProgress(caught_up_at=now)
                        self.last_fetch[r] = now
                for r in [f for f in self.state.followers if f not in new.replicas]:
                    del self.state.followers[r]
                    self.last_fetch.pop(r, None)
                left = set(self.record.isr) - set(new.isr)
                joined = set(new.isr) - set(self.record.isr)
                if left:
                    metrics.isr_shrinks.inc(len(left))
                if joined:
                    metrics.isr_expands.inc(len(joined))
                self.record, self.version = new, kv.version
                if len(new.isr) < new.min_insync:
                    self._fail_waiters(Unavailable(f"{self.name}: in-sync replicas below the minimum"))
                return
        self.fence("the replica record changed (another leader or epoch)")

    def fence(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
            log.warning("%s: replication fenced: %s", self.name, reason)
            for reader in list(self._sent):
                reader.close()
            self._fail_waiters(Unavailable(f"topic {self.name} is no longer led here ({reason})"))
            if self._on_fenced is not None:
                self._on_fenced(reason)

    def _publish_lag(self, now: float) -> None:
        topic = self.name.full
        end = self.wal.durable_offset
        for f, p in self.state.followers.items():
            metrics.replica_lag.labels(topic, str(f)).set(max(0, end - p.matched))
            behind = 0.0 if p.matched >= end else now - p.caught_up_at
            metrics.replica_lag_seconds.labels(topic, str(f)).set(behind)

    def forget_metrics(self) -> None:
        for f in self.state.followers:
            for gauge in (metrics.replica_lag, metrics.replica_lag_seconds):
                with contextlib.suppress(KeyError):
                    gauge.remove(self.name.full, str(f))

    @property
    def under_replicated(self) -> bool:
        return len(self.record.isr) < len(self.record.replicas)

    @property
    def under_min_isr(self) -> bool:
        return len(self.record.isr) < self.record.min_insync or bool(self.stalled)

    def lag(self) -> dict[int, int]:
        """Follower -> records it lacks (for describe and metrics)."""
        end = self.wal.durable_offset
        return {f: max(0, end - p.matched) for f, p in self.state.followers.items()}
