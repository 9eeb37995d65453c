"""Per-thread CPU and context switches of a fresh standalone broker during one workload (issues 14, 21).

usage: python bench/thread_cpu.py publish [ENV=VALUE ...] [--topics 1000] [--messages 4000000]
       python bench/thread_cpu.py e2e [ENV=VALUE ...] [--seconds 8]
       python bench/thread_cpu.py danube-publish [ENV=VALUE ...] [--messages 20000] [--noop]
       python bench/thread_cpu.py danube-consume [ENV=VALUE ...] [--messages 15000] [--noop]

* publish: the batch-API workload of `bench/topic_count_bench.py` (batches of 1,024; one topic with 8 in
  flight, or `--topics` partitions with 2 each), measured from after its warm-up call to the last ack:
  msg/s, the broker's page faults per 1,000 messages, its RSS before and after, and the client's CPU.
* e2e: `ister bench`'s batch-API e2e case (1,000 msg/s, a consumer in another process); threads are read
  between its 3rd and 7th second.
* danube-publish: `ister bench`'s danube-client publish with 64 in flight, after 2,000 warm-up messages; also
  the client's (this process's) CPU and the time all cores were idle, per message.
* danube-consume: its consume + ack (64 acks in flight) of `--messages` published before.
  With `--noop` both run against the no-op Danube server instead (`ister.benchmark.noop_server`; consume
  with at most 10 unacknowledged, the broker's default window), whose threads are then the ones shown.

Both print, per broker thread (`loop` is the main thread, the event loop; other Python threads show as
`python-<tid>`, gRPC's as `event_engine-<tid>`), µs of CPU and voluntary context switches per message.
`ENV=VALUE` arguments go to the broker's environment only (`ISTER_WAL__WRITER_THREADS=3`,
`GRPC_EXPERIMENTS=...`); this process's own environment reaches both the broker and the clients. Not a
test; results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])

import uvloop  # noqa: E402

import topic_count_bench  # noqa: E402
from ister.benchmark import ister_cases  # noqa: E402
from ister.benchmark.broker import BenchBroker  # noqa: E402
from ister.benchmark.stats import PAYLOAD, host_cpu_ticks, thread_deltas, thread_stats  # noqa: E402
from ister.client import Client  # noqa: E402
from ister.devcluster.ports import free_port, stop_process, wait_port  # noqa: E402

Stats = dict[int, tuple[str, float, int]]


def per_thread(pid: int, before: Stats, after: Stats, messages: int) -> str:
    rows = []
    for tid, name, cpu, switches in sorted(thread_deltas(before, after), key=lambda r: -r[2])[:8]:
        if cpu or switches:
            label = "loop" if tid == pid else f"{name}-{tid}"
            rows.append(f"{label} {cpu * 1e6 / messages:.3g} µs {switches / messages:.3g} cs")
    return ", ".join(rows)


def faults_and_rss(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as f:
        minflt = int(f.read().rsplit(")", 1)[1].split()[7])
    with open(f"/proc/{pid}/status") as f:
        rss_kib = int(next(line for line in f if line.startswith("VmRSS")).split()[1])
    return minflt, rss_kib // 1024


async def publish(broker: BenchBroker, topics: int, messages: int) -> None:
    in_flight = topic_count_bench.in_flight_for(topics)
    async with Client(broker.url) as client:
        producer = await topic_count_bench.bench_producer(client, "/default/threads", topics)
        chunk = [PAYLOAD] * (topic_count_bench.BATCH * topics)
        await producer.send_batch(chunk)  # warm-up: every stream and WAL file open
        faults0, rss0 = faults_and_rss(broker.pid)
        threads0 = thread_stats(broker.pid)
        mine0 = os.times()
        start = time.monotonic()
        sent = 0

        async def worker() -> None:
            nonlocal sent
            while sent < messages:
                sent += len(chunk)
                await producer.send_batch(chunk)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.monotonic() - start
        threads1 = thread_stats(broker.pid)
        mine1 = os.times()
        faults1, rss1 = faults_and_rss(broker.pid)
        await producer.close()
    client_cpu = (mine1.user - mine0.user) + (mine1.system - mine0.system)
    faults = 1000 * (faults1 - faults0) / sent
    print(
        f"{topics} topic(s): {sent / elapsed:,.0f} msg/s, broker page faults {faults:.1f} per 1,000 messages,"
        f" RSS {rss0} -> {rss1} MiB, client {client_cpu * 1e6 / sent:.2f} µs/msg"
    )
    print("  broker threads per message:", per_thread(broker.pid, threads0, threads1, sent))


def machine_idle() -> float:
    """Seconds all cores have been idle since boot (idle + iowait of `host_cpu_ticks`)."""
    ticks = host_cpu_ticks()
    return (ticks[3] + ticks[4]) / os.sysconf("SC_CLK_TCK")


def e2e(broker: BenchBroker, seconds: float) -> None:
    readings: dict[str, Stats] = {}

    def sample() -> None:
        time.sleep(3)
        readings["before"] = thread_stats(broker.pid)
        time.sleep(4)
        readings["after"] = thread_stats(broker.pid)

    sampler = threading.Thread(target=sample)
    sampler.start()
    case = ister_cases.e2e_latency(
        broker.url, "/default/threads_e2e", seconds=seconds, broker_cpu=broker.cpu_seconds
    )
    result: dict[str, Any] = uvloop.run(case)
    sampler.join()
    lat = result["latency_us"]
    print(
        f"e2e p50 {lat['p50'] / 1000:.2f} ms, p99 {lat['p99'] / 1000:.2f} ms, broker "
        f"{result['broker_cpu_us_per_msg']:.0f} µs/msg"
    )
    window = per_thread(broker.pid, readings["before"], readings["after"], 4000)  # 4 s at 1,000 msg/s
    print("  broker threads per message:", window)


def danube_publish(url: str, pid: int, messages: int, server: str = "broker") -> None:
    from ister.benchmark import danube_cases as dc  # the official client: only in the danube cases

    uvloop.run(dc.pipe_publish_only(url, "/default/threads_warm", 2000))
    threads0, mine0, idle0 = thread_stats(pid), os.times(), machine_idle()
    result = uvloop.run(dc.pipe_publish_only(url, "/default/threads_danube", messages))
    threads1, mine1, idle1 = thread_stats(pid), os.times(), machine_idle()
    client = (mine1.user - mine0.user) + (mine1.system - mine0.system)
    idle = idle1 - idle0
    print(
        f"danube-client publish, {dc.IN_FLIGHT} in flight: {result['msgs_per_s']:,.0f} msg/s ({server}), "
        f"client {client * 1e6 / messages:.0f} µs/msg, machine idle {idle * 1e6 / messages:.0f} µs/msg"
    )
    print(f"  {server} threads per message:", per_thread(pid, threads0, threads1, messages))


def danube_consume(url: str, pid: int, messages: int, publish_first: bool) -> None:
    from ister.benchmark import danube_cases as dc

    topic = "/default/threads_consume"

    async def run() -> tuple[dict[str, Any], Stats, Stats]:
        client = await dc._client(url)
        if publish_first:  # the subscription exists from offset 0 before the messages come
            producer = await dc._producer(client, topic, "threads")
            consumer, _ = await dc._consumer(client, topic, "threads-c", "threads-sub")
            await consumer.close()
            await dc._publish_pipelined(producer, messages, dc.IN_FLIGHT)
        consumer, queue = await dc._consumer(client, topic, "threads-c", "threads-sub")
        before = thread_stats(pid)
        result = await dc._consume_acking(consumer, queue, messages)
        after = thread_stats(pid)
        await consumer.close()
        return result, before, after

    result, before, after = uvloop.run(run())
    server = "broker" if publish_first else "no-op server"
    print(f"danube-client consume + ack: {result['msgs_per_s']:,.0f} msg/s ({server})")
    print(f"  {server} threads per message:", per_thread(pid, before, after, messages))


def noop_case(case: str, messages: int) -> None:
    window = "10" if case == "danube-consume" else "0"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ister.benchmark.noop_server", str(port), window])
    try:
        wait_port(port, proc, 30.0, "the no-op server")
        url = f"http://127.0.0.1:{port}"
        if case == "danube-consume":
            danube_consume(url, proc.pid, messages, publish_first=False)
        else:
            danube_publish(url, proc.pid, messages, "no-op server")
    finally:
        stop_process(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=["publish", "e2e", "danube-publish", "danube-consume"])
    parser.add_argument("env", nargs="*", help="ENV=VALUE for the broker (right after the case)")
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--messages", type=int, help="default 4,000,000; danube cases 20,000 / 15,000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--noop", action="store_true", help="danube-consume: against the no-op server")
    args = parser.parse_args()
    if args.case == "e2e" and args.seconds < 8:
        parser.error("--seconds must be at least 8 (threads are read between the 3rd and 7th second)")
    messages = args.messages or {"danube-publish": 20_000, "danube-consume": 15_000}.get(args.case, 4_000_000)
    if args.noop:
        if not args.case.startswith("danube-"):
            parser.error("--noop goes with the danube cases")
        noop_case(args.case, messages)
        return
    env = dict(item.split("=", 1) for item in args.env)
    with BenchBroker(env=env) as broker:
        if args.case == "publish":
            uvloop.run(publish(broker, args.topics, messages))
        elif args.case == "e2e":
            e2e(broker, args.seconds)
        elif args.case == "danube-publish":
            danube_publish(broker.url, broker.pid, messages)
        else:
            danube_consume(broker.url, broker.pid, messages, publish_first=True)


if __name__ == "__main__":
    main()
