"""The danube-client cases: the official Danube Python client (PyPI danube-client) against `ister broker`.

Runs as its own process, `python -m ister.benchmark.danube_cases [options]`, and prints one JSON object
(`--url` runs against a broker or cluster already running, e.g. the replication suite's; no no-op cases):
danube-client registers the `danube` proto package in the process that imports it, and so does
`ister.wire.gen.DanubeApi_pb2`, so the two never share a process. The broker and the no-op server
(`ister.benchmark.noop_server`) are subprocesses too.

Cases (100-byte payloads, reliable topic, one broker; the method of bench/danube_bench.py before it):
  danube_seq_publish   one awaited `producer.send()` at a time (after 50 warm-up); send round trip percentiles
  danube_pipe_publish  `n_pipe` sends from 64 concurrent tasks (64 in flight)
  danube_consume_ack   a subscription created before publishing reads those messages back, acking each one
                       (64 acks in flight; the broker's default window of 10 unacked messages)
  danube_e2e           a publisher at 1,000 msg/s (awaited sends, as the JetStream peer does) and a consumer
                       in another process; latency from a CLOCK_MONOTONIC stamp in the payload
  noop_seq_publish, noop_pipe_publish   the first two against a server that stores nothing (the ceiling of
                       one unary gRPC call per message with this client on this machine)
  noop_consume_ack     consume + ack against that server streaming made-up messages, holding at most the
                       broker's default window of unacknowledged messages (the protocol's streaming ceiling
                       with this client); noop_consume_ack_unbounded: with no window
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import danube  # type: ignore[import-untyped]
import uvloop

from ister.benchmark.broker import BenchBroker
from ister.benchmark.stats import (
    PAYLOAD,
    latency_result,
    latency_us,
    process_cpu_s,
    rate,
    stamp_age_s,
    stamped_payload,
    stop_child,
)
from ister.devcluster.ports import free_port, stop_process, wait_port
from ister.limits import DEFAULT_WINDOW

IN_FLIGHT = 64
BROKER_WINDOW = DEFAULT_WINDOW  # the broker's dispatch.max_unacked_messages default


async def _client(url: str) -> Any:
    return await danube.DanubeClientBuilder().service_url(url).build()


async def _producer(c: Any, topic: str, name: str) -> Any:
    p = (
        c.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
        .build()
    )
    await p.create()
    return p


async def _consumer(c: Any, topic: str, name: str, subscription: str) -> tuple[Any, asyncio.Queue[Any]]:
    cons = (
        c.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(subscription)
        .with_subscription_type(danube.SubType.EXCLUSIVE)
        .build()
    )
    await cons.subscribe()
    queue = await cons.receive()
    return cons, queue


async def seq_publish(url: str, topic: str, n: int) -> dict[str, Any]:
    c = await _client(url)
    p = await _producer(c, topic, "seq")
    for _ in range(50):
        await p.send(PAYLOAD)
    rtts: list[float] = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        await p.send(PAYLOAD)
        rtts.append(time.perf_counter() - s)
    out = rate(n, time.perf_counter() - t0)
    out.update(latency_us=latency_us(rtts), latency_of="send round trip")
    return out


async def _publish_pipelined(p: Any, n: int, inflight: int) -> dict[str, Any]:
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await p.send(PAYLOAD)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    out = rate(n, time.perf_counter() - t0)
    out["in_flight"] = inflight
    return out


async def pipe_publish_only(url: str, topic: str, n: int) -> dict[str, Any]:
    c = await _client(url)
    return await _publish_pipelined(await _producer(c, topic, "pipe"), n, IN_FLIGHT)


async def pipe_publish_and_consume(
    url: str, topic: str, n: int, broker_cpu: Callable[[], float]
) -> tuple[dict[str, Any], dict[str, Any]]:
    c = await _client(url)
    p = await _producer(c, topic, "pipe")
    cons, _ = await _consumer(c, topic, "bench-c", "bench-sub")
    await cons.close()  # the subscription exists from offset 0; read it back after publishing
    cpu0 = broker_cpu()
    pub = await _publish_pipelined(p, n, IN_FLIGHT)
    pub["broker_cpu_us_per_msg"] = (broker_cpu() - cpu0) / n * 1e6

    cons, q = await _consumer(c, topic, "bench-c", "bench-sub")
    cpu0 = broker_cpu()
    con = await _consume_acking(cons, q, n)
    con["broker_cpu_us_per_msg"] = (broker_cpu() - cpu0) / n * 1e6
    await cons.close()
    return pub, con


async def _consume_acking(cons: Any, q: asyncio.Queue[Any], n: int) -> dict[str, Any]:
    """Read `n` messages, acknowledging each (IN_FLIGHT acks at a time)."""
    sem = asyncio.Semaphore(IN_FLIGHT)
    pending: set[asyncio.Task[None]] = set()

    async def ack(m: Any) -> None:
        try:
            await cons.ack(m)
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
    out = rate(n, time.perf_counter() - t0)
    out["acks_in_flight"] = IN_FLIGHT
    return out


async def consume_only(url: str, topic: str, n: int) -> dict[str, Any]:
    c = await _client(url)
    cons, q = await _consumer(c, topic, "noop-c", "noop-sub")
    try:
        return await _consume_acking(cons, q, n)
    finally:
        await cons.close()


def _latency_consumer(url: str, topic: str, n: int, ready: Any, out: Any) -> None:
    async def run() -> list[float]:
        c = await _client(url)
        cons, q = await _consumer(c, topic, "lat-c", "lat-sub")
        ready.put(True)
        lats: list[float] = []
        acks: set[asyncio.Task[None]] = set()
        for _ in range(n):
            m = await asyncio.wait_for(q.get(), 30)
            lats.append(stamp_age_s(m.payload, time.monotonic_ns()))
            task = asyncio.create_task(cons.ack(m))
            acks.add(task)
            task.add_done_callback(acks.discard)
        await asyncio.gather(*acks)
        return lats

    out.put(uvloop.run(run()))


async def e2e_latency(url: str, topic: str, rate_per_s: int, seconds: float) -> dict[str, Any]:
    n = int(rate_per_s * seconds)
    c = await _client(url)
    p = await _producer(c, topic, "lat-p")
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    results = ctx.Queue()
    proc = ctx.Process(target=_latency_consumer, args=(url, topic, n, ready, results), daemon=True)
    proc.start()
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, ready.get, True, 60)
        await asyncio.sleep(0.5)
        rtts: list[float] = []
        late = 0
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late += 1
            sent_at = time.perf_counter()
            await p.send(stamped_payload())
            rtts.append(time.perf_counter() - sent_at)
        wall = time.perf_counter() - start
        lats: list[float] = await loop.run_in_executor(None, results.get, True, seconds + 90)
    finally:
        stop_child(proc)
    return latency_result(n, wall, lats, rtts, late)


def run_noop(n_seq: int, n_pipe: int) -> dict[str, Any]:
    """The cases against `ister.benchmark.noop_server` (a subprocess: it imports the Danube stubs): publish,
    and consume + ack with the broker's default window of unacknowledged messages and with none."""
    out: dict[str, Any] = {}
    for window in (0, BROKER_WINDOW):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "ister.benchmark.noop_server", str(port), str(window)])
        try:
            wait_port(port, proc, 30.0, "the no-op server")
            url = f"http://127.0.0.1:{port}"
            if window == 0:
                out["noop_seq_publish"] = uvloop.run(seq_publish(url, "/default/noop_seq", n_seq))
                out["noop_pipe_publish"] = uvloop.run(pipe_publish_only(url, "/default/noop_pipe", n_pipe))
                out["noop_consume_ack_unbounded"] = uvloop.run(consume_only(url, "/default/noop_c", n_pipe))
            else:
                out["noop_consume_ack"] = uvloop.run(consume_only(url, "/default/noop_c", n_pipe))
                out["noop_consume_ack"]["window"] = window
        finally:
            stop_process(proc)
    return out


ALL_CASES = ("seq", "pipe", "consume", "e2e")


def run_cases(
    url: str,
    broker_cpu: Callable[[], float],
    n_seq: int,
    n_pipe: int,
    latency_seconds: float,
    cases: tuple[str, ...] = ALL_CASES,
) -> dict[str, Any]:
    """The selected cases against the broker (or cluster: lookups lead to each topic's owner) at `url`;
    `broker_cpu` gives the CPU seconds of the broker process(es) so far."""
    out: dict[str, Any] = {}

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def measured(key: str, case: Coroutine[Any, Any, dict[str, Any]], messages: int) -> None:
        cpu0 = broker_cpu()
        out[key] = uvloop.run(case)
        out[key]["broker_cpu_us_per_msg"] = (broker_cpu() - cpu0) / messages * 1e6

    if "seq" in cases:
        note(f"danube-client: sequential durable publish of {n_seq:,} messages")
        measured("danube_seq_publish", seq_publish(url, "/default/danube_seq", n_seq), n_seq + 50)
    if "consume" in cases:
        note(f"danube-client: {n_pipe:,} durable publishes, {IN_FLIGHT} in flight, then consume + ack")
        pub, con = uvloop.run(pipe_publish_and_consume(url, "/default/danube_pipe", n_pipe, broker_cpu))
        out["danube_pipe_publish"] = pub
        out["danube_consume_ack"] = con
    elif "pipe" in cases:
        note(f"danube-client: {n_pipe:,} durable publishes, {IN_FLIGHT} in flight")
        measured("danube_pipe_publish", pipe_publish_only(url, "/default/danube_pipe", n_pipe), n_pipe)
    if "e2e" in cases:
        note(f"danube-client: e2e latency at 1,000 msg/s for {latency_seconds:g} s")
        n_lat = int(1000 * latency_seconds)
        measured("danube_e2e", e2e_latency(url, "/default/danube_lat", 1000, latency_seconds), n_lat)
    return out


def run_all(fsync: str, n_seq: int, n_pipe: int, latency_seconds: float, noop: bool) -> dict[str, Any]:
    with BenchBroker(fsync=fsync) as broker:
        print(f"danube-client: broker pid {broker.pid}", file=sys.stderr, flush=True)
        out = run_cases(broker.url, broker.cpu_seconds, n_seq, n_pipe, latency_seconds)
    if noop:
        print("danube-client against the no-op gRPC server", file=sys.stderr, flush=True)
        out.update(run_noop(n_seq, n_pipe))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsync", default="always", choices=["always", "interval"])
    ap.add_argument("--n-seq", type=int, default=3000)
    ap.add_argument("--n-pipe", type=int, default=20000)
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--no-noop", action="store_true", help="skip the no-op server cases")
    ap.add_argument("--url", help="run against this running broker or cluster instead of starting one")
    ap.add_argument("--broker-pids", default="", help="with --url: the broker processes, for CPU per message")
    ap.add_argument(
        "--cases", default=",".join(ALL_CASES), help="with --url: a subset of seq,pipe,consume,e2e"
    )
    args = ap.parse_args()
    if args.url:
        pids = [int(p) for p in args.broker_pids.split(",") if p]
        cases = tuple(c for c in args.cases.split(",") if c)
        if not set(cases) <= set(ALL_CASES):
            ap.error(f"--cases takes a subset of {','.join(ALL_CASES)}")

        def cpu() -> float:
            return sum(process_cpu_s(pid) for pid in pids)

        result = run_cases(args.url, cpu, args.n_seq, args.n_pipe, args.latency_seconds, cases)
    else:
        result = run_all(args.fsync, args.n_seq, args.n_pipe, args.latency_seconds, not args.no_noop)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
