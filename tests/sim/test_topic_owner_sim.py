"""Seeded schedules of many topics through the real per-topic owner (`ister.broker.topic_owner.TopicOwner`),
with in-memory fakes of the ports it calls: a cluster `Placement` over a fake metadata store (owner records
with compare-and-set, assignments, sealed states), each broker's disk (WALs, epoch files, superseded
archives) under storage's real `open_topic_log`, a durable tier that can fail, and the topic itself.

Per step, one of: load an assigned topic (the storage open fails, the claim loses a race to a reassignment,
or reading its metadata fails), append, export in the background, move (seal, then the leader assigns it
elsewhere; the tier fails before the release or after it), fail over (the owner's lease is lost: it is fenced
and unloaded, then reassigned), crash a broker (its memory is lost, its topics fail over) or restart one.

Checked after every step: at most one SERVING owner per topic, on the broker it is assigned to; no offset
ever holds two payloads (never reused across owners); one owner's offsets are dense, and after a move the
next owner continues exactly after the seal; a failed seal leaves the topic serving where it was (appends
still land there); after a move every record its owner acknowledged is in the tier. At the end every broker
comes back, every topic loads, superseded WALs are given back, and every acknowledged record is readable.

`StandaloneSim` runs the same owner with standalone's real placement (over an in-memory metadata store):
admin unloads (the tier failing at the last segment is only logged there), shutdowns and reloads, each
continuing densely after the seal; at the end every acknowledged record is in the WAL.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from ister.broker.standalone import StandalonePlacement
from ister.broker.topic_owner import TopicOwner
from ister.config import load_config
from ister.core.cluster.ownership import OwnerRecord, assign
from ister.core.lifecycle import EFFECTS, LOAD_EFFECTS, Effect, State, TopicLifecycle
from ister.errors import Fenced, Unavailable
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.metadata.records import SealedState
from ister.ports.placement import LogPlan
from ister.storage.topic_log import LogStart, OpenedLog

SEEDS_PER_CHUNK = 500
CHUNKS = 4
STEPS = 120
BROKERS = 3
TOPICS = 4
RESERVATION = 8


class SimFailure(AssertionError):
    pass


# -- a broker's disk and the log handles the owner gets ----------------------------------------------------
@dataclass
class DiskWal:
    first: int
    next: int
    records: dict[int, str] = field(default_factory=dict)


class FakeWal:
    def __init__(self, sim: Sim, topic: str, disk: DiskWal) -> None:
        self.sim, self.topic, self.disk = sim, topic, disk
        self.closed = False

    @property
    def first_offset(self) -> int:
        return self.disk.first

    @property
    def next_offset(self) -> int:
        return self.disk.next

    @property
    def committed_offset(self) -> int:
        return self.disk.next

    def append(self, payload: str) -> int:
        if self.closed:
            raise Unavailable("closed")
        offset = self.disk.next
        self.disk.records[offset] = payload
        self.disk.next += 1
        self.sim.landed(self.topic, offset, payload)
        return offset

    async def close(self) -> None:
        self.closed = True


class FakeStorage:
    """What `open_topic_log` and the owner use of storage/topic_storage.py, on one broker's disk."""

    def __init__(self, sim: Sim, bid: int) -> None:
        self.sim, self.bid = sim, bid
        self.disks: dict[str, DiskWal] = {}
        self.epochs: dict[str, int] = {}
        self.archives: list[tuple[str, DiskWal]] = []
        self.open_handles: dict[str, FakeWal] = {}

    def read_epoch(self, name: TopicName) -> int | None:
        return self.epochs.get(name.full)

    def write_epoch(self, name: TopicName, epoch: int) -> None:
        self.epochs[name.full] = epoch

    async def open_wal(self, name: TopicName, start_offset: int = 0) -> FakeWal:
        if self.sim.take_fault("open"):
            raise OSError("the data disk refused to open the WAL")
        held = self.open_handles.get(name.full)
        if held is not None and not held.closed:
            self.sim.fail(f"broker {self.bid} opened {name.full}'s WAL twice")
        disk = self.disks.get(name.full)
        if disk is None:
            disk = self.disks[name.full] = DiskWal(start_offset, start_offset)
        elif start_offset > disk.next:
            disk.next = start_offset  # the offsets in between are a recorded gap
        wal = self.open_handles[name.full] = FakeWal(self.sim, name.full, disk)
        return wal

    async def archive_superseded(self, name: TopicName, epoch: int | None) -> bool:
        disk = self.disks.pop(name.full, None)
        self.epochs.pop(name.full, None)
        if disk is None or not disk.records:
            return False
        self.archives.append((name.full, disk))
        return True

    async def export_tail_now(self, wal: FakeWal, exporter: FakeExporter) -> None:
        await exporter.export_closed()


class FakeExporter:
    def __init__(self, sim: Sim, wal: FakeWal) -> None:
        self.sim, self.wal = sim, wal

    async def export_closed(self) -> None:
        if self.sim.take_fault("tier"):
            raise OSError("the object store is down")
        self.sim.tier[self.wal.topic].update(self.wal.disk.records)

    async def export_tail(self) -> None:
        if self.sim.take_fault("finish"):
            raise OSError("the object store went down at the last segment")
        self.sim.tier[self.wal.topic].update(self.wal.disk.records)


# -- the claim and the placement (cluster mode's ports) -----------------------------------------------------
class FakeClaim:
    def __init__(self, sim: Sim, topic: str, epoch: int, wal: FakeWal) -> None:
        self.sim, self.topic, self._epoch, self.wal = sim, topic, epoch, wal
        self.revoked: str | None = None

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def replication(self) -> None:
        return None

    def _owned(self) -> OwnerRecord:
        record = self.sim.records[self.topic]
        if self.revoked is not None or record.epoch != self._epoch:
            raise Fenced(f"{self.topic}: no longer owned at epoch {self._epoch}")
        return record

    def check(self, count: int = 1) -> None:
        record = self._owned()
        end = self.wal.next_offset + count
        if end > record.reserved_until:  # extend the reservation with compare-and-set
            self.sim.put_record(self.topic, msgspec.structs.replace(record, reserved_until=end + RESERVATION))

    def appended(self) -> None:
        return None

    def revoke(self, reason: str) -> None:
        if self.revoked is None:
            self.revoked = reason

    async def guarded_put(self, key: str, value: Any) -> None:
        self._owned()
        self.sim.sealed[self.topic] = SealedState.parse(value)


@dataclass(frozen=True)
class Read:
    record: OwnerRecord
    versions: tuple[int, int]
    sealed: SealedState | None


class FakePlacement:
    def __init__(self, sim: Sim, bid: int, storage: FakeStorage) -> None:
        self.sim, self.bid, self.storage = sim, bid, storage

    @property
    def broker_id(self) -> int:
        return self.bid

    @property
    def moves_need_export(self) -> bool:
        return True

    async def plan_log(self, name: TopicName) -> LogPlan:
        sim, t = self.sim, name.full
        record, sealed = sim.records[t], sim.sealed.get(t)
        read = Read(record, (sim.record_version[t], sim.assigned_version[t]), sealed)
        return LogPlan(LogStart.cluster(record, sealed, RESERVATION), read)

    async def claim_log(
        self, name: TopicName, plan: LogPlan, opened: OpenedLog | None
    ) -> tuple[Any, FakeClaim]:
        sim, t = self.sim, name.full
        read = plan.context
        assert isinstance(read, Read) and opened is not None and opened.plan is not None
        if sim.take_fault("race"):
            sim.reassign(t, exclude=self.bid, why="the claim lost a race")
        self.storage.write_epoch(name, read.record.epoch)
        now = (sim.record_version[t], sim.assigned_version[t])
        if now != read.versions or sim.assigned[t] != self.bid:
            if opened.plan.keep_local and opened.local_epoch is not None:
                self.storage.write_epoch(name, opened.local_epoch)
            raise Unavailable(f"{t}: the owner record changed while loading; redo the lookup")
        sim.put_record(t, opened.plan.record)
        if read.sealed is not None:
            sim.sealed.pop(t, None)  # consumed
        return opened.wal, FakeClaim(sim, t, read.record.epoch, opened.wal)

    async def claim_volatile(self, name: TopicName) -> FakeClaim:
        raise AssertionError("every simulated topic is reliable")


# -- the topic and the registry (the owner's host) ---------------------------------------------------------
class FakeTopic:
    def __init__(self, name: TopicName, wal: FakeWal, claim: FakeClaim, lifecycle: TopicLifecycle, sim: Sim):
        self.name, self.wal, self.claim, self.lifecycle = name, wal, claim, lifecycle
        self.exporter = FakeExporter(sim, wal)
        self.released = 0

    def publish(self, payload: str) -> int:
        if not self.lifecycle.accepts_appends:
            raise Unavailable(f"{self.name} is {self.lifecycle.state}")
        self.claim.check(1)
        return self.wal.append(payload)

    async def release(self) -> None:
        self.released += 1
        await self.wal.close()


class Host:
    def __init__(self) -> None:
        self.topics: dict[str, FakeTopic] = {}
        self.owners: dict[str, TopicOwner[FakeTopic]] = {}

    def register(self, topic: FakeTopic) -> None:
        self.topics[topic.name.full] = topic

    def drop(self, name: str) -> None:
        self.topics.pop(name, None)
        self.owners.pop(name, None)

    def forget_clients(self, topic: FakeTopic) -> None:
        return None


@dataclass
class Broker:
    bid: int
    storage: FakeStorage
    placement: FakePlacement
    host: Host = field(default_factory=Host)
    alive: bool = True


# -- the schedule ------------------------------------------------------------------------------------------
class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.step = 0
        self.names = [TopicName("default", f"t{i}") for i in range(TOPICS)]
        self.brokers: list[Broker] = []
        for b in range(BROKERS):
            storage = FakeStorage(self, b)
            self.brokers.append(Broker(b, storage, FakePlacement(self, b, storage)))
        self.records: dict[str, OwnerRecord] = {}
        self.record_version: dict[str, int] = {}
        self.assigned: dict[str, int] = {}
        self.assigned_version: dict[str, int] = {}
        self.sealed: dict[str, SealedState | None] = {}
        self.tier: dict[str, dict[int, str]] = {n.full: {} for n in self.names}
        self.acked: dict[str, dict[int, str]] = {n.full: {} for n in self.names}
        self.ever: dict[str, dict[int, str]] = {n.full: {} for n in self.names}
        self.resume_at: dict[str, int] = {}  # after a move: where the next owner must continue
        self.faults: set[str] = set()
        self.counter = 0
        self.seen: set[str] = set()  # what the schedule exercised
        self.log: list[str] = []
        for n in self.names:
            b = self.rng.randrange(BROKERS)
            self.records[n.full] = OwnerRecord(broker_id=b, epoch=1)
            self.record_version[n.full] = 1
            self.assigned[n.full] = b
            self.assigned_version[n.full] = 1

    # -- helpers -------------------------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.seed} step {self.step}: {what}\n" + "\n".join(self.log[-20:]))

    def take_fault(self, fault: str) -> bool:
        if fault in self.faults:
            self.faults.discard(fault)
            self.seen.add(fault)
            return True
        return False

    def put_record(self, topic: str, record: OwnerRecord) -> None:
        old = self.records[topic]
        if record.epoch < old.epoch or record.reserved_until < old.reserved_until:
            self.fail(f"{topic}: owner record went back: {old} -> {record}")
        self.records[topic] = record
        self.record_version[topic] += 1

    def reassign(self, topic: str, exclude: int, why: str) -> None:
        alive = [b.bid for b in self.brokers if b.alive and b.bid != exclude]
        target = self.rng.choice(alive) if alive else exclude
        self.put_record(topic, assign(self.records[topic], target))
        self.assigned[topic] = target
        self.assigned_version[topic] += 1
        self.log.append(f"{topic} -> broker {target} ({why})")

    def landed(self, topic: str, offset: int, payload: str) -> None:
        before = self.ever[topic].get(offset)
        if before is not None and before != payload:
            self.fail(f"{topic}: offset {offset} reused ({before} then {payload})")
        self.ever[topic][offset] = payload

    def owner_at(self, topic: str) -> tuple[Broker, TopicOwner[FakeTopic]] | None:
        b = self.brokers[self.assigned[topic]]
        owner = b.host.owners.get(topic)
        return (b, owner) if b.alive and owner is not None else None

    # -- steps ---------------------------------------------------------------------------------------------
    async def load(self, name: TopicName, faults: bool = True) -> None:
        t = name.full
        b = self.brokers[self.assigned[t]]
        if not b.alive or t in b.host.owners:
            return
        fault = self.rng.choice(["open", "race", "prepare", None, None, None, None]) if faults else None
        if fault in ("open", "race"):
            self.faults.add(fault)
        owner: TopicOwner[FakeTopic] = TopicOwner(name, b.placement, b.storage, b.host)

        def make(wal: Any, claim: Any, lifecycle: TopicLifecycle) -> FakeTopic:
            return FakeTopic(name, wal, claim, lifecycle, self)

        async def prepare(topic: FakeTopic) -> None:
            if fault == "prepare":
                self.seen.add("prepare")
                raise OSError("the metadata store failed while reading producers")

        try:
            topic = await owner.load(True, make, prepare)
        except (OSError, Unavailable) as exc:
            self.faults.clear()
            self.log.append(f"{t}: load on {b.bid} failed ({exc})")
            if owner.state is not State.CLOSED or t in b.host.topics:
                self.fail(f"{t}: a failed load left {owner.state}, registered={t in b.host.topics}")
            if owner.topic is not None:
                if owner.topic.claim.revoked is None:
                    self.fail(f"{t}: a load that failed after claiming kept its claim")
                # Its claim consumed the seal and named its own load in the owner record: a next owner on
                # another broker continues after the reservation (a gap, no reuse), not densely.
                self.resume_at.pop(t, None)
            handle = b.storage.open_handles.get(t)
            if handle is not None and not handle.closed:
                self.fail(f"{t}: a failed load left its WAL open")
            return
        b.host.owners[t] = owner
        start = topic.wal.next_offset
        self.log.append(f"{t}: loaded on {b.bid} at epoch {topic.claim.epoch}, offsets from {start}")
        if any(o >= start for o in self.ever[t]):
            self.fail(f"{t}: the new owner starts at {start}, below offsets already written")
        expected = self.resume_at.pop(t, None)
        if expected is not None and start != expected:
            self.fail(f"{t}: after a move the next owner starts at {start}, not densely at {expected}")

    def append(self, name: TopicName) -> None:
        t = name.full
        found = self.owner_at(t)
        if found is None or found[1].state is not State.SERVING:
            return
        topic = found[1].topic
        assert topic is not None
        self.counter += 1
        payload = f"m{self.counter}"
        before = topic.wal.next_offset
        try:
            offset = topic.publish(payload)
        except (Fenced, Unavailable) as exc:
            self.fail(f"{t}: the serving owner refused an append: {exc}")
            return
        if offset != before:
            self.fail(f"{t}: offset {offset} is not dense after {before - 1}")
        self.acked[t][offset] = payload

    async def export(self, name: TopicName) -> None:
        found = self.owner_at(name.full)
        if found is not None and found[1].topic is not None and found[1].state is State.SERVING:
            await found[1].topic.exporter.export_closed()

    async def move(self, name: TopicName) -> None:
        t = name.full
        found = self.owner_at(t)
        if found is None or found[1].state is not State.SERVING:
            return
        b, owner = found
        topic = owner.topic
        assert topic is not None
        fault = self.rng.choice(["tier", "finish", None, None])
        if fault is not None:
            self.faults.add(fault)
        try:
            await owner.seal("move")
        except (OSError, Unavailable) as exc:
            self.faults.clear()
            if fault == "tier":  # the export before the release failed: still served here
                self.seen.add("seal_failed")
                if owner.state is not State.SERVING or b.host.topics.get(t) is not topic or topic.released:
                    self.fail(f"{t}: a failed seal left {owner.state} (released {topic.released})")
                self.append(name)  # appends still land here
            else:  # after the release: forgotten here, it reloads where it was
                if owner.state is not State.CLOSED or t in b.host.topics:
                    self.fail(f"{t}: a seal that failed after the release left {owner.state}")
            self.log.append(f"{t}: move from {b.bid} failed ({exc})")
            return
        if owner.state is not State.CLOSED or t in b.host.topics or topic.claim.revoked is None:
            self.fail(f"{t}: a finished seal left {owner.state}")
        mine = [o for o in self.acked[t] if o >= topic.wal.first_offset]
        missing = [o for o in mine if self.tier[t].get(o) != self.acked[t][o]]
        if missing:
            self.fail(f"{t}: acknowledged offsets {missing} are not readable after the move")
        sealed = self.sealed.get(t)
        if topic.wal.committed_offset > 0:
            if sealed is None or sealed.next_offset != topic.wal.committed_offset:
                self.fail(f"{t}: the sealed state {sealed} does not end at {topic.wal.committed_offset}")
            self.resume_at[t] = topic.wal.committed_offset
        self.seen.add("moved")
        self.reassign(t, exclude=b.bid, why="move")

    async def failover(self, name: TopicName) -> None:
        t = name.full
        found = self.owner_at(t)
        if found is None:
            return
        b, owner = found
        # The lease ran out: the broker fences the topic before the leader gives it to another.
        await owner.fence("lease lost")
        await owner.close()
        if owner.state is not State.CLOSED or t in b.host.topics or t in b.host.owners:
            self.fail(f"{t}: a fenced owner left {owner.state}")
        self.seen.add("failover")
        self.resume_at.pop(t, None)
        self.reassign(t, exclude=b.bid, why="lease lost")

    def crash(self, b: Broker) -> None:
        if not b.alive or sum(x.alive for x in self.brokers) == 1:
            return
        b.alive = False
        b.host = Host()  # memory lost; the disk stays
        for handle in b.storage.open_handles.values():
            handle.closed = True  # the process is gone
        self.log.append(f"crash {b.bid}")
        self.seen.add("crash")
        for t, owner_bid in list(self.assigned.items()):
            if owner_bid == b.bid:
                self.resume_at.pop(t, None)
                self.reassign(t, exclude=b.bid, why="owner crashed")

    def restart(self, b: Broker) -> None:
        if not b.alive:
            b.alive = True
            self.log.append(f"restart {b.bid}")

    # -- invariants ----------------------------------------------------------------------------------------
    def check(self) -> None:
        for n in self.names:
            t = n.full
            serving = [
                b.bid
                for b in self.brokers
                if b.alive and (o := b.host.owners.get(t)) is not None and o.state is State.SERVING
            ]
            if len(serving) > 1:
                self.fail(f"{t}: served by brokers {serving} at once")
            if serving and serving[0] != self.assigned[t]:
                self.fail(f"{t}: served by broker {serving[0]}, assigned to {self.assigned[t]}")
            for offset, payload in self.acked[t].items():
                if self.ever[t].get(offset) != payload:
                    self.fail(f"{t}: acknowledged offset {offset} was overwritten")

    async def run(self) -> None:
        for self.step in range(STEPS):
            name = self.rng.choice(self.names)
            roll = self.rng.random()
            if roll < 0.25:
                await self.load(name)
            elif roll < 0.6:
                self.append(name)
            elif roll < 0.68:
                await self.export(name)
            elif roll < 0.8:
                await self.move(name)
            elif roll < 0.88:
                await self.failover(name)
            elif roll < 0.94:
                self.crash(self.rng.choice(self.brokers))
            else:
                self.restart(self.rng.choice(self.brokers))
            self.faults.clear()
            self.check()
        await self.settle()

    async def settle(self) -> None:
        """Every broker back, every topic loaded, superseded WALs given back: every acknowledged record is
        readable (in the tier or in its owner's WAL)."""
        self.faults.clear()
        for b in self.brokers:
            self.restart(b)
        for n in self.names:
            await self.load(n, faults=False)
        for b in self.brokers:  # the sweep: archived and overtaken WALs go to the tier
            for t, disk in b.storage.archives:
                self.tier[t].update(disk.records)
            for t, disk in b.storage.disks.items():
                if t not in b.host.owners:
                    self.tier[t].update(disk.records)
        for n in self.names:
            t = n.full
            found = self.owner_at(t)
            if found is None or found[1].topic is None:
                self.fail(f"{t}: not served after settling")
                return
            readable = {**self.tier[t], **found[1].topic.wal.disk.records}
            lost = [o for o, p in self.acked[t].items() if readable.get(o) != p]
            if lost:
                self.fail(f"{t}: acknowledged offsets {lost[:10]} are not readable")


class StandaloneSim(Sim):
    """The same owner with standalone's real ports (`StandalonePlacement` over an in-memory store): one
    broker, an admin unload seals the topic and it reloads here, continuing densely after the seal."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.store = EmbeddedStore.in_memory()
        b = self.brokers[0]
        b.placement = StandalonePlacement(load_config(environ={}), self.store)  # type: ignore[assignment]
        self.brokers = [b]
        for n in self.names:
            self.assigned[n.full] = 0

    async def unload(self, name: TopicName) -> None:
        t = name.full
        found = self.owner_at(t)
        if found is None or found[1].state is not State.SERVING:
            return
        owner = found[1]
        topic = owner.topic
        assert topic is not None
        if self.rng.random() < 0.3:
            self.faults.add("finish")  # standalone reloads the same WAL: the export only has to happen later
        await owner.seal("admin unload")
        if owner.state is not State.CLOSED or t in self.brokers[0].host.owners or topic.claim.revoked is None:
            self.fail(f"{t}: a finished seal left {owner.state}")
        kv = await self.store.get(keys.storage_state(t))
        if topic.wal.committed_offset > 0:
            sealed = SealedState.parse(kv.value) if kv is not None else None
            if sealed is None or sealed.next_offset != topic.wal.committed_offset:
                self.fail(f"{t}: the sealed state {sealed} does not end at {topic.wal.committed_offset}")
            self.resume_at[t] = topic.wal.committed_offset
        self.seen.add("unloaded")

    async def shutdown(self) -> None:
        host = self.brokers[0].host
        for owner in list(host.owners.values()):
            await owner.close()
            if owner.topic is not None and not owner.topic.wal.closed:
                self.fail(f"{owner.name}: closed with its WAL open")
        self.brokers[0].host = Host()
        self.seen.add("shutdown")

    async def run(self) -> None:
        try:
            for self.step in range(STEPS):
                name = self.rng.choice(self.names)
                roll = self.rng.random()
                if roll < 0.3:
                    await self.load(name)
                elif roll < 0.75:
                    self.append(name)
                elif roll < 0.92:
                    await self.unload(name)
                else:
                    await self.shutdown()
                self.faults.clear()
                self.check()
            for n in self.names:
                await self.load(n, faults=False)
            for n in self.names:
                found = self.owner_at(n.full)
                assert found is not None and found[1].topic is not None
                readable = found[1].topic.wal.disk.records
                lost = [o for o, p in self.acked[n.full].items() if readable.get(o) != p]
                if lost:
                    self.fail(f"{n.full}: acknowledged offsets {lost[:10]} are not in the WAL")
        finally:
            await self.store.close()


def run(seed: int) -> Sim:
    sim = Sim(seed)
    asyncio.run(sim.run())
    return sim


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_topic_owner_sim(chunk: int) -> None:
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        run(seed)


@pytest.mark.parametrize("chunk", range(2))
def test_topic_owner_sim_standalone(chunk: int) -> None:
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        sim = StandaloneSim(seed)
        asyncio.run(sim.run())


def test_the_schedules_exercise_every_failure() -> None:
    seen: set[str] = set()
    for seed in range(60):
        seen |= run(seed).seen
    assert seen >= {"open", "race", "prepare", "tier", "finish", "seal_failed", "moved", "failover", "crash"}
    seen = set()
    for seed in range(30):
        sim = StandaloneSim(seed)
        asyncio.run(sim.run())
        seen |= sim.seen
    assert seen >= {"open", "prepare", "finish", "unloaded", "shutdown"}


def test_the_owner_carries_out_every_effect_the_table_names() -> None:
    named = {e for effects in EFFECTS.values() for e in effects} | set(LOAD_EFFECTS)
    assert named == set(Effect) == set(TopicOwner._handlers)
