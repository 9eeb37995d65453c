"""Seeded schedules of one partitioned subscription (core/dispatch/partitions.py): consumers join, leave,
crash and acknowledge slowly while a producer sends numbered key sequences; rebalances wait for the delay,
moving partitions go through the four-step handoff.

Checked after every step: a partition has at most one active flow and is delivered only to it; partitions
that do not move are never paused; a first delivery of a key's message is never behind an earlier one of
the same key; what a switch redelivers was delivered to a consumer that is gone or whose handoff time ran out
(or nothing was outstanding); every rebalance is balanced (within one) and moves no more partitions than the
fewest possible. At the end everything published is acknowledged (nothing lost).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ister.core.dispatch.partitions import Handoff, RebalanceTimer, assign, plan_handoffs, quotas

SEEDS = 2_000
STEPS = 300
PARTITIONS = 6
MAX_UNACKED = 3


class SimFailure(AssertionError):
    pass


@dataclass
class Partition:
    queue: list[tuple[int, str]] = field(default_factory=list)  # (offset, key) not yet delivered
    inflight: dict[int, tuple[str, str]] = field(default_factory=dict)  # offset -> (consumer, key)
    next_offset: int = 0
    active: str | None = None  # the flow delivering this partition (None: paused or unassigned)


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0.0
        self.delay = self.rng.choice([0.0, 1.0, 3.0])
        self.max_handoff = self.rng.choice([0.0, 2.0, 5.0])
        self.parts = [Partition() for _ in range(PARTITIONS)]
        self.consumers: dict[str, float] = {}  # name -> how often it acks (0..1)
        self.assignment: dict[int, str] = {}
        self.handoffs: dict[int, Handoff] = {}
        self.timer = RebalanceTimer(self.delay)
        self.published: set[int] = set()  # global message ids
        self.acked: set[int] = set()
        self.first_delivered: dict[str, int] = {}  # key -> last offset delivered for the first time
        self.delivered_once: set[tuple[int, int]] = set()
        self.counter = 0
        self.joined = 0
        self.log: list[str] = []
        self.rebalances = 0
        self.redelivered = 0
        # partition -> consumers whose handoff timed out while they held messages: they may still hold some
        # of a key while its next message goes to the new consumer (the split the handoff time allows).
        self.timed_out: dict[int, set[str]] = {}

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.seed} t={self.now:.1f}: {what}\n" + "\n".join(self.log[-20:]))

    # -- membership -------------------------------------------------------------------------------------
    def join(self) -> None:
        self.joined += 1
        name = f"c{self.joined}"
        self.consumers[name] = self.rng.choice([0.9, 0.5, 0.1])
        self.timer.changed(self.now)
        self.log.append(f"join {name}")

    def leave(self, crashed: bool) -> None:
        if not self.consumers:
            return
        name = self.rng.choice(sorted(self.consumers))
        del self.consumers[name]
        self.log.append(f"{'crash' if crashed else 'leave'} {name}")
        # Its deliveries go back to the queue at once (a consumer that is gone acknowledges nothing).
        for i, part in enumerate(self.parts):
            self.requeue(i, name)
            if part.active == name:
                part.active = None
        self.timer.changed(self.now)

    def requeue(self, p: int, consumer: str) -> None:
        part = self.parts[p]
        back = sorted((o, k) for o, (c, k) in part.inflight.items() if c == consumer)
        for o, _ in back:
            del part.inflight[o]
        part.queue = sorted([*back, *part.queue])
        self.redelivered += len(back)

    # -- rebalancing ---------------------------------------------------------------------------------------
    def rebalance(self) -> None:
        old = {p: c for p, c in self.assignment.items() if c in self.consumers}
        new = assign(list(range(PARTITIONS)), sorted(self.consumers), old)
        self.check_balanced(old, new)
        planned, resume = plan_handoffs(self.assignment, new, self.now, self.max_handoff, self.handoffs)
        self.handoffs = dict(planned)
        for p in planned:
            self.parts[p].active = None  # step 1: pause deliveries to the old flow
        for p in resume:
            self.parts[p].active = new[p]  # moved back to where it was before it switched
        for p in range(PARTITIONS):
            if p not in planned and self.parts[p].active is None and p in new and p not in self.handoffs:
                self.fail(f"partition {p} did not move but is paused")
        self.assignment = new
        self.rebalances += 1
        if planned:
            self.log.append(f"rebalance: {[(h.partition, h.source, h.target) for h in planned.values()]}")

    def check_balanced(self, old: dict[int, str], new: dict[int, str]) -> None:
        if not self.consumers:
            return
        counts = [sum(1 for c in new.values() if c == x) for x in self.consumers]
        if max(counts) - min(counts) > 1 or len(new) != PARTITIONS:
            self.fail(f"unbalanced: {new}")
        quota = quotas(PARTITIONS, sorted(self.consumers), old)
        held = {x: sum(1 for c in old.values() if c == x) for x in self.consumers}
        fewest = (PARTITIONS - len(old)) + sum(max(0, held[x] - quota[x]) for x in self.consumers)
        moved = sum(1 for p, c in new.items() if old.get(p) != c)
        if moved > fewest:
            self.fail(f"moved {moved} partitions, {fewest} would do: {old} -> {new}")

    def progress_handoffs(self) -> None:
        for p, h in list(self.handoffs.items()):
            part = self.parts[p]
            src = h.source
            unacked = sum(1 for c, _ in part.inflight.values() if c == src)
            alive = src in self.consumers
            if h.target not in self.consumers:
                continue  # its target left: the next rebalance (already due) plans it again
            if not h.ready(self.now, unacked, alive):
                continue
            if unacked and alive and self.now - h.paused_at < self.max_handoff:
                self.fail(f"partition {p} switched with {unacked} unacknowledged before the handoff time")
            if src is not None:
                if unacked and alive:
                    self.timed_out.setdefault(p, set()).add(src)
                self.requeue(p, src)  # step 3-4: what was delivered and not acknowledged goes again
            h.switch(self.now)
            part.active = h.target
            del self.handoffs[p]
            self.log.append(f"switch {p}: {src} -> {h.target} after {h.paused_for:.1f}s")

    # -- messages ------------------------------------------------------------------------------------------
    def publish(self) -> None:
        p = self.rng.randrange(PARTITIONS)
        part = self.parts[p]
        key = f"k{p}.{self.rng.randrange(3)}"
        part.queue.append((part.next_offset, key))
        self.published.add(p * 1_000_000 + part.next_offset)
        part.next_offset += 1

    def deliver(self) -> None:
        for p, part in enumerate(self.parts):
            c = part.active
            if c is None or not part.queue:
                continue
            if c not in self.consumers or self.assignment.get(p) != c:
                self.fail(f"partition {p} active for {c}, assigned to {self.assignment.get(p)}")
            mine = sum(1 for x, _ in part.inflight.values() if x == c)
            if mine >= MAX_UNACKED:
                continue
            offset, key = part.queue.pop(0)
            holders = {x for x, k in part.inflight.values() if k == key} - {c}
            if holders - self.timed_out.get(p, set()):
                self.fail(f"key {key} goes to {c} while {holders} still hold its messages")
            if (p, offset) not in self.delivered_once:
                self.delivered_once.add((p, offset))
                if self.first_delivered.get(key, -1) > offset:
                    self.fail(f"key {key}: offset {offset} delivered first after {self.first_delivered[key]}")
                self.first_delivered[key] = offset
            part.inflight[offset] = (c, key)

    def ack(self) -> None:
        for p, part in enumerate(self.parts):
            for offset, (c, _) in sorted(part.inflight.items()):
                rate = self.consumers.get(c)
                if rate is not None and self.rng.random() < rate:
                    del part.inflight[offset]
                    self.acked.add(p * 1_000_000 + offset)
                    break

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.25:
            self.now += self.rng.choice([0.2, 0.5, 1.0])
            if self.timer.fire(self.now):
                self.rebalance()
        elif r < 0.5:
            self.publish()
        elif r < 0.7:
            self.deliver()
        elif r < 0.88:
            self.ack()
        elif r < 0.94:
            self.join()
        elif r < 0.97:
            self.leave(crashed=False)
        else:
            self.leave(crashed=True)
        self.progress_handoffs()

    def settle(self) -> None:
        if not self.consumers:
            self.join()
        for _ in range(2_000):
            self.now += 0.5
            if self.timer.fire(self.now):
                self.rebalance()
            self.progress_handoffs()
            self.deliver()
            for _ in range(PARTITIONS):
                for part_i, part in enumerate(self.parts):
                    for offset, (c, _) in list(part.inflight.items()):
                        if c in self.consumers:
                            del part.inflight[offset]
                            self.acked.add(part_i * 1_000_000 + offset)
            if self.acked == self.published:
                return
        self.fail(f"{len(self.published - self.acked)} messages never acknowledged")


def run(seed: int) -> Sim:
    sim = Sim(seed)
    for _ in range(STEPS):
        sim.step()
    sim.settle()
    return sim


@pytest.mark.parametrize("chunk", range(4))
def test_partition_handoff_sim(chunk: int) -> None:
    for seed in range(chunk * SEEDS // 4, (chunk + 1) * SEEDS // 4):
        run(seed)


def test_the_schedules_exercise_the_interesting_cases() -> None:
    switches = timeouts = redelivered = 0
    for seed in range(200):
        sim = run(seed)
        switches += sum(1 for line in sim.log if line.startswith("switch"))
        timeouts += sum(1 for line in sim.log if line.startswith("switch") and "None" not in line)
        redelivered += sim.redelivered
    assert switches > 100 and timeouts > 50 and redelivered > 100
