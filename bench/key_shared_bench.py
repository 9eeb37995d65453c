"""Key-Shared consume throughput: one hot key, 1,000 keys, and Shared, for both clients (issue 36 item 3).

usage: python bench/key_shared_bench.py [--messages 200000] [--danube-messages 5000] [--window 1000]
                                        [--cases hot,keys,shared] [--no-batch] [--no-danube] [--json]

Every (client, case) gets a fresh `ister broker` (fsync always) and one reliable topic. A subscription of
the case's type is created first (a consumer opens it and leaves), then a backlog of 100-byte messages is
published, every one with a routing key of 4 characters: "k000" on all of them for `hot`, "k000".."k999"
in turn for `keys` and for `shared` (Shared ignores keys; they are there so the three topics hold the same
records). Then two consumers of the subscription, each on its own client connection, in one process,
consume the backlog and acknowledge every message. The clock runs from just before the two consumers
attach until every message is received and acknowledged:

  batch API    (`ister.client`) each consumer loops `receive_batch(window)` + `ack_batch()`; the consumers
               open the subscription with `--window` (the subscription's window of unacknowledged
               messages, shared by its consumers); the clock stops once both have closed (last acks sent)
  danube-client (official client, its own process: it registers the `danube` proto package, as
               `ister.wire.gen` does) each consumer acks every message with up to 64 acks in flight; the
               subscription keeps the broker's default window (10); the clock stops when every ack has
               been answered

With one hot key every message goes to ONE consumer (the key's; the consumer that attaches first may take
the key's first window before the key settles on its owner), so `hot` is one consumer's rate against two
consumers' in `shared`; the output says how many each consumer got. Each case also reports the broker's
CPU per message, the consuming process's CPU per message, order checks (a key's messages out of offset
order at a consumer; keys seen at both consumers, i.e. that moved when the second one attached;
duplicates) and what a fresh consumer finds unacked after the run (batch API). Target (issue 36): `hot`
at ≥ half of `shared`'s rate for the same client.

Not a test: timings depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])

import uvloop  # noqa: E402

from ister.benchmark.broker import BenchBroker  # noqa: E402
from ister.benchmark.stats import PAYLOAD, host_cpu_share, host_cpu_ticks, process_cpu_s  # noqa: E402

CASES = ("hot", "keys", "shared")
SUB_TYPE = {"hot": "key_shared", "keys": "key_shared", "shared": "shared"}
N_KEYS = 1000
DANUBE_IN_FLIGHT = 64  # publishes in flight, and acks in flight per consumer (as danube_cases)
STALL_S = 30.0  # no message for this long: the case fails
CONSUMERS = ("ks-c1", "ks-c2")


def keys_for(case: str, n: int) -> list[str]:
    if case == "hot":
        return ["k000"] * n
    return [f"k{i % N_KEYS:03d}" for i in range(n)]


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Tally:
    """What one consumer received: count, per key the last offset (order check), offsets seen."""

    def __init__(self) -> None:
        self.count = 0
        self.last: dict[str | None, int] = {}
        self.out_of_order = 0

    def add(self, offset: int, key: str | None) -> None:
        self.count += 1
        last = self.last.get(key, -1)
        if offset < last:
            self.out_of_order += 1
        self.last[key] = offset


def summary(tallies: list[Tally], expected: int, seen: set[int] | None, wall: float) -> dict[str, Any]:
    got = sum(t.count for t in tallies)
    keys_both = len(set(tallies[0].last).intersection(tallies[1].last)) if len(tallies) == 2 else 0
    out: dict[str, Any] = {
        "messages": expected,
        "received": got,
        "seconds": wall,
        "msgs_per_s": expected / wall if wall > 0 else 0.0,
        "per_consumer": [t.count for t in tallies],
        "keys_per_consumer": [len(t.last) for t in tallies],
        "keys_at_both": keys_both,
        "out_of_order": sum(t.out_of_order for t in tallies),
    }
    if seen is not None:
        out["duplicates"] = got - len(seen)
    return out


async def _watch(done: asyncio.Event, progress: list[int], what: str) -> None:
    """Wait for `done`; RuntimeError when `progress[0]` has not moved for STALL_S seconds."""
    last = -1
    while not done.is_set():
        if progress[0] == last:
            raise RuntimeError(f"{what}: {progress[0]} messages, then nothing for {STALL_S:.0f} s")
        last = progress[0]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), STALL_S)


# -- the batch API ----------------------------------------------------------------------------------------
async def batch_case(url: str, case: str, n: int, window: int, broker_pid: int) -> dict[str, Any]:
    from ister.client import Client

    topic, sub = f"/default/ks_{case}", f"ks-{case}"
    sub_type = SUB_TYPE[case]
    async with Client(url) as client:
        producer = await client.producer(topic, "ks-publisher", reliable=True)
        first = await client.consumer(topic, sub, type=sub_type, name=CONSUMERS[0], window=window)
        await first.close()  # the subscription stays, its cursor at offset 0
        keys = keys_for(case, n)
        t0 = time.perf_counter()
        for i in range(0, n, 8192):
            await producer.send_each([(PAYLOAD, None, key) for key in keys[i : i + 8192]])
        publish_s = time.perf_counter() - t0
        await producer.close()

    clients = [Client(url) for _ in CONSUMERS]
    for c in clients:
        await c.connect()
    tallies = [Tally() for _ in CONSUMERS]
    seen: set[int] = set()
    progress = [0]
    done = asyncio.Event()

    async def work(consumer: Any, tally: Tally) -> None:
        while True:
            batch = await consumer.receive_batch(window, timeout=None)
            for m in batch:
                tally.add(m.offset, m.key)
                seen.add(m.offset)
            await consumer.ack_batch(batch)
            progress[0] += len(batch)
            if progress[0] >= n:
                done.set()

    try:
        cpu0, mine0, ticks0 = process_cpu_s(broker_pid), own_cpu_s(), host_cpu_ticks()
        start = time.perf_counter()
        consumers = await asyncio.gather(
            *(
                c.consumer(topic, sub, type=sub_type, name=name, window=window)
                for c, name in zip(clients, CONSUMERS, strict=True)
            )
        )
        workers = [asyncio.create_task(work(c, t)) for c, t in zip(consumers, tallies, strict=True)]
        try:
            await _watch(done, progress, f"batch API {case}")
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in consumers))  # sends the acks still pending
        wall = time.perf_counter() - start
        cpu, mine, ticks1 = process_cpu_s(broker_pid) - cpu0, own_cpu_s() - mine0, host_cpu_ticks()
        check = await clients[0].consumer(topic, sub, type=sub_type, name="ks-check", window=window)
        left = await check.receive_batch(window, timeout=1.0)
        await check.close()
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    out = summary(tallies, n, seen, wall)
    out.update(
        window=window,
        publish_s=publish_s,
        unacked_after=len(left),
        broker_cpu_us_per_msg=cpu / n * 1e6,
        client_cpu_us_per_msg=mine / n * 1e6,
        host=host_cpu_share(ticks0, ticks1),
    )
    return out


# -- danube-client (its own process) ----------------------------------------------------------------------
async def danube_case(url: str, case: str, n: int, broker_pid: int) -> dict[str, Any]:
    import danube  # type: ignore[import-untyped]

    sub_type = {"key_shared": danube.SubType.KEY_SHARED, "shared": danube.SubType.SHARED}[SUB_TYPE[case]]
    topic, sub = f"/default/ksd_{case}", f"ksd-{case}"

    async def new_client() -> Any:
        return await danube.DanubeClientBuilder().service_url(url).build()

    async def new_consumer(c: Any, name: str) -> Any:
        cons = (
            c.new_consumer()
            .with_topic(topic)
            .with_consumer_name(name)
            .with_subscription(sub)
            .with_subscription_type(sub_type)
            .build()
        )
        await cons.subscribe()
        return cons

    client = await new_client()
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name("ksd-publisher")
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    first = await new_consumer(client, CONSUMERS[0])
    await first.receive()  # attach once: the subscription exists from offset 0
    await first.close()
    keys = keys_for(case, n)
    next_i = 0

    async def publisher() -> None:
        nonlocal next_i
        while next_i < n:
            key = keys[next_i]
            next_i += 1
            await producer.send_with_key(PAYLOAD, None, key)

    t0 = time.perf_counter()
    await asyncio.gather(*(publisher() for _ in range(DANUBE_IN_FLIGHT)))
    publish_s = time.perf_counter() - t0

    clients = [await new_client() for _ in CONSUMERS]
    tallies = [Tally() for _ in CONSUMERS]
    seen: set[int] = set()
    progress = [0]
    done = asyncio.Event()
    acks: set[asyncio.Task[None]] = set()

    async def work(cons: Any, queue: asyncio.Queue[Any], tally: Tally) -> None:
        room = asyncio.Semaphore(DANUBE_IN_FLIGHT)

        async def ack(m: Any) -> None:
            try:
                await cons.ack(m)
            finally:
                room.release()
            progress[0] += 1
            if progress[0] >= n:
                done.set()

        while True:
            m = await queue.get()
            offset = m.msg_id.topic_offset
            tally.add(offset, m.routing_key if m.HasField("routing_key") else None)
            seen.add(offset)
            await room.acquire()
            task = asyncio.create_task(ack(m))
            acks.add(task)
            task.add_done_callback(acks.discard)

    cpu0, mine0, ticks0 = process_cpu_s(broker_pid), own_cpu_s(), host_cpu_ticks()
    start = time.perf_counter()
    consumers = await asyncio.gather(
        *(new_consumer(c, name) for c, name in zip(clients, CONSUMERS, strict=True))
    )
    queues = await asyncio.gather(*(c.receive() for c in consumers))
    workers = [asyncio.create_task(work(c, q, t)) for c, q, t in zip(consumers, queues, tallies, strict=True)]
    try:
        await _watch(done, progress, f"danube-client {case}")
        await asyncio.gather(*acks)
        wall = time.perf_counter() - start
        cpu, mine, ticks1 = process_cpu_s(broker_pid) - cpu0, own_cpu_s() - mine0, host_cpu_ticks()
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
    out = summary(tallies, n, seen, wall)
    out.update(
        window="broker default",
        publish_s=publish_s,
        broker_cpu_us_per_msg=cpu / n * 1e6,
        client_cpu_us_per_msg=mine / n * 1e6,
        host=host_cpu_share(ticks0, ticks1),
    )
    return out


def run_danube(url: str, case: str, n: int, broker_pid: int) -> dict[str, Any]:
    """`danube_case` in a child process (this script with --danube-worker); its JSON result."""
    cmd = [sys.executable, __file__, "--danube-worker", url, case, str(n), str(broker_pid)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"danube-client {case} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the run and its table --------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    cases = [c for c in args.cases.split(",") if c]
    clients = [c for c, on in (("batch API", not args.no_batch), ("danube-client", not args.no_danube)) if on]
    out: dict[str, Any] = {
        "load_before": os.getloadavg(),
        "messages": {"batch API": args.messages, "danube-client": args.danube_messages},
        "results": [],
    }
    for client in clients:
        for case in cases:
            n = args.messages if client == "batch API" else args.danube_messages
            print(f"key_shared_bench: {client} {case}: {n:,} messages", file=sys.stderr, flush=True)
            with BenchBroker(fsync=args.fsync) as broker:
                if client == "batch API":
                    r = uvloop.run(batch_case(broker.url, case, n, args.window, broker.pid))
                else:
                    r = run_danube(broker.url, case, n, broker.pid)
            r.update(case=case, client=client)
            out["results"].append(r)
    for r in out["results"]:
        shared = next(
            (s for s in out["results"] if s["client"] == r["client"] and s["case"] == "shared"), None
        )
        r["ratio_to_shared"] = r["msgs_per_s"] / shared["msgs_per_s"] if shared else None
    out["load_after"] = os.getloadavg()
    return out


LABEL = {"hot": "Key-Shared, 1 hot key", "keys": f"Key-Shared, {N_KEYS:,} keys", "shared": "Shared"}


def render(out: dict[str, Any]) -> None:
    print(
        f"{'case':<24} {'client':<14} {'msg/s':>9} {'÷ Shared':>8}  {'per consumer (c1 / c2)':<24}"
        f" {'broker µs/msg':>13} {'client µs/msg':>13}  checks"
    )
    for r in out["results"]:
        ratio = f"{r['ratio_to_shared']:.2f}" if r["ratio_to_shared"] is not None else "-"
        split = " / ".join(f"{c:,}" for c in r["per_consumer"])
        checks = f"order {r['out_of_order']}, dup {r.get('duplicates', 0)}, keys at both {r['keys_at_both']}"
        if "unacked_after" in r:
            checks += f", unacked {r['unacked_after']}"
        print(
            f"{LABEL[r['case']]:<24} {r['client']:<14} {r['msgs_per_s']:>9,.0f} {ratio:>8}  {split:<24}"
            f" {r['broker_cpu_us_per_msg']:>13.1f} {r['client_cpu_us_per_msg']:>13.1f}  {checks}"
        )
    load0, load1 = (", ".join(f"{x:.2f}" for x in out[k]) for k in ("load_before", "load_after"))
    print(f"load average before {load0}; after {load1}")
    for r in out["results"]:
        if r["case"] != "hot":
            continue
        counts = r["per_consumer"]
        top = max(range(len(counts)), key=counts.__getitem__)
        who = f"c{top + 1} got {counts[top]:,} of {r['received']:,}"
        if counts[1 - top]:
            who += f", c{2 - top} {counts[1 - top]:,} (before the key settled at c{top + 1})"
        ratio = r["ratio_to_shared"]
        target = "-" if ratio is None else ("meets" if ratio >= 0.5 else "misses")
        print(
            f"{r['client']}, one hot key: {who}, so this is one consumer's rate against two consumers' in"
            f" Shared; target (at least half of Shared's rate): {target}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--danube-worker":
        url, case, n, pid = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(uvloop.run(danube_case(url, case, n, pid))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000, help="backlog for the batch API")
    ap.add_argument("--danube-messages", type=int, default=5_000, help="backlog for danube-client")
    ap.add_argument("--window", type=int, default=1000, help="batch API: the subscription's window")
    ap.add_argument("--cases", default=",".join(CASES), help="a subset of hot,keys,shared")
    ap.add_argument("--fsync", default="always", choices=["always", "interval"])
    ap.add_argument("--no-batch", action="store_true")
    ap.add_argument("--no-danube", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not set(args.cases.split(",")) <= set(CASES):
        ap.error(f"--cases takes a subset of {','.join(CASES)}")
    out = run(args)
    if args.json:
        print(json.dumps(out))
    else:
        render(out)


if __name__ == "__main__":
    main()
