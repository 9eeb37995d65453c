"""Seeded simulation of the history checker (core/history.py).

Each seed builds a random history that keeps every promise: publishes acknowledged, refused, or stored
without an answer and retried (stored twice); subscriptions of every type that deliver (in offset order,
per key, or in any order for Shared), acknowledge, reconnect (redelivering from the cursor) and have
their persisted cursor observed; sometimes retention moves the start offset past a slow subscription.
The checker must call it clean. Then one mutation of a random kind (a lost record, a conflicting payload,
an undelivered message, first deliveries swapped, a cursor that goes back, a cursor past an unacknowledged
offset) must be caught by its own count. A failure names the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from ister.core.dispatch.types import SubType
from ister.core.history import (
    Acked,
    ConsumerAck,
    CursorObserved,
    Delivery,
    History,
    Publish,
    Subscription,
    check,
)

SEEDS = 1_500
TOPIC = "/default/sim"
KEYS = ["k0", "k1", "k2", None]


@dataclass
class SubState:
    sub: Subscription
    next_deliver: int = 0  # ordered types: the next offset to send
    delivered: set[int] = field(default_factory=set)
    in_flight: set[int] = field(default_factory=set)  # delivered since the last reconnect, not acked
    acked: set[int] = field(default_factory=set)

    def cursor(self, start: int) -> int:
        c = max(self.sub.first_offset, start)
        while c in self.acked:
            c += 1
        return c


class World:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.h = History()
        self.log: list[bytes] = []  # offset -> payload
        self.keys: list[str | None] = []
        self.now = 0.0
        self.n = 0
        self.subs = [SubState(Subscription(TOPIC, f"s{t.name.lower()}", t)) for t in SubType]
        self.h.subscriptions.extend(s.sub for s in self.subs)

    def tick(self) -> float:
        self.now += self.rng.random()
        return self.now

    def publish(self) -> None:
        payload = f"p{self.n}".encode()
        self.n += 1
        key = self.rng.choice(KEYS)
        self.h.publishes.append(Publish(TOPIC, payload, key, self.tick()))
        roll = self.rng.random()
        if roll < 0.1:
            return  # refused: stored nowhere
        self.log.append(payload)
        self.keys.append(key)
        if roll < 0.2:
            return  # stored, the answer lost and never retried
        if roll < 0.28:  # stored, unanswered, retried: stored again, the retry acknowledged
            self.log.append(payload)
            self.keys.append(key)
        self.h.acks.append(Acked(TOPIC, payload, len(self.log) - 1, self.tick()))

    def deliverable(self, s: SubState) -> list[int]:
        kind = s.sub.type
        end = len(self.log)
        if kind in (SubType.EXCLUSIVE, SubType.FAILOVER):
            return [s.next_deliver] if s.next_deliver < end else []
        waiting = [o for o in range(s.cursor(0), end) if o not in s.in_flight and o not in s.acked]
        if kind == SubType.SHARED:
            return waiting
        # Key-Shared: a key's lowest waiting offset, only when nothing lower of that key is in flight
        out: list[int] = []
        for key in set(self.keys[o] for o in waiting):
            lowest = min(o for o in waiting if self.keys[o] == key)
            if not any(self.keys[o] == key and o < lowest for o in s.in_flight):
                out.append(lowest)
        return out

    def deliver(self, s: SubState) -> None:
        choices = self.deliverable(s)
        if not choices:
            return
        offset = self.rng.choice(choices)
        if s.sub.type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            s.next_deliver += 1
            if offset in s.acked:
                return  # acked before the reconnect: the broker does not send it again
        s.delivered.add(offset)
        s.in_flight.add(offset)
        consumer = f"c{self.rng.randint(0, 1)}" if s.sub.type != SubType.EXCLUSIVE else "c0"
        self.h.deliveries.append(
            Delivery(TOPIC, s.sub.name, consumer, offset, self.log[offset], f"m{offset}", self.tick())
        )

    def ack(self, s: SubState) -> None:
        if not s.in_flight:
            return
        offset = min(s.in_flight) if self.rng.random() < 0.7 else self.rng.choice(sorted(s.in_flight))
        s.in_flight.discard(offset)
        s.acked.add(offset)
        self.h.consumer_acks.append(ConsumerAck(TOPIC, s.sub.name, "c0", offset, self.tick()))

    def reconnect(self, s: SubState) -> None:
        s.in_flight.clear()  # unacknowledged messages are sent again, from the cursor
        s.next_deliver = s.cursor(0)

    def observe(self, s: SubState) -> None:
        self.h.cursors.append(CursorObserved(TOPIC, s.sub.name, s.cursor(0), self.tick()))


def valid_history(seed: int) -> History:
    rng = random.Random(seed)
    w = World(rng)
    for _ in range(rng.randint(5, 60)):
        roll = rng.random()
        s = rng.choice(w.subs)
        if roll < 0.35:
            w.publish()
        elif roll < 0.65:
            w.deliver(s)
        elif roll < 0.85:
            w.ack(s)
        elif roll < 0.92:
            w.reconnect(s)
        else:
            w.observe(s)
    start = 0
    if rng.random() < 0.25:  # retention moves the start, maybe past what a subscription has not consumed
        start = rng.randint(0, len(w.log))
        w.h.start_offsets[TOPIC] = start
        for s in w.subs:  # readers below the start move to it
            s.acked |= set(range(start))
            s.in_flight -= s.acked
            s.next_deliver = max(s.next_deliver, start)
    for s in w.subs:  # healed: everything still stored reaches every subscription and is acknowledged
        for _ in range(10 * len(w.log) + 10):
            if not w.deliverable(s) and not s.in_flight:
                break
            w.deliver(s)
            w.ack(s)
        w.observe(s)
    w.h.reads[TOPIC] = {o: p for o, p in enumerate(w.log) if o >= start}
    return w.h


def mutate(h: History, rng: random.Random) -> str | None:
    """Break one promise in `h`; the kind of anomaly made, or None when this history has no room for it."""
    start = h.start_offsets.get(TOPIC, 0)
    acked = sorted({a.offset for a in h.acks if a.offset >= start})
    kind = rng.choice(["lost", "conflict", "undelivered", "order", "regression", "ahead"])
    if kind in ("lost", "conflict", "undelivered") and not acked:
        return None
    if kind == "lost":
        del h.reads[TOPIC][rng.choice(acked)]
    elif kind == "conflict":
        h.reads[TOPIC][rng.choice(acked)] = b"intruder"
    elif kind == "undelivered":
        offset = rng.choice(acked)
        live = [
            s.name
            for s in h.subscriptions
            if any(d.offset == offset and d.subscription == s.name for d in h.deliveries)
        ]
        if not live:
            return None
        name = rng.choice(live)
        h.deliveries = [d for d in h.deliveries if not (d.subscription == name and d.offset == offset)]
    elif kind == "order":
        firsts: list[int] = []
        seen: set[int] = set()
        for i, d in enumerate(h.deliveries):
            if d.subscription == "sexclusive" and d.offset not in seen:
                seen.add(d.offset)
                firsts.append(i)
        if len(firsts) < 2:
            return None
        i, j = sorted(rng.sample(firsts, 2))
        h.deliveries[i], h.deliveries[j] = h.deliveries[j], h.deliveries[i]
    elif kind == "regression":
        observed = [c for c in h.cursors if c.next_offset > 0]
        if not observed:
            return None
        last = {c.subscription: c for c in h.cursors}
        c = rng.choice([c for c in last.values() if c.next_offset > 0] or [observed[-1]])
        h.cursors.append(CursorObserved(TOPIC, c.subscription, c.next_offset - 1, c.time + 1))
    else:  # a cursor observed past an offset whose acks are taken away
        candidates = [
            (c.subscription, o)
            for c in h.cursors
            for o in range(start, c.next_offset)
            if o in h.reads.get(TOPIC, {})
        ]
        if not candidates:
            return None
        name, offset = rng.choice(candidates)
        h.consumer_acks = [a for a in h.consumer_acks if not (a.subscription == name and a.offset == offset)]
    return kind


def test_valid_histories_are_clean() -> None:
    for seed in range(SEEDS):
        h = valid_history(seed)
        result = check(h)
        assert result.ok, f"seed {seed}: {result.summary()}"
        assert result.acknowledged == len({a.payload for a in h.acks}), f"seed {seed}"


@pytest.mark.parametrize("offset", range(3))
def test_mutated_histories_are_caught(offset: int) -> None:
    caught: dict[str, int] = {}
    for seed in range(offset, SEEDS, 3):
        rng = random.Random(seed * 7919)
        h = valid_history(seed)
        kind = mutate(h, rng)
        if kind is None:
            continue
        result = check(h)
        count = {
            "lost": result.lost,
            "conflict": result.conflicts,
            "undelivered": sum(result.undelivered.values()),
            "order": result.order_violations,
            "regression": result.cursor_regressions,
            "ahead": result.cursor_ahead,
        }[kind]
        assert count > 0 and not result.ok, f"seed {seed}: {kind} not caught: {result.summary()}"
        caught[kind] = caught.get(kind, 0) + 1
    assert len(caught) == 6, caught  # every kind was made and caught at least once
