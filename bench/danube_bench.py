"""Broker benchmark through the official danube-client, side by side with NATS JetStream (sync_always).

usage: python bench/danube_bench.py [--fsync always|interval] [--n-seq 3000] [--n-pipe 20000]
                                    [--nats-script ../shared/peers/nats_bench.py] [--no-nats] [--json]

Phases (100-byte payloads, reliable topic, one broker process on loopback):
  seq_publish   one awaited send at a time; msgs/s and send round trip p50/p99
  pipe_publish  64 sends in flight (64 tasks); msgs/s
  consume_ack   a subscription reads back the pipelined messages and acks each one (acks 64 in flight)
  latency       a publisher process at 1,000 msg/s for 10 s, a consumer in another process;
                publish -> receive latency from a CLOCK_MONOTONIC stamp in the payload
Not a test: numbers depend on the machine and its load. See docs/benchmarks.md for the method.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import danube
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.integration.harness import BrokerProcess, _port_open, client, consumer, free_port, producer  # noqa: E402

PAYLOAD = b"p" * 100


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))
    return s[k]


async def seq_publish(url: str, topic: str, n: int) -> dict[str, float]:
    c = await client(url)
    p = await producer(c, topic, "seq", reliable=True)
    for _ in range(50):
        await p.send(PAYLOAD)
    rtts = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        await p.send(PAYLOAD)
        rtts.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return {"msgs_per_s": n / wall, "rtt_p50_us": pct(rtts, 50) * 1e6, "rtt_p99_us": pct(rtts, 99) * 1e6}


async def pipe_publish_and_consume(url: str, topic: str, n: int, inflight: int = 64) -> dict[str, float]:
    c = await client(url)
    p = await producer(c, topic, "pipe", reliable=True)
    cons, q = await consumer(c, topic, "bench-c", "bench-sub", danube.SubType.EXCLUSIVE)
    await cons.close()  # the subscription exists from offset 0; read it back after publishing
    pub_rate = await publish_pipelined(p, n, inflight)

    cons, q = await consumer(c, topic, "bench-c", "bench-sub", danube.SubType.EXCLUSIVE)
    sem = asyncio.Semaphore(inflight)
    pending: set[asyncio.Task[None]] = set()

    async def ack(m: object) -> None:
        try:
            await cons.ack(m)  # type: ignore[arg-type]
        finally:
            sem.release()

    t0 = time.perf_counter()
    for _ in range(n):
        m = await asyncio.wait_for(q.get(), 30)
        await sem.acquire()
        task = asyncio.create_task(ack(m))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    con_wall = time.perf_counter() - t0
    await cons.close()
    return {"pipe_msgs_per_s": pub_rate, "consume_msgs_per_s": n / con_wall}


def _latency_consumer(url: str, topic: str, n: int, ready: mp.Queue, out: mp.Queue) -> None:  # type: ignore[type-arg]
    async def run() -> None:
        c = await client(url)
        cons, q = await consumer(c, topic, "lat-c", "lat-sub", danube.SubType.EXCLUSIVE)
        ready.put(True)
        lats = []
        acks: set[asyncio.Task[None]] = set()
        for _ in range(n):
            m = await asyncio.wait_for(q.get(), 30)
            lats.append(time.monotonic_ns() - int(m.payload[:20]))
            acks.add(asyncio.create_task(cons.ack(m)))
        await asyncio.gather(*acks)
        out.put(lats)

    uvloop.run(run())


async def latency(url: str, topic: str, rate: int = 1000, seconds: int = 10) -> dict[str, float]:
    n = rate * seconds
    c = await client(url)
    p = await producer(c, topic, "lat-p", reliable=True)
    ctx = mp.get_context("spawn")
    ready: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_latency_consumer, args=(url, topic, n, ready, out))
    proc.start()
    await asyncio.get_running_loop().run_in_executor(None, ready.get, True, 60)
    await asyncio.sleep(0.5)
    start = time.perf_counter()
    for i in range(n):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await p.send(str(time.monotonic_ns()).zfill(20).encode() + PAYLOAD[20:])
    lats = await asyncio.get_running_loop().run_in_executor(None, out.get, True, 60)
    proc.join(10)
    warm = [x / 1000 for x in lats[100:]]
    return {
        "e2e_p50_us": pct(warm, 50),
        "e2e_p99_us": pct(warm, 99),
        "e2e_p999_us": pct(warm, 99.9),
        "received": len(lats),
    }


def run_noop(n_seq: int, n_pipe: int) -> dict[str, float]:
    """Publish through the same client to a server that does nothing: the protocol's own ceiling here."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "noop_server.py"), str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _port_open(port):
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        out = uvloop.run(seq_publish(url, "/default/noop_seq", n_seq))
        out["seq_msgs_per_s"] = out.pop("msgs_per_s")
        out["seq_rtt_p50_us"] = out.pop("rtt_p50_us")
        out["seq_rtt_p99_us"] = out.pop("rtt_p99_us")
        out["pipe_msgs_per_s"] = uvloop.run(pipe_publish_only(url, "/default/noop_pipe", n_pipe))
        return out
    finally:
        proc.kill()
        proc.wait(10)


async def pipe_publish_only(url: str, topic: str, n: int, inflight: int = 64) -> float:
    c = await client(url)
    return await publish_pipelined(await producer(c, topic, "pipe", reliable=True), n, inflight)


async def publish_pipelined(p: danube.Producer, n: int, inflight: int) -> float:
    """Send n messages from `inflight` concurrent tasks; returns messages per second."""
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await p.send(PAYLOAD)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return n / (time.perf_counter() - t0)


def run_nats(script: Path, n_seq: int, n_pipe: int) -> dict[str, float]:
    results = Path(tempfile.mkdtemp(prefix="nats-results-"))
    env = {**os.environ, "ANCHORS_RESULTS": str(results)}
    cmd = [
        sys.executable,
        str(script),
        "--configs",
        "sync_always",
        "--runs",
        "1",
        "--tests",
        "seq_publish,gather_publish,pull_consume,latency_push",
        "--n-seq",
        str(n_seq),
        "--n-pipe",
        str(n_pipe),
        "--base",
        str(results / "store"),
    ]
    subprocess.run(cmd, cwd=script.parent, env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
    data = json.loads((results / "nats.json").read_text())["configs"]["sync_always"]
    shutil.rmtree(results, ignore_errors=True)
    thr = data["throughput"]
    lat = data["latency_push"]
    med = lambda d, k: d[k]["median"]  # noqa: E731
    return {
        "seq_msgs_per_s": med(thr, "seq_publish.msgs_per_s"),
        "seq_rtt_p50_us": med(thr, "seq_publish.ack_rtt_p50_us"),
        "seq_rtt_p99_us": med(thr, "seq_publish.ack_rtt_p99_us"),
        "pipe_msgs_per_s": med(thr, "gather_publish.msgs_per_s"),
        "consume_msgs_per_s": med(thr, "pull_consume.msgs_per_s"),
        "e2e_p50_us": med(lat, "e2e.p50_us"),
        "e2e_p99_us": med(lat, "e2e.p99_us"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsync", default="always", choices=["always", "interval"])
    ap.add_argument("--n-seq", type=int, default=3000)
    ap.add_argument("--n-pipe", type=int, default=20000)
    ap.add_argument("--nats-script", type=Path, default=ROOT.parent / "shared" / "peers" / "nats_bench.py")
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ister-bench-"))
    broker = BrokerProcess(tmp / "data", "--fsync", args.fsync, "--log-level", "warning")
    broker.start()
    try:
        ister: dict[str, float] = {}
        ister.update(uvloop.run(seq_publish(broker.url, "/default/bench_seq", args.n_seq)))
        ister["seq_msgs_per_s"] = ister.pop("msgs_per_s")
        ister["seq_rtt_p50_us"] = ister.pop("rtt_p50_us")
        ister["seq_rtt_p99_us"] = ister.pop("rtt_p99_us")
        ister.update(uvloop.run(pipe_publish_and_consume(broker.url, "/default/bench_pipe", args.n_pipe)))
        ister.update(uvloop.run(latency(broker.url, "/default/bench_lat")))
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    noop = run_noop(args.n_seq, args.n_pipe)
    nats = None
    if not args.no_nats and args.nats_script.exists():
        nats = run_nats(args.nats_script, args.n_seq, args.n_pipe)
    result = {
        "fsync": args.fsync,
        "ister": ister,
        "noop_grpc_ceiling": noop,
        "nats_sync_always": nats,
        "loadavg": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rows = [
        ("durable publish, sequential (msg/s)", "seq_msgs_per_s"),
        ("  send round trip p50 (µs)", "seq_rtt_p50_us"),
        ("  send round trip p99 (µs)", "seq_rtt_p99_us"),
        ("durable publish, 64 in flight (msg/s)", "pipe_msgs_per_s"),
        ("consume + ack (msg/s)", "consume_msgs_per_s"),
        ("e2e latency p50 at 1k msg/s (µs)", "e2e_p50_us"),
        ("e2e latency p99 at 1k msg/s (µs)", "e2e_p99_us"),
    ]
    print(f"{'metric':42} {'ister':>10} {'no-op gRPC':>11} {'jetstream':>10} {'ister/js':>9}")
    for label, key in rows:
        a = ister.get(key, float("nan"))
        c = noop.get(key, float("nan"))
        b = nats.get(key, float("nan")) if nats else float("nan")
        ratio = a / b if nats and b else float("nan")
        print(f"{label:42} {a:10,.0f} {c:11,.0f} {b:10,.0f} {ratio:9.2f}")
    print(f"loadavg at end: {result['loadavg']}")


if __name__ == "__main__":
    main()
