"""Issue 19's end-to-end scenario with real processes: a partitioned topic, a producer of numbered key
sequences, consumers of both clients joining one by one, leaving cleanly and one SIGKILLed.

Used by tests/integration/test_partition_handoff_e2e.py (asserts properties) and bench/partition_handoff.py
(prints the figures). Every consumer is its own process (tests/integration/partition_consumer.py) that prints
each message it receives with its arrival time; the producer (Ister client, keyed sends) runs here. After each
step the scenario waits until the broker's partition map (IsterAdmin.ListPartitionAssignments) holds exactly
the live consumers with no handoff in progress, then until every partition delivered again, and records
which consumer actually received each partition since. The broker's log line per handoff (partition, from,
to, time paused, messages redelivered) gives the handoff windows.

`analyse` turns the records into the figures: messages missing, duplicates (and which consumer first had
them), per-key order (the first delivery of each key's messages must come in sequence order), splits (a
key whose next message reaches a different consumer; each must be a handoff of the key's partition from
that consumer to that one, which is what the seed allows), and per step: the handoffs' pauses, the moving
partitions' delivery gap as the consumers saw it, and the largest delivery gap of the partitions that did not
move while the handoffs were in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

from ister.client import Client
from ister.client.routing import fnv1a_64
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.support import until

ROOT = Path(__file__).resolve().parents[2]
HANDOFF_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: (\S+)/([^/\s]+): partition (\d+) handed off "
    r"from (\S+) to (\S+) after ([\d.]+) s, (\d+) redelivered"
)

# (action, consumer, client): join / leave (clean: acks what it recorded, closes) / kill (SIGKILL)
Step = tuple[str, str, str]
STEPS: list[Step] = [
    ("join", "c1", "danube"),
    ("join", "c2", "ister"),
    ("join", "c3", "danube"),
    ("join", "c4", "ister"),
    ("leave", "c2", "ister"),
    ("kill", "c3", "danube"),
    ("leave", "c1", "danube"),
]


def choose_keys(n_keys: int, partitions: int) -> dict[str, int]:
    """`n_keys` keys (k00, k01, ...) spread evenly over the partitions by the clients' key hash: key ->
    partition."""
    per = -(-n_keys // partitions)
    out: dict[str, int] = {}
    taken: Counter[int] = Counter()
    i = 0
    while len(out) < n_keys:
        key = f"k{i:02d}"
        p = fnv1a_64(key) % partitions
        if taken[p] < per:
            out[key] = p
            taken[p] += 1
        i += 1
    return out


@dataclass(frozen=True, slots=True)
class Delivery:
    t: float  # time.time() in the consumer when it received the message
    consumer: str
    partition: int
    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    at: float  # time.time() of the switch (from the broker's log, millisecond precision)
    partition: int
    source: str
    target: str
    paused: float
    redelivered: int

    @property
    def paused_at(self) -> float:
        return self.at - self.paused


def parse_handoffs(log_text: str, topic: str, subscription: str) -> list[HandoffRecord]:
    out = []
    for line in log_text.splitlines():
        m = HANDOFF_LINE.match(line)
        if m is None or m.group(2) != topic or m.group(3) != subscription:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append(
            HandoffRecord(at, int(m.group(4)), m.group(5), m.group(6), float(m.group(7)), int(m.group(8)))
        )
    return out


@dataclass(slots=True)
class StepRecord:
    action: str
    consumer: str
    client: str
    started: float
    settled: float = 0.0
    before: dict[int, str] = field(default_factory=dict)
    after: dict[int, str] = field(default_factory=dict)
    # partition -> the consumers it delivered to after the step settled
    seen: dict[int, set[str]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.consumer} ({self.client}) {self.action}s"

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.after.values()))

    def spread(self) -> int:
        c = self.counts().values()
        return max(c) - min(c) if c else 0


class ConsumerProcess:
    """A consumer subprocess and the deliveries it printed."""

    def __init__(self, name: str, client: str, deliveries: list[Delivery]) -> None:
        self.name = name
        self.client = client
        self.deliveries = deliveries  # shared with every consumer: the scenario's record
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.closed = False
        self.reader: asyncio.Task[None] | None = None
        self.errors: list[str] = []

    async def start(self, url: str, topic: str, subscription: str, ack_delay: float) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.integration.partition_consumer", "--client", self.client,
            "--url", url, "--topic", topic, "--subscription", subscription, "--name", self.name,
            "--ack-delay", str(ack_delay),
            cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self.reader = asyncio.create_task(self._read())
        await until(lambda: self.ready.is_set() or self.proc.returncode is not None, f"{self.name} ready", 60)
        if not self.ready.is_set():
            raise AssertionError(f"consumer {self.name} exited: {await self._stderr()}")

    async def _stderr(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode(errors="replace")[-4000:]

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line == "READY":
                self.ready.set()
            elif line == "CLOSED":
                self.closed = True
            elif line:
                t, part, key, seq = line.split()
                self.deliveries.append(Delivery(float(t), self.name, int(part), key, int(seq)))

    async def leave(self) -> None:
        """A clean leave: `stop` on stdin; waits for the process to close its consumer and exit."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")
        await self.proc.stdin.drain()
        code = await asyncio.wait_for(self.proc.wait(), 30)
        assert self.reader is not None
        await self.reader
        if code != 0 or not self.closed:
            raise AssertionError(f"consumer {self.name} left with status {code}: {await self._stderr()}")

    async def kill(self) -> None:
        """SIGKILL: a crash. What it printed before is still read."""
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()
        if self.reader is not None:
            await self.reader

    async def reap(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


@dataclass(slots=True)
class Settings:
    partitions: int = 6
    keys: int = 12
    tick: float = 0.025  # the producer sends one message of every key per tick
    ack_delay: float = 0.25  # each consumer acknowledges a message this long after it arrived
    rebalance_delay: float = 0.3
    # Long enough that a graceful handoff ends on the acks, not on the time, even on a loaded machine; the
    # window bounds what an old consumer holds, so how long its acks take (80 msg/s per partition).
    max_handoff: float = 10.0
    max_unacked: int = 64  # per partition and consumer (max_delivered_unacked_msgs_per_flow)


@dataclass(slots=True)
class Run:
    """What one scenario run recorded."""

    settings: Settings
    key_partition: dict[str, int]
    sent: dict[str, int]  # key -> messages sent (seq 0 .. n-1), every one acknowledged by the broker
    deliveries: list[Delivery]
    steps: list[StepRecord]
    handoffs: list[HandoffRecord]
    killed: set[str]
    seconds: float


class Scenario:
    def __init__(
        self, url: str, admin_addr: str, broker_log: Path, topic: str, settings: Settings | None = None
    ) -> None:
        self.url = url
        self.admin_addr = admin_addr
        self.broker_log = broker_log
        self.topic = topic
        self.subscription = "handoff"
        self.settings = settings or Settings()
        self.key_partition = choose_keys(self.settings.keys, self.settings.partitions)
        self.sent = dict.fromkeys(self.key_partition, 0)
        self.deliveries: list[Delivery] = []
        self.consumers: dict[str, ConsumerProcess] = {}
        self.live: set[str] = set()
        self.killed: set[str] = set()
        self.steps: list[StepRecord] = []
        self._stop_producing = asyncio.Event()
        self._go = asyncio.Event()
        self.producer_ready = asyncio.Event()

    # -- the broker's view ---------------------------------------------------------------------------------
    async def partition_map(self) -> tuple[dict[int, str], bool]:
        """(partition -> consumer, whether a handoff is in progress) of the subscription."""
        async with grpc.aio.insecure_channel(self.admin_addr) as channel:
            reply = await ipb_grpc.IsterAdminStub(channel).ListPartitionAssignments(
                ipb.ListPartitionAssignmentsRequest(topic=self.topic), timeout=10
            )
        rows = [r for r in reply.assignments if r.subscription == self.subscription]
        return {r.partition: r.consumer for r in rows}, any(r.handing_off_to for r in rows)

    async def configure(self) -> None:
        s = self.settings
        config = apb.SubscriptionDispatchConfig(
            max_unacked_messages=s.max_unacked,
            rebalance_delay_seconds=s.rebalance_delay,
            max_handoff_seconds=s.max_handoff,
        )
        async with grpc.aio.insecure_channel(self.admin_addr) as channel:
            reply = await apb_grpc.TopicAdminStub(channel).SetSubscriptionDispatchConfig(
                apb.SetSubscriptionDispatchConfigRequest(
                    topic=self.topic, subscription=self.subscription, dispatch_config=config
                ),
                timeout=10,
            )
        assert reply.success

    # -- the producer --------------------------------------------------------------------------------------
    async def produce(self, client: Client) -> None:
        producer = await client.producer(self.topic, partitions=self.settings.partitions, reliable=True)
        self.producer_ready.set()
        await self._go.wait()
        next_at = time.monotonic()
        while not self._stop_producing.is_set():
            batch: list[tuple[bytes, dict[str, str] | None, str | None]] = [
                (f"{k}:{n}".encode(), None, k) for k, n in self.sent.items()
            ]
            await producer.send_each(batch)
            for k in self.sent:
                self.sent[k] += 1
            next_at += self.settings.tick
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))  # the send rate
        await producer.close()

    # -- steps ---------------------------------------------------------------------------------------------
    async def settle(self, record: StepRecord) -> None:
        """Wait until the broker's map holds exactly the live consumers with no handoff in progress, then
        until every partition delivered a few messages since; record who received them."""
        state: dict[str, Any] = {}

        async def settled() -> bool:
            mapping, handing_off = await self.partition_map()
            state["map"] = mapping
            return (
                not handing_off
                and len(mapping) == self.settings.partitions
                and set(mapping.values()) == self.live
            )

        await until(settled, lambda: f"the partition map to settle on {sorted(self.live)}: {state}", 60)
        record.settled = time.time()
        record.after = dict(state["map"])
        mark = len(self.deliveries)

        def since() -> dict[int, list[Delivery]]:
            out: dict[int, list[Delivery]] = {}
            for d in self.deliveries[mark:]:
                if d.t > record.settled:
                    out.setdefault(d.partition, []).append(d)
            return out

        await until(
            lambda: all(len(since().get(p, [])) >= 3 for p in range(self.settings.partitions)),
            lambda: f"every partition delivering after {record.label}: {sorted(since())}",
            60,
        )
        record.seen = {p: {d.consumer for d in ds} for p, ds in since().items()}
        again, handing_off = await self.partition_map()
        if again != record.after or handing_off:
            raise AssertionError(f"the map moved while nothing changed: {record.after} -> {again}")

    async def step(self, action: str, name: str, client: str) -> None:
        before = self.steps[-1].after if self.steps else {}
        record = StepRecord(action, name, client, time.time(), before=dict(before))
        if action == "join":
            cons = self.consumers[name] = ConsumerProcess(name, client, self.deliveries)
            await cons.start(self.url, self.topic, self.subscription, self.settings.ack_delay)
            self.live.add(name)
        elif action == "leave":
            self.live.discard(name)
            await self.consumers[name].leave()
        elif action == "kill":
            self.live.discard(name)
            self.killed.add(name)
            await self.consumers[name].kill()
        else:
            raise ValueError(action)
        self._go.set()  # the producer starts once the first consumer holds the subscription
        await self.settle(record)
        self.steps.append(record)

    async def run(self, steps: list[Step] | None = None) -> Run:
        started = time.monotonic()
        async with Client(self.url) as client:
            producing = asyncio.create_task(self.produce(client))
            try:
                await until(lambda: self.producer_ready.is_set() or producing.done(), "the producer", 30)
                if producing.done():
                    producing.result()
                await self.configure()
                plan = steps or STEPS
                assert plan[0][0] == "join"  # the subscription starts at the latest offset: a consumer first
                for s in plan:
                    await self.step(*s)
                self._stop_producing.set()
                await producing

                def missing() -> int:
                    got = {(d.key, d.seq) for d in self.deliveries}
                    return sum(1 for k, n in self.sent.items() for i in range(n) if (k, i) not in got)

                await until(lambda: missing() == 0, lambda: f"{missing()} messages still undelivered", 60)
                for name in sorted(self.live):
                    await self.consumers[name].leave()
            finally:
                self._stop_producing.set()
                for cons in self.consumers.values():
                    await cons.reap()
                if not producing.done():
                    producing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await producing
        handoffs = parse_handoffs(self.broker_log.read_text(errors="replace"), self.topic, self.subscription)
        return Run(
            self.settings,
            self.key_partition,
            dict(self.sent),
            sorted(self.deliveries, key=lambda d: d.t),
            self.steps,
            handoffs,
            set(self.killed),
            time.monotonic() - started,
        )


# -- the figures ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Split:
    key: str
    partition: int
    source: str
    target: str
    last_seq: int  # the last message the source received before the split
    first_seq: int  # the first message the target received (<= last_seq: redelivered duplicates)
    at: float
    explained: bool  # a handoff of the key's partition from source to target


@dataclass(slots=True)
class StepFigures:
    label: str
    handoffs: list[HandoffRecord]
    counts: dict[str, int]
    spread: int
    seen_matches_map: bool
    moved: list[int]
    max_pause: float  # the broker's, longest of the step's handoffs
    moving_gap: float  # the moving partitions' largest delivery gap around the switch, as received
    still_gap: float  # the largest delivery gap of a partition that did not move, during the handoffs
    still_deliveries: int  # deliveries of partitions that did not move while the handoffs were in progress
    splits: int
    redelivered: int


@dataclass(slots=True)
class Figures:
    sent: int
    delivered: int
    missing: list[tuple[str, int]]
    duplicates: int
    duplicate_first_receivers: dict[str, int]
    order_violations: list[tuple[str, str]]  # (key, what)
    splits: list[Split]
    steps: list[StepFigures]
    unexplained_handoffs: list[HandoffRecord]  # handoffs of a partition whose owner did not change
    baseline_gap_p50: float  # a partition's delivery gaps away from handoffs: median
    baseline_gap_p99: float  # ... and 99th percentile
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "delivered": self.delivered,
            "missing": len(self.missing),
            "duplicates": self.duplicates,
            "duplicate_first_receivers": self.duplicate_first_receivers,
            "order_violations": len(self.order_violations),
            "splits": len(self.splits),
            "unexplained_splits": sum(not s.explained for s in self.splits),
            "baseline_gap_p50_ms": round(self.baseline_gap_p50 * 1000, 1),
            "baseline_gap_p99_ms": round(self.baseline_gap_p99 * 1000, 1),
            "seconds": round(self.seconds, 1),
            "steps": [
                {
                    "step": s.label,
                    "partitions_per_consumer": s.counts,
                    "spread": s.spread,
                    "moved": s.moved,
                    "handoffs": len(s.handoffs),
                    "max_pause_ms": round(s.max_pause * 1000, 1),
                    "moving_gap_ms": round(s.moving_gap * 1000, 1),
                    "still_gap_ms": round(s.still_gap * 1000, 1),
                    "still_deliveries": s.still_deliveries,
                    "splits": s.splits,
                    "redelivered": s.redelivered,
                }
                for s in self.steps
            ],
        }


def _gap_over(times: list[float], start: float, end: float) -> float:
    """The largest interval between consecutive `times` (sorted) that overlaps [start, end]."""
    gap = 0.0
    for a, b in itertools.pairwise(times):
        if b >= start and a <= end:
            gap = max(gap, b - a)
    return gap


def _order_violations(deliveries: list[Delivery], by_key: dict[str, list[Delivery]]) -> list[tuple[str, str]]:
    """The first delivery of each key's messages comes in sequence order, and no consumer receives a key's
    messages out of order (its own arrival order)."""
    violations = []
    for key, ds in by_key.items():
        expect = 0
        for d in ds:
            if d.seq >= expect:
                if d.seq != expect:
                    violations.append((key, f"{d.seq} reached {d.consumer} before {expect}"))
                expect = d.seq + 1
    last_of: dict[tuple[str, str], int] = {}
    for d in deliveries:
        prev = last_of.get((d.consumer, d.key))
        if prev is not None and d.seq <= prev:
            violations.append((d.key, f"{d.consumer} received {d.seq} after {prev}"))
        last_of[(d.consumer, d.key)] = d.seq
    return violations


def _splits(run: Run, by_key: dict[str, list[Delivery]]) -> list[Split]:
    handoff_pairs = {(h.partition, h.source, h.target) for h in run.handoffs}
    splits = []
    for key, ds in by_key.items():
        for a, b in itertools.pairwise(ds):
            if a.consumer != b.consumer:
                p = run.key_partition[key]
                explained = (p, a.consumer, b.consumer) in handoff_pairs
                splits.append(Split(key, p, a.consumer, b.consumer, a.seq, b.seq, b.t, explained))
    return splits


def _step_figures(
    st: StepRecord,
    end: float,
    run: Run,
    by_partition: dict[int, list[Delivery]],
    splits: list[Split],
) -> tuple[StepFigures, tuple[float, float] | None]:
    """One step's figures, and the window its handoffs were in progress (None: no handoff)."""
    times = {p: [d.t for d in ds] for p, ds in by_partition.items()}
    hs = [h for h in run.handoffs if st.started <= h.at < end]
    moved = sorted(p for p in st.after if st.before.get(p, st.after[p]) != st.after[p])
    still = [p for p in st.after if p not in moved]
    window = None
    still_gap, still_n = 0.0, 0
    if hs:
        window = start, stop = min(h.paused_at for h in hs), max(h.at for h in hs)
        still_gap = max((_gap_over(times.get(p, []), start, stop) for p in still), default=0.0)
        still_n = sum(1 for p in still for t in times.get(p, []) if start <= t <= stop)
    moving_gap = 0.0
    for h in hs:
        ds = by_partition.get(h.partition, [])
        to_target = [j for j, d in enumerate(ds) if d.consumer == h.target and d.t >= h.paused_at - 0.5]
        if to_target and to_target[0] > 0:
            j = to_target[0]
            moving_gap = max(moving_gap, ds[j].t - ds[j - 1].t)
    fig = StepFigures(
        label=st.label,
        handoffs=hs,
        counts=st.counts(),
        spread=st.spread(),
        seen_matches_map=all(st.seen.get(p) == {c} for p, c in st.after.items()),
        moved=moved,
        max_pause=max((h.paused for h in hs), default=0.0),
        moving_gap=moving_gap,
        still_gap=still_gap,
        still_deliveries=still_n,
        splits=sum(1 for s in splits if st.started <= s.at < end),
        redelivered=sum(h.redelivered for h in hs),
    )
    return fig, window


def analyse(run: Run) -> Figures:
    deliveries = run.deliveries  # sorted by arrival time
    by_key: dict[str, list[Delivery]] = {}
    by_partition: dict[int, list[Delivery]] = {}
    for d in deliveries:
        by_key.setdefault(d.key, []).append(d)
        by_partition.setdefault(d.partition, []).append(d)
    counts = Counter((d.key, d.seq) for d in deliveries)
    missing = [(k, i) for k, n in run.sent.items() for i in range(n) if (k, i) not in counts]
    first: dict[tuple[str, int], Delivery] = {}
    for d in deliveries:
        first.setdefault((d.key, d.seq), d)
    dup_first = Counter(first[m].consumer for m, c in counts.items() if c > 1 for _ in range(c - 1))
    splits = _splits(run, by_key)

    steps = []
    windows: list[tuple[float, float]] = []
    for i, st in enumerate(run.steps):
        end = run.steps[i + 1].started if i + 1 < len(run.steps) else float("inf")
        fig, window = _step_figures(st, end, run, by_partition, splits)
        steps.append(fig)
        if window is not None:
            windows.append(window)
    moved_in = {id(s): set(s.moved) for s in steps}
    unexplained = [h for s in steps for h in s.handoffs if h.partition not in moved_in[id(s)]]

    # Baseline: a partition's delivery gaps away from every handoff window (and 0.1 s either side).
    outside = [
        b - a
        for ds in by_partition.values()
        for a, b in itertools.pairwise([d.t for d in ds])
        if all(b < s - 0.1 or a > e + 0.1 for s, e in windows)
    ]
    return Figures(
        sent=sum(run.sent.values()),
        delivered=len(deliveries),
        missing=missing,
        duplicates=sum(c - 1 for c in counts.values()),
        duplicate_first_receivers=dict(dup_first),
        order_violations=_order_violations(deliveries, by_key),
        splits=splits,
        steps=steps,
        unexplained_handoffs=unexplained,
        baseline_gap_p50=statistics.median(outside) if outside else 0.0,
        baseline_gap_p99=statistics.quantiles(outside, n=100)[98] if len(outside) > 1 else 0.0,
        seconds=run.seconds,
    )


def report(fig: Figures) -> str:
    lines = [
        f"sent {fig.sent}, delivered {fig.delivered} ({fig.duplicates} duplicates, first received by "
        f"{fig.duplicate_first_receivers or 'nobody'}), missing {len(fig.missing)}, "
        f"order violations {len(fig.order_violations)}, splits {len(fig.splits)} "
        f"({sum(not s.explained for s in fig.splits)} not at a handoff of the key's partition), "
        f"{fig.seconds:.1f} s",
        f"a partition's delivery gap away from handoffs: p50 {fig.baseline_gap_p50 * 1000:.1f} ms, "
        f"p99 {fig.baseline_gap_p99 * 1000:.1f} ms",
        f"{'step':<20} {'partitions per consumer':<28} {'sprd':>4} {'moved':>5} {'pause ms':>9} "
        f"{'moving gap':>10} {'still gap':>9} {'still msgs':>10} {'splits':>6} {'redeliv':>7}",
    ]
    for s in fig.steps:
        counts = " ".join(f"{c}:{n}" for c, n in sorted(s.counts.items()))
        lines.append(
            f"{s.label:<20} {counts:<28} {s.spread:>4} {len(s.moved):>5} {s.max_pause * 1000:>9.1f} "
            f"{s.moving_gap * 1000:>10.1f} {s.still_gap * 1000:>9.1f} {s.still_deliveries:>10} "
            f"{s.splits:>6} {s.redelivered:>7}"
        )
    return "\n".join(lines)
