"""A seeded chaos run (issue 39): a real cluster under traffic and faults, then its history checked.

usage: python bench/chaos.py --minutes N --seed S [--brokers 3] [--topics 4] [--rate 100]
       [--faults kill,kill_wipe,pause,etcd,unload] [--out FILE.json] [--dir DIR]
       (or `make chaos MINUTES=60 SEED=7`)

Starts etcd and `--brokers` broker processes (tests/integration/cluster.py's `Cluster`) with RF 3, min
in-sync 2, lease TTL 2 s, and replicas replaced after `REPLACE_AFTER` s. Each topic gets a producer of the
Ister client publishing unique, keyed payloads at `--rate` msg/s, and four subscriptions created at the
earliest offset before the first publish: Exclusive (one consumer), Failover, Shared and Key-Shared (two
consumers each), all acknowledging as they receive. Meanwhile faults drawn from `FAULTS` by the seed run one
after another, each healing itself: SIGKILL and restart, SIGKILL with the data directory deleted (the
broker returns as a new one; one such permanent loss at a time, only while every copy is in sync, spaced by
twice the replacement time), SIGSTOP past the lease then SIGCONT, etcd stopped and restarted, a topic
unloaded (a move). The persisted cursors and leaders are polled every second.

At the end everything is healed, one probe message per topic must be acknowledged, the subscriptions are
given time to receive everything, every topic is read back, and `ister.core.history.check` judges the
recorded history. The summary: acknowledged, lost, conflicts, duplicates (stored twice: a failure, since
the producers are idempotent; `--no-idempotence` makes them at-least-once), undelivered per subscription,
the longest stretch without an acknowledgement per topic and the fault before it, and failover times (a
fault to the next acknowledgement on each topic it touched). Exit code 1 when anything acknowledged was lost
or bound to two payloads, or a topic was never writable again. The seed fixes the schedule (fault kinds,
targets by broker index, durations, keys); the cluster's timing is the machine's.

A new fault kind is a coroutine registered with `@fault("name")` (network partitions can join by name).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)

from tests.etcd_server import EtcdServer  # noqa: E402
from tests.integration.cluster import Cluster  # noqa: E402
from tests.integration.harness import BrokerProcess  # noqa: E402
from tests.integration.network import Network, unavailable  # noqa: E402
from tests.support import until  # noqa: E402

from ister import errors  # noqa: E402
from ister.client import Client, Producer  # noqa: E402
from ister.core.dispatch.types import SubType  # noqa: E402
from ister.core.history import (  # noqa: E402
    Acked,
    CheckResult,
    ConsumerAck,
    CursorObserved,
    Delivery,
    History,
    Publish,
    Subscription,
    check,
)
from ister.core.record import decode_message  # noqa: E402
from ister.core.replication import ReplicaRecord  # noqa: E402
from ister.metadata import keys  # noqa: E402

LEASE_TTL = 2
REPLACE_AFTER = 10.0  # seconds a dead broker's copies wait before a replacement (the default is 120)
ENV = {
    "ISTER_CLUSTER__REPLICATION_FACTOR": "3",
    "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "2",
    "ISTER_CLUSTER__REPLICA_MAX_LAG_SECONDS": "2",
    "ISTER_CLUSTER__REPLICA_REPLACE_AFTER_SECONDS": str(REPLACE_AFTER),
}
SUBSCRIPTIONS = {  # name -> (type, consumers)
    "exclusive": (SubType.EXCLUSIVE, 1),
    "failover": (SubType.FAILOVER, 2),
    "shared": (SubType.SHARED, 2),
    "key_shared": (SubType.KEY_SHARED, 2),
}
KEYS = [f"k{i}" for i in range(8)]
BATCH = 10
SEND_TIMEOUT = 60.0  # one publish call; the client's own retries end after 30 s
SETTLE_SECONDS = 180.0  # after healing: for the cluster to serve every topic and deliver everything
POLL_SECONDS = 1.0


@dataclass
class Settings:
    minutes: float
    seed: int
    brokers: int = 3
    topics: int = 4
    rate: float = 100.0  # messages per second per topic
    faults: tuple[str, ...] = ()  # empty: every registered kind
    gap: tuple[float, float] = (2.0, 8.0)  # seconds between faults
    network: bool = True  # brokers in network namespaces, so partitions can be made (where the machine can)
    idempotent: bool = True  # the producers' idempotence (issue 43): then a message stored twice is a failure
    # Each wait after the heal (a topic's probe, delivery, a topic's read-back) gives up after this long, so a
    # run inside a test's deadline ends in the check that says what is missing rather than in the timeout.
    settle: float = SETTLE_SECONDS


@dataclass
class FaultRecord:
    kind: str
    target: str
    started: float  # seconds since the run began
    healed: float = 0.0
    topics: list[str] = field(default_factory=list)  # topics it may interrupt (their leader was hit)
    note: str = ""


@dataclass
class Report:
    seed: int
    minutes: float
    brokers: int
    topics: int
    faults: list[FaultRecord]
    check: CheckResult
    unwritable_after_heal: list[str]
    longest_unwritable: dict[str, dict[str, Any]]
    failover_seconds: dict[str, float | None]
    failovers_never: int
    recorded: dict[str, int]  # events of each kind in the history
    logs: list[str]
    # the same figures per fault kind (a partition by its shape): a death against a cut that by design
    # fails nothing over
    failover_by_kind: dict[str, dict[str, float | None]] = field(default_factory=dict)
    idempotent: bool = True  # producers were idempotent: nothing may be stored twice

    @property
    def stored_twice(self) -> bool:
        """A message stored at two offsets breaks an idempotent producer's promise (not at-least-once's)."""
        return self.idempotent and self.check.duplicates_stored > 0

    @property
    def failed(self) -> bool:
        return bool(
            self.check.lost or self.check.conflicts or self.unwritable_after_heal or self.stored_twice
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["check"]["ok"] = self.check.ok
        out["ok"] = self.check.ok and not self.failed
        return out

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.faults:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        fo = self.failover_seconds
        lines = [
            f"chaos seed {self.seed}: {self.minutes} min, {self.brokers} brokers, {self.topics} topics, "
            f"{len(self.faults)} faults {kinds}",
            "recorded: " + ", ".join(f"{n} {kind}" for kind, n in self.recorded.items()),
            self.check.summary(),
            "failover (fault -> next acknowledgement on a topic it hit): "
            + ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} -" for k, v in fo.items())
            + f"; never acknowledged again before the heal: {self.failovers_never}",
            *(
                f"  {kind} ({int(figures.get('n') or 0)} topic hits): "
                + ", ".join(f"{k} {v:.2f} s" for k, v in figures.items() if k != "n" and v is not None)
                for kind, figures in sorted(self.failover_by_kind.items())
            ),
            "longest stretch without an acknowledgement:",
        ]
        for topic, s in self.longest_unwritable.items():
            lines.append(
                f"  {topic}: {s['seconds']:.2f} s from t={s['from']:.1f} s, after {s['fault'] or 'no fault'}"
            )
        if self.unwritable_after_heal:
            lines.append(f"NOT WRITABLE after the heal: {self.unwritable_after_heal}")
        return "\n".join(lines)


# -- the fault registry -------------------------------------------------------------------------------------
FaultFn = Callable[["Chaos", random.Random, FaultRecord], Awaitable[None]]
FAULTS: dict[str, FaultFn] = {}


def fault(name: str) -> Callable[[FaultFn], FaultFn]:
    """Register a fault kind: a coroutine that injects it, waits its seeded duration and heals it."""

    def register(fn: FaultFn) -> FaultFn:
        FAULTS[name] = fn
        return fn

    return register


class Chaos:
    """The run's state: cluster, etcd, the recorded history, what the poller last saw."""

    def __init__(self, settings: Settings, root: Path) -> None:
        self.settings = settings
        self.root = root
        self.t0 = time.monotonic()
        self.network: Network | None = None
        if settings.network and unavailable() is None:
            self.network = Network(settings.brokers)
        host = self.network.root_ip if self.network is not None else "127.0.0.1"
        self.etcd = EtcdServer(root / "etcd", host=host)
        self.cluster: Cluster | None = None
        self.topics = [f"/default/chaos_{i}" for i in range(settings.topics)]
        self.history = History()
        self.ack_times: dict[str, list[float]] = {t: [] for t in self.topics}
        self.delivered: dict[tuple[str, str], set[int]] = {}
        self.leaders: dict[str, int | None] = {}
        self.records: dict[str, ReplicaRecord | None] = {}
        self.live: list[int] = []
        self.faults: list[FaultRecord] = []
        self.paused: set[int] = set()  # broker indexes stopped by SIGSTOP
        self.last_wipe = -1e9
        self.stop = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def urls(self) -> list[str]:
        assert self.cluster is not None
        return [b.url for b in self.cluster.brokers]

    def broker(self, index: int) -> BrokerProcess:
        assert self.cluster is not None
        return self.cluster.brokers[index]

    def broker_id(self, index: int) -> int | None:
        try:
            return int((self.broker(index).data_dir / "broker_id").read_text())
        except (OSError, ValueError):
            return None

    def led_by(self, index: int) -> list[str]:
        bid = self.broker_id(index)
        return [t for t, leader in self.leaders.items() if leader is not None and leader == bid]

    async def restart(self, index: int) -> None:
        b = self.broker(index)
        if b.proc is None:
            await asyncio.to_thread(b.start, 60.0)

    def fully_replicated(self) -> bool:
        """Every topic's copies all live and in sync: the only state in which a disk may be lost."""
        return all(
            r is not None
            and len(r.replicas) == 3
            and set(r.isr) == set(r.replicas)
            and set(r.replicas) <= set(self.live)
            for r in (self.records.get(t) for t in self.topics)
        )


@fault("kill")
async def kill(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    index = rng.randrange(chaos.settings.brokers)
    hold = rng.uniform(1.0, 8.0)
    rec.target, rec.topics = f"broker[{index}] id {chaos.broker_id(index)}", chaos.led_by(index)
    chaos.broker(index).kill9()
    await asyncio.sleep(hold)  # the outage's seeded length
    await chaos.restart(index)


@fault("kill_wipe")
async def kill_wipe(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    index = rng.randrange(chaos.settings.brokers)
    hold = rng.uniform(1.0, 8.0)
    rec.target, rec.topics = f"broker[{index}] id {chaos.broker_id(index)}", chaos.led_by(index)
    # One permanent loss at a time: only with every copy in sync, and the last one replaced by now.
    wipe = chaos.fully_replicated() and chaos.now() - chaos.last_wipe >= 2 * REPLACE_AFTER
    chaos.broker(index).kill9()
    if wipe:
        shutil.rmtree(chaos.broker(index).data_dir, ignore_errors=True)
        chaos.last_wipe = chaos.now()
        rec.note = "data directory deleted: returns as a new broker"
    else:
        rec.note = "not wiped (a copy out of sync or the last loss too recent): a plain kill"
    await asyncio.sleep(hold)
    await chaos.restart(index)


@fault("pause")
async def pause(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    index = rng.randrange(chaos.settings.brokers)
    hold = LEASE_TTL + rng.uniform(1.0, 4.0)
    b = chaos.broker(index)
    rec.target, rec.topics = f"broker[{index}] id {chaos.broker_id(index)}", chaos.led_by(index)
    if b.proc is None:
        rec.note = "not running"
        return
    b.proc.send_signal(signal.SIGSTOP)
    chaos.paused.add(index)
    await asyncio.sleep(hold)
    b.proc.send_signal(signal.SIGCONT)
    chaos.paused.discard(index)


@fault("etcd")
async def etcd_outage(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    hold = rng.uniform(2.0, 8.0)
    rec.target, rec.topics = "etcd", list(chaos.topics)
    await asyncio.to_thread(chaos.etcd.stop)
    await asyncio.sleep(hold)
    await asyncio.to_thread(chaos.etcd.start)


@fault("unload")
async def unload(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    topic = rng.choice(chaos.topics)
    rec.target, rec.topics = topic, [topic]
    assert chaos.cluster is not None
    try:
        await asyncio.wait_for(chaos.cluster.unload(topic), 10)
    except (AssertionError, KeyError, TimeoutError, errors.IsterError) as exc:
        rec.note = f"not unloaded: {type(exc).__name__} {exc}"  # unassigned or mid-move right now


PARTITIONS = (
    "leader_followers",
    "leader_etcd",
    "follower_etcd",
    "one_way_out",
    "one_way_in",
    "clients",
    "reset",
)


@fault("partition")
async def partition(chaos: Chaos, rng: random.Random, rec: FaultRecord) -> None:
    """A network partition around one topic's leader (tests/integration/network.py; the shapes of
    tests/integration/test_partitions.py), held 3-12 s, then healed."""
    topic, shape, hold = rng.choice(chaos.topics), rng.choice(PARTITIONS), rng.uniform(3.0, 12.0)
    net, cluster = chaos.network, chaos.cluster
    record = chaos.records.get(topic)
    rec.target = f"{shape} around the leader of {topic}"
    if net is None or cluster is None:
        rec.note = "not made: no network namespaces here"
        return
    if record is None or record.leader < 0:
        rec.note = "not made: the topic has no leader right now"
        return
    try:
        leader = cluster.host_of(record.leader)
        follower = cluster.host_of(next(b for b in record.replicas if b != record.leader))
        index = cluster.brokers.index(cluster.process_of(record.leader))
    except (LookupError, StopIteration):
        rec.note = "not made: a replica's broker is gone"
        return
    rec.target += f" (broker[{index}] id {record.leader})"
    rec.topics = chaos.led_by(index)

    def cut_followers() -> None:
        for b in record.replicas:
            if b != record.leader:
                net.cut(leader, cluster.host_of(b))

    cuts: dict[str, Callable[[], None]] = {
        "leader_followers": cut_followers,
        "leader_etcd": lambda: net.isolate_from_etcd(leader),
        "follower_etcd": lambda: net.isolate_from_etcd(follower),
        "one_way_out": lambda: net.cut_one_way(leader, follower),
        "one_way_in": lambda: net.cut_one_way(follower, leader),
        "clients": lambda: net.isolate_from_clients(leader),
        "reset": lambda: net.reset(leader, follower),
    }
    try:
        await asyncio.to_thread(cuts[shape])
        await asyncio.sleep(hold)  # the partition's seeded length
    except LookupError:
        rec.note = "partly made: a replica's broker went away"
    finally:
        await asyncio.to_thread(net.heal)


# -- traffic -------------------------------------------------------------------------------------------------
async def produce(chaos: Chaos, topic: str, index: int, ready: asyncio.Event) -> None:
    rng = random.Random(chaos.settings.seed * 1000 + index)
    h = chaos.history
    interval = BATCH / chaos.settings.rate
    seq = 0
    async with Client(chaos.urls) as client:
        idempotent = chaos.settings.idempotent
        pub: Producer | None = await client.producer(topic, f"chaos-p{index}", idempotent=idempotent)
        ready.set()
        while not chaos.stop.is_set():
            if pub is None:
                try:
                    pub = await client.producer(topic, f"chaos-p{index}", idempotent=idempotent)
                except errors.IsterError:
                    await asyncio.sleep(1.0)
                    continue
            msgs = []
            for _ in range(BATCH):
                payload = f"{index}-{seq}".encode()
                key = rng.choice(KEYS)
                seq += 1
                h.publishes.append(Publish(topic, payload, key, chaos.now()))
                msgs.append((payload, None, key))
            try:
                offsets = await asyncio.wait_for(pub.send_each(msgs), SEND_TIMEOUT)
            except (errors.IsterError, TimeoutError):
                # Not acknowledged: may be stored or not, never owed. A fresh producer, as an application
                # would make after an error it cannot tell apart from a closed one.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pub.close(timeout=5), 10)
                pub = None
                continue
            t = chaos.now()
            for (payload, _, _), offset in zip(msgs, offsets, strict=True):
                h.acks.append(Acked(topic, payload, offset, t))
            chaos.ack_times[topic].append(t)
            await asyncio.sleep(interval)  # the offered rate, not a wait for a condition


async def consume(chaos: Chaos, topic: str, sub: str, sub_type: SubType, name: str) -> None:
    h = chaos.history
    seen = chaos.delivered.setdefault((topic, sub), set())
    async with Client(chaos.urls) as client:
        while True:
            try:
                consumer = await client.consumer(
                    topic, sub, type=int(sub_type), name=name, initial_position="earliest"
                )
            except errors.IsterError:
                await asyncio.sleep(1.0)  # the client already backed off for its retry window
                continue
            try:
                while True:
                    batch = await consumer.receive_batch(500, timeout=1.0)
                    t = chaos.now()
                    for m in batch:
                        h.deliveries.append(
                            Delivery(topic, sub, name, m.offset, m.payload, f"{m.offset}/{m.epoch}", t, m.key)
                        )
                        seen.add(m.offset)
                    if batch:
                        await consumer.ack_batch(batch)
                        t = chaos.now()
                        h.consumer_acks.extend(ConsumerAck(topic, sub, name, m.offset, t) for m in batch)
            except errors.IsterError:
                with contextlib.suppress(Exception):
                    await consumer.close()


async def poll(chaos: Chaos) -> None:
    """Leaders, replica records, live brokers and persisted cursors, every second (etcd may be down)."""
    assert chaos.cluster is not None
    store = chaos.cluster.store
    assert store is not None
    while True:
        with contextlib.suppress(Exception):
            chaos.live = await asyncio.wait_for(chaos.cluster.live(), 2)
            for topic in chaos.topics:
                kv = await asyncio.wait_for(store.get(keys.replicas(topic)), 2)
                rec = ReplicaRecord.parse(kv.value) if kv is not None else None
                chaos.records[topic] = rec
                chaos.leaders[topic] = rec.leader if rec is not None else None
                for sub in SUBSCRIPTIONS:
                    kv = await asyncio.wait_for(store.get(keys.subscription_cursor(topic, sub)), 2)
                    if kv is not None:
                        chaos.history.cursors.append(
                            CursorObserved(topic, sub, int(kv.value) + 1, chaos.now())
                        )
        await asyncio.sleep(POLL_SECONDS)


async def inject(chaos: Chaos, deadline: float) -> None:
    rng = random.Random(chaos.settings.seed)
    kinds = list(chaos.settings.faults or FAULTS)
    while chaos.now() < deadline:
        await asyncio.sleep(rng.uniform(*chaos.settings.gap))
        if chaos.now() >= deadline:
            break
        kind = rng.choice(kinds)
        rec = FaultRecord(kind, "", chaos.now())
        chaos.faults.append(rec)
        await FAULTS[kind](chaos, rng, rec)
        rec.healed = chaos.now()
        print(f"t={rec.started:7.1f} s {kind:9} {rec.target} {rec.note}", flush=True)


async def heal(chaos: Chaos) -> None:
    for index in list(chaos.paused):
        proc = chaos.broker(index).proc
        if proc is not None:
            proc.send_signal(signal.SIGCONT)
        chaos.paused.discard(index)
    if chaos.network is not None:
        await asyncio.to_thread(chaos.network.heal)
    if not chaos.etcd.running:
        await asyncio.to_thread(chaos.etcd.start)
    for index in range(chaos.settings.brokers):
        await chaos.restart(index)


# -- the end -------------------------------------------------------------------------------------------------
async def probe(chaos: Chaos, topic: str) -> bool:
    """One more acknowledged message on a healed topic, or False: the topic is not writable again."""
    payload = f"probe-{topic}".encode()
    chaos.history.publishes.append(Publish(topic, payload, None, chaos.now()))
    try:
        async with Client(chaos.urls, retry_timeout=chaos.settings.settle) as client:
            pub = await client.producer(topic, f"chaos-probe-{topic.rsplit('_', 1)[-1]}")
            offset = await asyncio.wait_for(pub.send(payload), chaos.settings.settle)
    except (errors.IsterError, TimeoutError):
        return False
    chaos.history.acks.append(Acked(topic, payload, offset, chaos.now()))
    return True


async def read_back(chaos: Chaos, topic: str) -> None:
    want = {a.offset for a in chaos.history.acks if a.topic == topic}
    got: dict[int, bytes] = {}
    start = 0

    async def everything() -> bool:
        nonlocal start
        try:
            async with Client(chaos.urls) as client:
                span = await client.offsets(topic)
                start = span.earliest
                async for batch in client.read(topic, span.earliest, span.next):
                    got.update((o, decode_message(r).payload) for o, r in batch)
        except errors.IsterError:
            return False  # not served yet: ask again
        return all(o in got for o in want if o >= start)

    with contextlib.suppress(AssertionError):
        await until(everything, f"{topic} read back", chaos.settings.settle, poll=1.0)
    chaos.history.reads[topic] = got
    chaos.history.start_offsets[topic] = start


def percentiles(waits: list[float]) -> dict[str, float | None]:
    waits = sorted(waits)

    def pct(q: float) -> float | None:
        return waits[min(len(waits) - 1, int(q * len(waits)))] if waits else None

    return {"p50": pct(0.5), "p99": pct(0.99), "max": waits[-1] if waits else None, "n": float(len(waits))}


def failover_figures(
    chaos: Chaos, end: float
) -> tuple[dict[str, float | None], int, dict[str, dict[str, Any]], dict[str, dict[str, float | None]]]:
    waits: list[float] = []
    by_kind: dict[str, list[float]] = {}
    never = 0
    for f in chaos.faults:
        kind = f"{f.kind} {f.target.split()[0]}" if f.kind == "partition" else f.kind
        for topic in f.topics:
            after = [t for t in chaos.ack_times[topic] if t > f.started]
            if after:
                waits.append(after[0] - f.started)
                by_kind.setdefault(kind, []).append(after[0] - f.started)
            else:
                never += 1

    longest: dict[str, dict[str, Any]] = {}
    for topic, times in chaos.ack_times.items():
        marks = [*times, end] if times else [0.0, end]
        best = max(itertools.pairwise(marks), key=lambda p: p[1] - p[0], default=(0.0, 0.0))
        # The fault that began the stretch: the first one started in it (or just before its last
        # acknowledgement), else the last one before it (a topic still stalled by an earlier fault).
        inside = [f for f in chaos.faults if best[0] - 1.0 <= f.started <= best[1]]
        before = [f for f in chaos.faults if f.started <= best[0]]
        culprit = inside[0] if inside else before[-1] if before else None
        longest[topic] = {
            "seconds": best[1] - best[0],
            "from": best[0],
            "fault": f"{culprit.kind} {culprit.target} at t={culprit.started:.1f} s" if culprit else None,
        }
    overall = percentiles(waits)
    overall.pop("n")
    return overall, never, longest, {kind: percentiles(w) for kind, w in by_kind.items()}


async def run(settings: Settings, root: Path) -> Report:
    """The whole run; `root` keeps the brokers' data and logs (`b<i>-broker.log`) and etcd's."""
    chaos = Chaos(settings, root)
    if chaos.network is not None:
        await asyncio.to_thread(chaos.network.create)
    await asyncio.to_thread(chaos.etcd.start)
    if chaos.network is not None:
        chaos.network.etcd_port = chaos.etcd.client_port
    else:
        print(f"no partitions in this run: {unavailable() or 'loopback asked for'}", flush=True)
    chaos.cluster = Cluster(
        root, chaos.etcd.endpoint, settings.brokers, LEASE_TTL, env=ENV, network=chaos.network
    )
    tasks: list[asyncio.Task[None]] = []
    producers: list[asyncio.Task[None]] = []
    try:
        await chaos.cluster.start()
        for i, topic in enumerate(chaos.topics):
            ready = asyncio.Event()
            producers.append(asyncio.create_task(produce(chaos, topic, i, ready)))
            await ready.wait()  # the topic exists; subscriptions start before anything is acknowledged
        for topic in chaos.topics:
            for sub, (sub_type, consumers) in SUBSCRIPTIONS.items():
                chaos.history.subscriptions.append(Subscription(topic, sub, sub_type))
                for c in range(consumers):
                    tasks.append(asyncio.create_task(consume(chaos, topic, sub, sub_type, f"{sub}-{c}")))
        tasks.append(asyncio.create_task(poll(chaos)))
        chaos.t0 = time.monotonic()  # the clock of the fault phase (history times before it are < 0)
        await inject(chaos, settings.minutes * 60)
        end = chaos.now()
        await heal(chaos)
        chaos.stop.set()
        await asyncio.gather(*producers, return_exceptions=True)
        unwritable = [t for t in chaos.topics if not await probe(chaos, t)]

        def all_delivered() -> bool:
            acked: dict[str, set[int]] = {}
            for a in chaos.history.acks:
                acked.setdefault(a.topic, set()).add(a.offset)
            return all(
                acked.get(t, set()) <= chaos.delivered.get((t, s), set())
                for t in chaos.topics
                for s in SUBSCRIPTIONS
            )

        with contextlib.suppress(AssertionError):
            await until(all_delivered, "every subscription received everything", settings.settle, poll=0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for topic in chaos.topics:
            await read_back(chaos, topic)
        failovers, never, longest, by_kind = failover_figures(chaos, end)
        return Report(
            seed=settings.seed,
            minutes=settings.minutes,
            brokers=settings.brokers,
            topics=settings.topics,
            faults=chaos.faults,
            check=check(chaos.history),
            unwritable_after_heal=unwritable,
            longest_unwritable=longest,
            failover_seconds=failovers,
            failovers_never=never,
            failover_by_kind=by_kind,
            idempotent=settings.idempotent,
            recorded={
                "publish attempts": len(chaos.history.publishes),
                "deliveries": len(chaos.history.deliveries),
                "consumer acks": len(chaos.history.consumer_acks),
                "cursor observations": len(chaos.history.cursors),
            },
            logs=[str(b.log_path) for b in chaos.cluster.brokers],
        )
    finally:
        for task in [*tasks, *producers]:
            task.cancel()
        await asyncio.gather(*tasks, *producers, return_exceptions=True)
        for index in list(chaos.paused):  # a stopped process ignores SIGTERM: let it die properly
            proc = chaos.broker(index).proc
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(chaos.cluster.stop(), 30)
        chaos.etcd.stop()
        if chaos.network is not None:
            chaos.network.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--topics", type=int, default=4)
    ap.add_argument("--rate", type=float, default=100.0, help="messages per second per topic")
    ap.add_argument("--faults", default="", help=f"comma-separated, of {', '.join(FAULTS)} (default: all)")
    ap.add_argument("--out", type=Path, help="write the report as JSON here")
    ap.add_argument("--dir", type=Path, help="keep the cluster's data and logs here (default: a temp dir)")
    ap.add_argument(
        "--no-idempotence",
        action="store_true",
        help="producers without idempotence (at-least-once: messages stored twice are allowed)",
    )
    ap.add_argument(
        "--loopback", action="store_true", help="brokers on loopback, no partitions (no root or iptables)"
    )
    args = ap.parse_args()
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        ap.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULTS)}")
    settings = Settings(
        args.minutes,
        args.seed,
        args.brokers,
        args.topics,
        args.rate,
        faults,
        network=not args.loopback,
        idempotent=not args.no_idempotence,
    )
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"ister-chaos-{args.seed}-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"chaos run: seed {args.seed}, {args.minutes} min, data and logs in {root}", flush=True)
    report = asyncio.run(run(settings, root))
    print(report.summary())
    if args.out:
        args.out.write_text(json.dumps(report.to_json(), indent=2, default=str))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
