"""A replica leader's in-sync set (docs/replication.md): a follower that lags leaves it, one that caught
up rejoins, a replica gone too long is replaced, and every change is a compare-and-set of the replica
record (one that finds another leader or epoch fences the topic here). Also the lag it publishes."""

from __future__ import annotations

import contextlib
import logging

import msgspec

from ister.core.replication import (
    NO_LEADER,
    FollowerProgress,
    ReplicaRecord,
    leaving_replicas,
    replacement_step,
)
from ister.errors import (
    MetadataError,
    Unavailable,
)
from ister.metadata import keys
from ister.metadata.store import Compare, Put
from ister.replication import metrics
from ister.replication.leader_base import LeaderBase

log = logging.getLogger(__name__)

ISR_CHECK_SECONDS = 0.25
PEERS_CHECK_SECONDS = 1.0  # dead and draining replicas are looked for this often


class InSyncSet(LeaderBase):
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
