"""Replicated topics, the pure rules (issue 16): who leads, what is committed, who is in sync, how a
follower finds where its log diverges, whom the cluster promotes when a leader dies.

The model is Kafka's in-sync-set replication with leader epochs (docs/replication.md):

* `ReplicaRecord` (one per topic, in the metadata store, changed only by compare-and-set) names the replicas,
  the in-sync set (ISR), the leader and its epoch. The leader shrinks and grows the ISR; the cluster's leader
  promotes a new topic leader.
* A record is *committed* once every ISR member has it durably, and only while the ISR has at least
  `min_insync` members: an acknowledgement therefore always means at least `min_insync` durable copies, and
  every ISR member holds every committed record, so promoting any live ISR member loses nothing.
* Followers report how far their log matches the leader's *in the leader's current epoch*; a new leader
  commits nothing and serves nothing until every ISR member matches it up to where its epoch began (the
  Raft no-op, without spending an offset). So what readers see never goes back across a failover.
* A follower that joins an epoch truncates where its log and the leader's diverge, found from the two
  logs' epoch histories (epoch, first offset), never from a watermark it merely remembered (Kafka's
  KIP-101 and KIP-279 failure shapes).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

MAX_REPLICATION_FACTOR = 5
NO_LEADER = -1  # the leader is gone and no in-sync replica can take over yet: the topic waits


class ReplicaRecord(msgspec.Struct, frozen=True, kw_only=True):
    replicas: list[int]  # brokers holding the topic, the preferred leader first
    isr: list[int]  # in-sync replicas, the leader included
    leader: int
    epoch: int  # bumped at every promotion; a follower rejects anything from an older epoch
    min_insync: int
    # How many replicas the topic should have (0: as many as listed). More are listed while a new
    # follower replaces a dead or draining one: it joins before the one it replaces leaves.
    factor: int = 0
    # Set by an unclean recovery (`RecoverTopic`): the next leader's offsets start at or above this, the
    # end of what the last owner reserved, so no offset a dead leader handed out is handed out again.
    # Cleared by the record that leader writes.
    resume_at: int = 0

    @classmethod
    def parse(cls, value: Any) -> ReplicaRecord | None:
        try:
            record = msgspec.convert(value, cls, strict=True)
        except msgspec.ValidationError:
            return None
        return record if record.valid() else None

    def valid(self) -> bool:
        return (
            1 <= len(self.replicas) <= MAX_REPLICATION_FACTOR
            and len(set(self.replicas)) == len(self.replicas)
            and set(self.isr) <= set(self.replicas)
            and (self.leader in self.isr or self.leader == NO_LEADER)
            and self.epoch >= 1
            and 1 <= self.min_insync <= len(self.replicas)
            and 0 <= self.factor <= MAX_REPLICATION_FACTOR
            and self.resume_at >= 0
        )

    @property
    def target(self) -> int:
        return self.factor or len(self.replicas)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        if not self.resume_at:
            del out["resume_at"]  # only while a recovery waits for its leader
        return out

    def with_isr(self, isr: list[int]) -> ReplicaRecord:
        return msgspec.structs.replace(self, isr=sorted(set(isr)))


def initial_record(replicas: list[int], min_insync: int) -> ReplicaRecord:
    """The first record of a replicated topic: the first replica leads at epoch 1, all are in sync."""
    return ReplicaRecord(
        replicas=list(replicas), isr=sorted(replicas), leader=replicas[0], epoch=1, min_insync=min_insync
    )


# -- epoch histories and divergence --------------------------------------------------------------------------


@dataclass(slots=True)
class EpochHistory:
    """(epoch, first offset) of each epoch that has records in a log, ascending in both (the small file
    kept next to a replica's WAL)."""

    entries: list[tuple[int, int]] = field(default_factory=list)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """Records of `epoch` start at `start` (called before the first one is appended)."""
        if self.entries and epoch < self.entries[-1][0]:
            raise ValueError(f"epoch {epoch} after epoch {self.entries[-1][0]}")
        if self.entries and epoch == self.entries[-1][0]:
            return
        if self.entries and start < self.entries[-1][1]:
            raise ValueError(f"epoch {epoch} starting at {start} before the last one's start")
        if self.entries and start == self.entries[-1][1]:
            self.entries.pop()  # the previous epoch never got a record
        self.entries.append((epoch, start))

    def truncate(self, end: int) -> None:
        """The log now ends before `end`: forget epochs that started at or after it."""
        while self.entries and self.entries[-1][1] >= end:
            self.entries.pop()

    def epoch_at(self, offset: int) -> int:
        """The epoch of the record at `offset` (0 before the first epoch)."""
        starts = [s for _, s in self.entries]
        i = bisect.bisect_right(starts, offset) - 1
        return self.entries[i][0] if i >= 0 else 0

    def end_of(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the largest epoch in this log that is <= `epoch`, the offset where it ends here): the leader's
        answer to a follower asking where its last epoch ends. (0, first offset) when this log holds no
        such epoch."""
        found = 0
        end = self.entries[0][1] if self.entries else log_end
        for i, (e, _) in enumerate(self.entries):
            if e > epoch:
                break
            found = e
            end = self.entries[i + 1][1] if i + 1 < len(self.entries) else log_end
        return found, end


def divergence(leader: EpochHistory, leader_end: int, follower: EpochHistory, follower_end: int) -> int:
    """Where the follower must truncate its log to be a prefix of the leader's: the offset below which the
    two logs hold the same records.

    The leader says where the follower's last epoch (or the largest one it knows below it) ends; the
    follower also cuts its own records of any epoch the leader never had (KIP-279: a follower whose last
    epoch the leader does not know would otherwise keep conflicting records below the leader's answer).
    Relies on the log-matching property: one leader per epoch, so equal (offset, epoch) means equal record.
    """
    common, leader_stop = leader.end_of(follower.last_epoch, leader_end)
    _, follower_stop = follower.end_of(common, follower_end)
    return min(follower_end, leader_stop, follower_stop)


# -- the leader's view of its followers ---------------------------------------------------------------------


@dataclass(slots=True)
class FollowerProgress:
    matched: int = 0  # its log equals the leader's below this offset (reported in the leader's epoch)
    caught_up_at: float = 0.0  # when it last matched the leader's whole log


@dataclass(slots=True)
class LeaderState:
    """What a leader tracks for one topic in one epoch. Times are seconds on the caller's clock."""

    epoch: int
    epoch_start: int  # the leader's log end when it took over: nothing is served before this commits
    log_end: int
    committed: int  # never goes back; readers see offsets below it
    followers: dict[int, FollowerProgress] = field(default_factory=dict)

    @classmethod
    def take_over(
        cls, epoch: int, log_end: int, known_committed: int, now: float, followers: list[int]
    ) -> LeaderState:
        return cls(
            epoch=epoch,
            epoch_start=log_end,
            log_end=log_end,
            committed=min(known_committed, log_end),
            followers={f: FollowerProgress(caught_up_at=now) for f in followers},
        )

    @property
    def serving(self) -> bool:
        """Records are accepted and served once everything before this epoch is committed."""
        return self.committed >= self.epoch_start

    def appended(self, log_end: int, now: float) -> None:
        self.log_end = log_end

    def acked(self, follower: int, matched: int, now: float) -> None:
        """A follower's durable log equals the leader's below `matched` (its answer in this epoch)."""
        p = self.followers.setdefault(follower, FollowerProgress(caught_up_at=now))
        p.matched = max(p.matched, min(matched, self.log_end))
        if p.matched >= self.log_end:
            p.caught_up_at = now

    def advance(self, isr: list[int], leader: int, leader_durable: int) -> int | None:
        """Move `committed` to what every ISR member holds; None while the ISR is below `min_insync`
        (the caller refuses publishes). Never moves backwards."""
        ends = [leader_durable]
        for member in isr:
            if member != leader:
                p = self.followers.get(member)
                ends.append(p.matched if p is not None else 0)
        candidate = min(ends)
        if candidate > self.committed:
            self.committed = candidate
        return self.committed

    def lagging(self, isr: list[int], leader: int, now: float, max_lag_s: float) -> list[int]:
        """ISR members that have not matched the leader's whole log for `max_lag_s`: to be dropped."""
        out = []
        for member in isr:
            if member == leader:
                continue
            p = self.followers.get(member)
            if p is None or (p.matched < self.log_end and now - p.caught_up_at > max_lag_s):
                out.append(member)
        return out

    def rejoining(self, isr: list[int], replicas: list[int]) -> list[int]:
        """Replicas outside the ISR that hold everything committed (and this epoch's start): may rejoin."""
        floor = max(self.committed, self.epoch_start)
        return [
            r
            for r in replicas
            if r not in isr and (p := self.followers.get(r)) is not None and p.matched >= floor
        ]


NO_LIVE_ISR = "no live in-sync replica"


def replication_state(record: ReplicaRecord, live: set[int]) -> str:
    """What an operator must know first about a replicated topic, given the registered brokers."""
    live_isr = [b for b in record.isr if b in live]
    if not live_isr:
        return NO_LIVE_ISR  # nobody can take over without losing acknowledged records: it waits
    if len(live_isr) < record.min_insync:
        return "under min in-sync"
    if len(live_isr) < len(record.replicas):
        return "under-replicated"
    return "healthy"


@dataclass(frozen=True, slots=True)
class CopyEnd:
    """A surviving replica's local copy, as it reports it for an unclean recovery."""

    last_epoch: int
    end: int  # durable end
    committed_heard: int  # the newest commit its leader had told it (0: unknown)


@dataclass(frozen=True, slots=True)
class Recovery:
    record: ReplicaRecord  # to write (compare-and-set): the chosen broker alone in sync, nobody leading yet
    leader: int
    kept_end: int  # offsets below are kept: the chosen copy and the durable tier
    acked_end: int  # [kept_end, acked_end) were acknowledged for certain and are gone
    resume_at: int  # new offsets start here; [kept_end, resume_at) are never handed out again


@dataclass(frozen=True, slots=True)
class Survey:
    """A topic found without a live in-sync replica: its record (and version) and the live brokers."""

    record: ReplicaRecord
    version: int
    live: set[int]

    @property
    def survivors(self) -> list[int]:
        """The live replicas, whose copies are compared."""
        return [b for b in self.record.replicas if b in self.live]


def unclean_recovery(
    record: ReplicaRecord, live: set[int], copies: dict[int, CopyEnd], tier_end: int, reserved_until: int
) -> Recovery:
    """How a topic whose in-sync replicas are all gone restarts (Kafka's unclean leader election, without
    reusing offsets): on the live replica with the longest copy (last epoch, then end; a replica that
    holds no copy ranks last), or on any live broker in `live` when no replica lives (ValueError when none
    does, or an in-sync replica lives). `reserved_until` is the end of what the last owner reserved: no
    offset at or above it was ever handed out."""
    if set(record.isr) & live:
        raise ValueError(f"in-sync replica(s) {sorted(set(record.isr) & live)} are live")
    survivors = [b for b in record.replicas if b in live]
    pool = survivors or sorted(live)
    if not pool:
        raise ValueError("no broker is live")
    none = CopyEnd(0, 0, 0)
    leader = max(pool, key=lambda b: (copies.get(b, none).last_epoch, copies.get(b, none).end, -b))
    kept_end = max(copies.get(leader, none).end, tier_end)
    heard = max((c.committed_heard for c in copies.values()), default=0)
    resume_at = max(reserved_until, kept_end)
    replicas = record.replicas if leader in record.replicas else [leader, *record.replicas[:-1]]
    new = msgspec.structs.replace(
        record, replicas=replicas, isr=[leader], leader=NO_LEADER, epoch=record.epoch + 1, resume_at=resume_at
    )
    return Recovery(new, leader, kept_end, max(heard, kept_end), resume_at)


def under_min_isr(record: ReplicaRecord) -> bool:
    return len(record.isr) < record.min_insync


# -- promotion -------------------------------------------------------------------------------------------


def promote(record: ReplicaRecord, live: set[int], logs: dict[int, tuple[int, int]]) -> ReplicaRecord | None:
    """The record the cluster's leader writes when the topic's leader is gone: the live ISR member with the
    most records (`logs`: broker -> (last epoch, log end), as the replicas last reported) leads at the next
    epoch. None when no ISR member is alive (the topic waits: promoting a
    replica outside the ISR could lose acknowledged records)."""
    candidates = [b for b in record.isr if b in live and b in logs]
    if not candidates:
        return None
    best = max(candidates, key=lambda b: (logs[b], -b))
    # The ISR stays as it is: a dead member still holds every committed record and may be the one that
    # comes back; the new leader drops it once it lags, never below min_insync (found by the simulation:
    # dropping dead members here let one more failure strand acknowledged records).
    return msgspec.structs.replace(record, leader=best, epoch=record.epoch + 1)


def after_restart(
    record: ReplicaRecord, me: int, disk_intact: bool, live: set[int], logs: dict[int, tuple[int, int]]
) -> ReplicaRecord | None:
    """What a broker coming back writes (compare-and-set) before it touches the topic; None: nothing.

    A broker never resumes leading an epoch from before its restart: if the record still names it, the
    topic gets a new epoch and leader (itself again only with its disk intact and the most records), or
    NO_LEADER when no in-sync replica is alive. A broker that came back with an empty disk leaves the
    in-sync set first: it holds nothing, and promoting it would lose every acknowledged record.
    """
    isr = record.isr if disk_intact else [b for b in record.isr if b != me]
    if record.leader != me:
        return None if isr == record.isr else record.with_isr(isr)
    candidates = live if disk_intact else live - {me}
    promoted = promote(msgspec.structs.replace(record, isr=isr), candidates, logs)
    if promoted is not None:
        return promoted
    return msgspec.structs.replace(record, leader=NO_LEADER, epoch=record.epoch + 1, isr=sorted(isr))


def leaving_replicas(
    record: ReplicaRecord,
    leader: int,
    live: set[int],
    active: set[int],
    absent_since: dict[int, float],
    now: float,
    replace_after_s: float,
) -> set[int]:
    """The followers to replace: those on draining or drained brokers (live but not active) at once, and
    those whose broker has been gone for `replace_after_s`. `absent_since` (follower -> when it was first
    seen gone) is the caller's memory between calls and is updated here."""
    leaving: set[int] = set()
    for r in record.replicas:
        if r == leader:
            continue
        if r in live:
            absent_since.pop(r, None)
            if r not in active:
                leaving.add(r)  # draining or drained: its copies move away at once
        elif now - absent_since.setdefault(r, now) >= replace_after_s:
            leaving.add(r)
    return leaving


def clocks_to_forget(absent: dict[int, float], live: set[int], named: set[int]) -> list[int]:
    """Absent brokers whose replacement clock goes: back (live again), or named by no replica record any
    more (replaced everywhere, or an id lost with its disk that will never return)."""
    return sorted(b for b in absent if b in live or b not in named)


def replacement_step(
    record: ReplicaRecord, leaving: set[int], candidates: Callable[[], list[int]]
) -> ReplicaRecord | None:
    """The next record while the topic has fewer replicas than it should, or replicas on dead or draining
    brokers (`leaving`); None when nothing is to change now.

    A new follower from `candidates()` (best first) is added first; once every replica that stays is in
    sync, the leaving ones are dropped from the replicas and the in-sync set. So a replacement never leaves
    the topic with fewer in-sync copies than it had."""
    leaving = {r for r in leaving if r in record.replicas and r != record.leader}
    staying = [r for r in record.replicas if r not in leaving]
    if len(staying) < record.target and len(record.replicas) < MAX_REPLICATION_FACTOR:
        fresh = [c for c in candidates() if c not in record.replicas]
        if fresh:  # the factor is pinned first: the list is longer than it while the new one catches up
            return msgspec.structs.replace(
                record, replicas=[*record.replicas, fresh[0]], factor=record.target
            )
    if not leaving or len(staying) < record.min_insync:
        return None  # nothing leaves, or dropping them would leave too few copies
    if all(r in record.isr for r in staying):
        return msgspec.structs.replace(
            record, replicas=staying, isr=[r for r in record.isr if r not in leaving]
        )
    return None


def transfer(record: ReplicaRecord, to: int) -> ReplicaRecord | None:
    """A leadership transfer to an in-sync follower (a move): next epoch, same ISR. None if `to` is not in
    sync or already leads."""
    if to not in record.isr or to == record.leader:
        return None
    return msgspec.structs.replace(record, leader=to, epoch=record.epoch + 1)
