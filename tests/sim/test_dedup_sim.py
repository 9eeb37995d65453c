"""Seeded random schedules of idempotent producers against `ister.core.dedup.DedupTable`.

A model of the broker (a log of records, the table, restarts that rebuild the table from the log's tags,
appends that fail with nothing stored) and of several clients (batches pipelined on streams; a stream can
be cut at any point, its requests after the cut lost; acks lost; re-sends of every unacknowledged batch on a
new stream while an old stream may still deliver what it carried, interleaved with the new one; appends
that stay in flight while later batches arrive, and end stored or refused in any order). After every step:

* no (producer, sequence) is stored twice;
* every acknowledged batch's offsets hold exactly its messages;
* the table never remembers more producers than its bound.

With a table too small for the producers (LRU eviction, the time window) the run checks the bound and that
an evicted producer is the only way to get a message stored twice. A failure names the seed: rerun it with
`run(seed)`.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ister.core.dedup import DedupTable, StoredBatch
from ister.errors import DuplicateSequence, OutOfOrderSequence

Request = tuple[int, int, int]  # (producer key, first sequence, count)


class InFlight(Exception):
    """The batch's append (or its first copy's) is not over: no answer on this stream."""


@dataclass
class Broker:
    max_producers: int
    window_ms: int
    log: list[tuple[int, int]] = field(default_factory=list)  # per offset: (key, sequence)
    tags: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # key, first, count, off, ms
    table: DedupTable = field(init=False)
    duplicates: int = 0  # retries answered with the original offsets
    restored_duplicates: int = 0  # ... of batches the table learnt from the log after a restart
    failed: int = 0
    failed_before_later: int = 0  # appends refused while later ones of their producer were in flight
    restored: set[tuple[int, int]] = field(default_factory=set)
    inflight: list[tuple[Request, StoredBatch, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.table = self._new_table()

    def _new_table(self) -> DedupTable:
        return DedupTable(self.max_producers, self.window_ms, 8)

    def receive(self, req: Request, now: int, fail: bool, defer: bool = False) -> int:
        """The first offset of the batch (stored now or before); raises the refusals, and InFlight for a
        batch whose append is not over (`defer`: this one's; it ends in `complete`)."""
        key, first, count = req
        verdict = self.table.check(key, first, count, now)
        if verdict.duplicate is not None:
            off = verdict.duplicate.first_offset
            if off is None:
                raise InFlight("its first copy is still being appended")
            self.duplicates += 1
            self.restored_duplicates += (key, first) in self.restored
            return off
        batch = self.table.accept(key, first, count, now)
        if fail:  # the WAL refused it (a full disk): nothing stored
            self.table.failed(key, batch)
            self.failed += 1
            raise OSError("disk full")
        if defer:
            self.inflight.append((req, batch, now))
            raise InFlight("appending")
        return self._store(req, batch, now)

    def _store(self, req: Request, batch: StoredBatch, now: int) -> int:
        key, first, count = req
        off = len(self.log)
        self.log.extend((key, first + i) for i in range(count))
        self.tags.append((key, first, count, off, now))
        self.table.stored(batch, off)
        return off

    def complete(self, rng: random.Random) -> None:
        """One append in flight ends: stored, or refused with nothing stored (the disk was full for it
        alone: batches of its producer sent after it may be stored)."""
        req, batch, now = self.inflight.pop(rng.randrange(len(self.inflight)))
        if rng.random() < 0.4:
            self.table.failed(req[0], batch)
            self.failed_before_later += 1
        else:
            self._store(req, batch, now)

    def restart(self, now: int, scan_from_ms: int) -> None:
        rng = random.Random(now)
        while self.inflight:  # the appends in flight end one way or the other before the broker stops
            self.complete(rng)
        self.table = self._new_table()
        for key, first, count, off, ms in self.tags:
            if ms >= scan_from_ms:
                self.table.restore(key, first, count, off, ms)
                self.restored.add((key, first))
        self.table.expire(now)


@dataclass
class Client:
    key: int
    next_seq: int = 0
    unacked: deque[tuple[int, int]] = field(default_factory=deque)  # (first, count)
    acked: dict[int, set[tuple[int, int]]] = field(default_factory=dict)  # first -> {(count, offset)}
    streams: list[deque[Request]] = field(default_factory=list)
    gave_up: int = 0

    def new_batch(self, rng: random.Random) -> None:
        count = rng.randint(1, 4)
        self.unacked.append((self.next_seq, count))
        self.next_seq += count
        if self.streams:
            self.streams[-1].append((self.key, self.next_seq - count, count))

    def give_up(self, key: int) -> None:
        self.gave_up += 1
        self.key, self.next_seq = key, 0
        self.unacked.clear()
        self.acked.clear()
        self.reconnect()

    def reconnect(self) -> None:
        self.streams.append(deque((self.key, f, c) for f, c in self.unacked))

    def ack(self, first: int, count: int, offset: int) -> None:
        if self.unacked and self.unacked[0] == (first, count):
            self.unacked.popleft()
        self.acked.setdefault(first, set()).add((count, offset))


def deliver(broker: Broker, c: Client, rng: random.Random, now: int, keys: Iterator[int]) -> None:
    """The broker takes the next request of one of the client's streams."""
    live = [s for s in c.streams if s]
    if not live:
        return
    # Mostly the newest stream; sometimes an old one still delivering (interleaved).
    stream = live[-1] if rng.random() < 0.7 else rng.choice(live)
    req = stream.popleft()
    try:
        off = broker.receive(req, now, fail=rng.random() < 0.03, defer=rng.random() < 0.15)
    except InFlight:
        return  # no ack for it on this stream; the client re-sends it after a reconnect
    except (OSError, DuplicateSequence):
        stream.clear()  # the stream ends with the failure; the client re-sends on a new one
        if stream is c.streams[-1]:
            c.reconnect()
        return
    except OutOfOrderSequence:
        # An old stream delivered a batch after a failed append rolled the producer back: the client fails
        # what it has pending and goes on under a new key (ister.client.publisher).
        stream.clear()
        if req[0] == c.key:
            c.give_up(next(keys))
        return
    if rng.random() < 0.8 and req[0] == c.key:  # the ack arrives
        c.ack(req[1], req[2], off)


def run(seed: int, *, producers: int = 3, steps: int = 600, small: bool = False) -> Broker:
    rng = random.Random(seed)
    broker = Broker(max_producers=2 if small else 100, window_ms=500 if small else 10**9)
    keys = itertools.count(1)
    clients = [Client(key=next(keys)) for _ in range(producers)]
    for c in clients:
        c.reconnect()
    now = 0
    for _ in range(steps):
        now += rng.randint(0, 20 if small else 5)
        c = rng.choice(clients)
        r = rng.random()
        if r < 0.35:
            c.new_batch(rng)
        elif r < 0.75:
            deliver(broker, c, rng, now, keys)
        elif r < 0.80:
            if broker.inflight:
                broker.complete(rng)
        elif r < 0.90:
            if rng.random() < 0.5 and c.streams:
                c.streams[-1].clear()  # the stream is cut
            c.reconnect()
        elif r < 0.95:
            broker.restart(now, now - broker.window_ms)
            for cl in clients:
                for s in cl.streams:
                    s.clear()
                cl.reconnect()
        else:
            for s in c.streams:
                s.clear()
            c.reconnect()
        check(broker, clients, small)
    return broker


def check(broker: Broker, clients: list[Client], small: bool) -> None:
    assert len(broker.table) <= broker.table.max_producers
    by_key: dict[int, list[int]] = {}
    for key, seq in broker.log:
        by_key.setdefault(key, []).append(seq)
    if not small:
        for key, seqs in by_key.items():
            # Each sequence once; not in order: a batch re-sent after its append failed follows the later
            # batches stored meanwhile.
            assert len(set(seqs)) == len(seqs), f"producer {key}: stored sequences {seqs}"
    if small:
        return
    for c in clients:
        for first, answers in c.acked.items():
            assert len(answers) == 1, f"batch {first} acknowledged at two offsets: {answers}"
            ((count, off),) = answers
            stored = broker.log[off : off + count]
            assert stored == [(c.key, first + i) for i in range(count)], (first, count, off, stored)


@pytest.mark.parametrize("seed", range(60))
def test_each_message_stored_once_at_the_offsets_acknowledged(seed: int) -> None:
    broker = run(seed)
    assert broker.log, "the schedule stored nothing"


@pytest.mark.parametrize("seed", range(30))
def test_a_small_table_stays_bounded(seed: int) -> None:
    run(seed, producers=5, small=True)


def test_the_schedules_retry_stored_batches_and_restart() -> None:
    """The properties are not vacuous: retries of stored batches are answered, also from a rebuilt table."""
    brokers = [run(seed) for seed in range(50)]
    assert sum(b.duplicates for b in brokers) > 100
    assert sum(b.restored_duplicates for b in brokers) > 10
    assert sum(b.failed for b in brokers) > 10
    assert sum(b.failed_before_later for b in brokers) > 10
