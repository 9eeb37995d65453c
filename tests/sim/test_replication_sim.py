"""Seeded schedules of one replicated topic (RF 3, min_insync 2) over a lossy network, for the pure rules of
`ister.core.replication`.

The model: a metadata store holding the `ReplicaRecord` (compare-and-set) and each broker's lease and last
reported log (last epoch, end); three brokers, each with a durable log (records with their epoch), an
`EpochHistory` and, in memory, a `LeaderState` when it leads; a network that delays, drops and reorders
messages. Followers pull: a fetch carries the follower's epoch history and log end; the leader answers with
the offset to truncate to (`divergence`) and the records after it; the fetch that finds the follower's log a
prefix of the leader's is its acknowledgement (`acked`). The leader commits with `advance`, shrinks the ISR
with `lagging` (never below min_insync) and grows it with `rejoining`, each by compare-and-set; the
cluster's leader promotes with `promote` when a topic leader's lease lapsed. A broker's lease clock runs out
before the store expires its lease (margin), and a broker resuming from a pause past it steps down first.

Faults: crashes and restarts with the disk kept; crashes that lose the disk (at most one copy at a time:
only while all three replicas are alive and in sync; the broker removes itself from the ISR when it comes
back empty); pauses past the lease; messages dropped, delayed and reordered.

Checked: a record is acknowledged only once committed; no offset is ever acknowledged with two payloads;
every acknowledged record is in the log of every leader when it starts serving, with its payload; what
readers see (the committed offset of the serving leader) never goes back across leaders; at the end, with
the network healed and everyone back, the topic is served and holds every acknowledged record.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ister.core.replication import (
    NO_LEADER,
    EpochHistory,
    LeaderState,
    ReplicaRecord,
    after_restart,
    divergence,
    initial_record,
    promote,
)

SEEDS = 10_000
STEPS = 400
TTL = 6
MARGIN = 2
MAX_LAG = 4.0
RF = 3
MIN_INSYNC = 2


class SimFailure(AssertionError):
    pass


@dataclass
class Broker:
    bid: int
    alive: bool = True
    paused: bool = False
    renewed: int = 0
    # disk
    log: list[tuple[int, str]] = field(default_factory=list)  # offset -> (epoch, payload)
    history: EpochHistory = field(default_factory=EpochHistory)
    known_committed: int = 0
    # memory
    epoch: int = 0  # the newest epoch this broker knows of
    disk_lost: bool = False  # it crashed losing its disk (it finds out at start: its data directory is new)
    leading: LeaderState | None = None
    fetching: bool = False


@dataclass
class Msg:
    at: int
    src: int
    dst: int
    kind: str  # fetch | reply
    epoch: int
    history: list[tuple[int, int]] = field(default_factory=list)
    end: int = 0
    truncate_to: int = 0
    records: list[tuple[int, str]] = field(default_factory=list)  # from `end` (reply: from truncate_to)
    committed: int = 0
    fetch_end: int = 0  # reply: the follower's log end its fetch reported


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0
        self.brokers = [Broker(b) for b in range(RF)]
        self.record = initial_record(list(range(RF)), MIN_INSYNC)
        self.version = 1
        self.reports: dict[int, tuple[int, int]] = {b: (0, 0) for b in range(RF)}
        self.net: list[Msg] = []
        self.acked: dict[int, str] = {}
        self.pending: dict[int, str] = {}  # appended by a leader, not yet acknowledged
        self.seen_committed = 0  # what readers have seen (the serving leader's committed offset)
        self.counter = 0
        self.log: list[str] = []
        self.drop = self.rng.choice([0.0, 0.05, 0.2])
        self.delay = self.rng.choice([1, 2, 4])
        for b in self.brokers:
            b.epoch = 1
        self.start_leading(self.brokers[0])

    # -- helpers -----------------------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.seed} t={self.now}: {what}\n" + "\n".join(self.log[-30:]))

    def up(self, b: Broker) -> bool:
        return b.alive and not b.paused

    def clock_valid(self, b: Broker) -> bool:
        return self.now < b.renewed + TTL - MARGIN

    def lease_expired(self, b: Broker) -> bool:
        return not b.alive or self.now >= b.renewed + TTL

    def live(self) -> set[int]:
        return {b.bid for b in self.brokers if not self.lease_expired(b)}

    def cas(self, expected: int, record: ReplicaRecord) -> bool:
        if expected != self.version:
            return False
        if not record.valid():
            self.fail(f"invalid record {record}")
        if record.epoch < self.record.epoch:
            self.fail(f"epoch went back: {self.record} -> {record}")
        self.record, self.version = record, self.version + 1
        return True

    def send(self, msg: Msg) -> None:
        if self.rng.random() >= self.drop:
            msg.at = self.now + self.rng.randint(0, self.delay)
            self.net.append(msg)

    def end(self, b: Broker) -> int:
        return len(b.log)

    def leader(self) -> Broker | None:
        return self.brokers[self.record.leader] if self.record.leader != NO_LEADER else None

    # -- leadership ------------------------------------------------------------------------------------------
    def start_leading(self, b: Broker) -> None:
        followers = [r for r in self.record.replicas if r != b.bid]
        b.leading = LeaderState.take_over(b.epoch, self.end(b), b.known_committed, self.now, followers)
        self.log.append(f"{b.bid} leads epoch {b.epoch} from {self.end(b)} (committed {b.known_committed})")

    def step_down(self, b: Broker, why: str) -> None:
        if b.leading is not None:
            self.log.append(f"{b.bid} steps down: {why}")
        b.leading = None
        # Unacknowledged records of its epoch may be lost; they were never acknowledged.

    def produce(self) -> None:
        b = self.leader()
        st = b.leading if b is not None else None
        if b is None or not self.up(b) or st is None or not st.serving or not self.clock_valid(b):
            return
        if len(self.record.isr) < self.record.min_insync:
            return  # UNAVAILABLE: fewer in-sync replicas than the minimum
        for _ in range(self.rng.randint(1, 3)):
            self.counter += 1
            payload = f"m{self.counter}"
            offset = self.end(b)
            b.history.begin(b.epoch, offset)
            b.log.append((b.epoch, payload))
            self.pending[offset] = payload
        st.appended(self.end(b), self.now)

    def leader_step(self, b: Broker | None) -> None:
        st = b.leading if b is not None else None
        if b is None or st is None or not self.up(b):
            return
        if not self.clock_valid(b) or self.record.epoch != b.epoch or self.record.leader != b.bid:
            self.step_down(b, "fenced")
            return
        rec, version = self.record, self.version
        st.advance(rec.isr, b.bid, self.end(b))
        self.ack_committed(b)
        shrink = st.lagging(rec.isr, b.bid, self.now, MAX_LAG)
        if shrink:
            isr = [m for m in rec.isr if m not in shrink]
            if len(isr) >= rec.min_insync and self.cas(version, rec.with_isr(isr)):
                self.log.append(f"{b.bid} shrinks ISR to {isr}")
            return
        grow = st.rejoining(rec.isr, rec.replicas)
        if grow and self.cas(version, rec.with_isr([*rec.isr, *grow])):
            self.log.append(f"{b.bid} grows ISR to {self.record.isr}")

    def ack_committed(self, b: Broker) -> None:
        st = b.leading
        assert st is not None
        b.known_committed = max(b.known_committed, st.committed)
        if st.serving:
            if st.committed < self.seen_committed:
                self.fail(f"readers saw {self.seen_committed}, leader {b.bid} serves {st.committed}")
            self.seen_committed = st.committed
        for offset in [o for o in self.pending if o < st.committed]:
            payload = self.pending.pop(offset)
            if b.log[offset][1] != payload:
                continue  # overwritten before it was acknowledged: never acknowledged
            if self.acked.setdefault(offset, payload) != payload:
                self.fail(f"offset {offset} acknowledged as {self.acked[offset]} and {payload}")

    def controller(self) -> None:
        if self.record.leader != NO_LEADER and not self.lease_expired(self.brokers[self.record.leader]):
            return
        record = promote(self.record, self.live(), self.reports)
        if record is not None and self.cas(self.version, record):
            self.log.append(f"promote {record.leader} at epoch {record.epoch}, ISR {record.isr}")

    # -- replicas --------------------------------------------------------------------------------------------
    def watch(self, b: Broker) -> None:
        """A replica reads the record: learns a newer epoch, starts leading or following."""
        if not self.up(b):
            return
        if b.leading is not None and not self.clock_valid(b):
            self.step_down(b, "lease clock ran out")
        rec = self.record
        if rec.epoch > b.epoch:
            self.step_down(b, f"epoch {rec.epoch}")
            b.epoch = rec.epoch
            b.fetching = False
        if rec.leader == b.bid and b.leading is None and rec.epoch == b.epoch and self.clock_valid(b):
            self.start_leading(b)
        if rec.leader not in (b.bid, NO_LEADER) and not b.fetching and b.bid in rec.replicas:
            b.fetching = True
            self.send(Msg(0, b.bid, rec.leader, "fetch", b.epoch, list(b.history.entries), self.end(b)))
        self.reports[b.bid] = (b.history.last_epoch, self.end(b))

    def deliver(self) -> None:
        due = [m for m in self.net if m.at <= self.now]
        self.rng.shuffle(due)  # reordered
        for m in due[: self.rng.randint(0, len(due))]:
            self.net.remove(m)
            dst = self.brokers[m.dst]
            if not self.up(dst):
                if m.kind == "reply":
                    dst.fetching = False if dst.alive else dst.fetching
                continue
            if m.kind == "fetch":
                self.on_fetch(dst, m)
            else:
                self.on_reply(dst, m)

    def on_fetch(self, leader: Broker, m: Msg) -> None:
        st = leader.leading
        if st is None or m.epoch != leader.epoch or not self.clock_valid(leader):
            return  # the follower times out and fetches again
        theirs = EpochHistory(list(m.history))
        cut = divergence(leader.history, self.end(leader), theirs, m.end)
        if cut == m.end:
            st.acked(m.src, m.end, self.now)  # its log is a prefix of ours up to its end
        self.send(
            Msg(
                0,
                leader.bid,
                m.src,
                "reply",
                leader.epoch,
                truncate_to=cut,
                records=list(leader.log[cut : cut + 4]),
                committed=st.committed,
                fetch_end=m.end,
            )
        )

    def on_reply(self, f: Broker, m: Msg) -> None:
        f.fetching = False
        if m.epoch != f.epoch or f.leading is not None or m.fetch_end != self.end(f):
            return  # an answer to an older fetch (the log moved since): found by this simulation
        if m.truncate_to < self.end(f):
            del f.log[m.truncate_to :]
            f.history.truncate(m.truncate_to)
        if m.truncate_to != self.end(f):
            return  # a reply to a fetch from before a truncation: fetch again
        for epoch, payload in m.records:
            f.history.begin(epoch, self.end(f))
            f.log.append((epoch, payload))
        f.known_committed = max(f.known_committed, min(m.committed, self.end(f)))

    # -- faults ----------------------------------------------------------------------------------------------
    def crash(self, b: Broker, lose_disk: bool) -> None:
        self.log.append(f"crash {b.bid}{' losing its disk' if lose_disk else ''}")
        b.alive, b.leading, b.fetching = False, None, False
        if lose_disk:
            b.log, b.history, b.known_committed = [], EpochHistory(), 0
            b.epoch, b.disk_lost = 0, True

    def restart(self, b: Broker) -> None:
        self.log.append(f"restart {b.bid}")
        b.alive, b.paused, b.renewed = True, False, self.now
        disk_intact, b.disk_lost = not b.disk_lost, False
        record = after_restart(self.record, b.bid, disk_intact, self.live() | {b.bid}, self.reports)
        if record is not None and self.cas(self.version, record):
            self.log.append(f"{b.bid} back {'with' if disk_intact else 'without'} its disk: {record}")
        self.reports[b.bid] = (b.history.last_epoch, self.end(b))

    def pause(self, b: Broker) -> None:
        b.paused = True
        self.log.append(f"pause {b.bid}")

    def resume(self, b: Broker) -> None:
        b.paused = False
        self.log.append(f"resume {b.bid}")
        if b.leading is not None and not self.clock_valid(b):
            self.step_down(b, "paused past its lease")

    def tick(self) -> None:
        self.now += 1
        for b in self.brokers:
            if b.alive and not b.paused:
                b.renewed = self.now

    def step(self) -> None:
        r = self.rng.random()
        b = self.rng.choice(self.brokers)
        if r < 0.18:
            self.tick()
        elif r < 0.38:
            self.produce()
        elif r < 0.58:
            self.deliver()
        elif r < 0.73:
            self.watch(b)
        elif r < 0.85:
            self.leader_step(self.leader())
        elif r < 0.89:
            self.controller()
        elif r < 0.905 and b.alive:
            everyone_in_sync = len(self.record.isr) == RF and all(x.alive for x in self.brokers)
            self.crash(b, lose_disk=everyone_in_sync and self.rng.random() < 0.5)
        elif r < 0.94 and not b.alive:
            self.restart(b)
        elif r < 0.955 and b.alive:
            self.resume(b) if b.paused else self.pause(b)
        elif r < 0.975:
            for x in self.brokers:
                if x.paused and self.rng.random() < 0.5:
                    self.resume(x)
        else:
            for x in self.brokers:
                if x.fetching and self.rng.random() < 0.3:
                    x.fetching = False  # the fetch timed out: it will be sent again
        self.check()

    def check(self) -> None:
        leader = self.leader()
        st = leader.leading if leader is not None else None
        if (
            leader is not None
            and st is not None
            and st.serving
            and self.up(leader)
            and leader.epoch == self.record.epoch
        ):
            for offset, payload in self.acked.items():
                if offset >= len(leader.log) or leader.log[offset][1] != payload:
                    self.fail(f"serving leader {leader.bid} lacks acknowledged offset {offset} ({payload})")

    def settle(self) -> None:
        self.drop = 0.0
        for b in self.brokers:
            if not b.alive:
                self.restart(b)
            b.paused = False
        for _ in range(400):
            self.tick()
            self.controller()
            for b in self.brokers:
                self.watch(b)
            self.net_all()
            self.leader_step(self.leader())
            for b in self.brokers:
                b.fetching = False  # fetch again every round
            self.check()
            leader = self.leader()
            if leader is not None and leader.leading is not None and leader.leading.serving:
                return
        self.fail(f"the topic is not served after settling: {self.record}")

    def net_all(self) -> None:
        for _ in range(4):
            for m in list(self.net):
                m.at = self.now
            self.deliver_all()

    def deliver_all(self) -> None:
        due = list(self.net)
        self.net.clear()
        for m in due:
            dst = self.brokers[m.dst]
            if self.up(dst):
                self.on_fetch(dst, m) if m.kind == "fetch" else self.on_reply(dst, m)

    def check_final(self) -> None:
        leader = self.leader()
        assert leader is not None
        for offset, payload in self.acked.items():
            if offset >= len(leader.log) or leader.log[offset][1] != payload:
                self.fail(f"acknowledged offset {offset} ({payload}) is not in the final leader's log")


def run(seed: int, steps: int = STEPS) -> Sim:
    sim = Sim(seed)
    for _ in range(steps):
        sim.step()
    sim.settle()
    sim.check_final()
    return sim


CHUNKS = 10


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_replication_sim(chunk: int) -> None:
    per = SEEDS // CHUNKS
    for seed in range(chunk * per, (chunk + 1) * per):
        run(seed)


def test_the_schedules_exercise_the_interesting_cases() -> None:
    seen: dict[str, int] = {}
    acked = 0
    for seed in range(300):
        sim = run(seed)
        acked += len(sim.acked)
        for line in sim.log:
            for word in ("promote", "shrinks", "grows", "losing its disk", "without its disk", "steps down"):
                if word in line:
                    seen[word] = seen.get(word, 0) + 1
    for word in ("promote", "shrinks", "grows", "losing its disk", "without its disk", "steps down"):
        assert seen.get(word, 0) > 0, f"no schedule had {word!r}: {seen}"
    assert acked > 1000
