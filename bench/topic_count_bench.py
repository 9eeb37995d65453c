"""Many reliable topics on one broker (issue 14 item 2): threads, file descriptors, memory, responsiveness,
and publish throughput to many topics at once.

usage: python bench/topic_count_bench.py [--topics 100000] [--concurrency 64] [--idle 40]
                                         [--messages 4000000] [--partitions 1000] [--runs 3] [--skip-count]
                                         [--skip-throughput] [--buffer-messages 262144] [--json]

* count: one `ister broker` process (standalone, fsync always, default settings except the topic limit,
  which is raised above N); `--concurrency` tasks of one Ister client create N reliable topics
  `/default/tc-<i>`, each through its own producer (batch API: lookup, PublishOpen, one message, close).
  Then the broker stays idle for `--idle` seconds (longer than wal.idle_close_seconds = 30). A probe in
  another process sends a Danube HealthCheck every 50 ms (latency = its round trip; for a check over
  30 ms it also notes how long its own thread and the broker's event-loop thread were runnable but
  waiting for a CPU meanwhile, from /proc/.../schedstat: the machine's share of the delay) and reads the
  broker's /proc/<pid>/status (Threads, VmRSS) and /proc/<pid>/fd (all descriptors, and those on `.wal`
  segment files: the files open for writing) every 0.5 s. (No Prometheus scrapes: with 100,000 topics
  one takes seconds of the broker's CPU.) Afterwards 200 random topics are checked to hold one message.
* throughput: one producer publishes `--messages` 100-byte messages with send_batch in batches of 1,024,
  to a topic of one partition (8 batches in flight), or to a topic of `--partitions` partitions (each
  partition is a reliable topic with its own WAL; consecutive batches go to consecutive partitions; 2
  batches in flight per partition). Both producers have the client's default buffer (`--buffer-messages`
  262,144 unacknowledged messages, 64 MiB), as a user's would: one topic fills 8 batches of it, 1,000
  topics all of it (256 batches, ~30 MB, spread round-robin). msg/s from the first send after a warm-up
  batch to the last ack. `--runs` pairs, alternating, each case on a fresh broker; the medians and their
  ratio. `--buffer-messages 4096000` gives the many-topic producer room for 2 batches per topic at once
  (2,000 batches, ~240 MB in flight: the setting before session 18).

Not a test; numbers depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ister.benchmark.broker import BenchBroker
from ister.benchmark.stats import PAYLOAD, host_cpu_share, host_cpu_ticks, latency_us, pct
from ister.client import Client
from ister.client.producer import Producer

HEALTH_EVERY_S = 0.05
PROC_EVERY_S = 0.5
HEALTH_TIMEOUT_S = 5.0
SLOW_S = 0.03  # checks slower than this are listed with the CPU waits behind them
BATCH = 1024


# ---- the probe (its own process, so the bench client's work does not delay its calls) ----------------


def _proc_sample(pid: int) -> tuple[int, int, int, int]:
    """(threads, open fds, RSS bytes, fds on WAL segment files) of a process."""
    threads = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    fds = os.listdir(f"/proc/{pid}/fd")
    segments = 0
    for fd in fds:
        try:
            segments += os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".wal")
        except OSError:
            continue
    return threads, len(fds), rss, segments


def _run_delay_ms(pid: int, tid: int) -> float:
    """Milliseconds the thread has spent runnable but waiting for a CPU (/proc schedstat, 2nd field)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e6


def probe(pid: int, port: int, stop: Any, out: Any) -> None:
    import grpc  # in the probe process only

    from ister.wire.gen import DanubeApi_pb2 as pb
    from ister.wire.gen import DanubeApi_pb2_grpc as rpc

    async def run() -> dict[str, Any]:
        health: list[float] = []
        # Checks over SLOW_S: (s since the probe started, ms, ms the probe's own thread and ms the broker's
        # event-loop thread were runnable but waited for a CPU meanwhile: the machine's share of the wait).
        slow: list[tuple[float, float, float, float]] = []
        me = threading.get_native_id()
        failures = 0
        procs: list[tuple[float, int, int, int, int]] = []
        t0 = time.monotonic()
        next_proc = t0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rpc.HealthCheckStub(channel)
            request = pb.HealthCheckRequest(request_id=1, client=pb.HealthCheckRequest.Producer, id=1)
            while not stop.is_set():
                start = time.perf_counter()
                waits = _run_delay_ms(os.getpid(), me), _run_delay_ms(pid, pid)
                try:
                    await stub.HealthCheck(request, timeout=HEALTH_TIMEOUT_S)
                    took = time.perf_counter() - start
                    health.append(took)
                    if took > SLOW_S:
                        mine = round(_run_delay_ms(os.getpid(), me) - waits[0], 1)
                        loop = round(_run_delay_ms(pid, pid) - waits[1], 1)
                        slow.append((round(time.monotonic() - t0, 1), round(took * 1e3, 1), mine, loop))
                except grpc.aio.AioRpcError:
                    failures += 1
                now = time.monotonic()
                if now >= next_proc:
                    next_proc = now + PROC_EVERY_S
                    try:
                        procs.append((now - t0, *_proc_sample(pid)))
                    except OSError:
                        break  # the broker is gone
                await asyncio.sleep(max(0.0, HEALTH_EVERY_S - (time.perf_counter() - start)))
        return {"health": health, "slow": slow, "failures": failures, "procs": procs}

    out.put(asyncio.run(run()))


class Probe:
    def __init__(self, broker: BenchBroker) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._out = ctx.Queue()
        self._proc = ctx.Process(
            target=probe, args=(broker.pid, broker.port, self._stop, self._out), daemon=True
        )
        self.started = time.monotonic()

    def __enter__(self) -> Probe:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.is_alive():
            self._proc.kill()

    def result(self) -> dict[str, Any]:
        self._stop.set()
        data: dict[str, Any] = self._out.get(timeout=60)
        self._proc.join(10)
        return data


def mark(probe_start: float) -> float:
    return time.monotonic() - probe_start


# ---- count ---------------------------------------------------------------------------------------------


async def create_topics(url: str, n: int, concurrency: int, progress: bool) -> dict[str, Any]:
    async with Client(url) as client:
        next_index = 0
        done = 0
        started = time.monotonic()

        async def worker() -> None:
            nonlocal next_index, done
            while next_index < n:
                i = next_index
                next_index += 1
                producer = await client.producer(f"/default/tc-{i:06d}", "tc", reliable=True, linger_ms=0)
                await producer.send(PAYLOAD)
                await producer.close()
                done += 1
                if progress and done % 10_000 == 0:
                    elapsed = time.monotonic() - started
                    print(f"  {done} topics in {elapsed:.0f} s ({done / elapsed:.0f}/s)", file=sys.stderr)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        checked = random.Random(14).sample(range(n), min(200, n))
        for i in checked:
            offsets = await client.offsets(f"/default/tc-{i:06d}")
            if (offsets.earliest, offsets.next) != (0, 1):
                raise AssertionError(f"topic tc-{i:06d} holds offsets {offsets.earliest}..{offsets.next - 1}")
    return {"seconds": elapsed, "topics_per_s": n / elapsed, "checked_topics": len(checked)}


def summarize_window(data: dict[str, Any], since: float, until: float) -> dict[str, Any]:
    procs = [p for p in data["procs"] if since <= p[0] <= until]
    return {
        "max_threads": max((p[1] for p in procs), default=0),
        "max_fds": max((p[2] for p in procs), default=0),
        "max_rss_mib": max((p[3] for p in procs), default=0) / 2**20,
        "max_open_segment_files": max((p[4] for p in procs), default=0),
        # the target: fds <= 2 x segment files open for writing + a constant; this is the constant
        "max_fds_minus_2x_segment_files": max((p[2] - 2 * p[4] for p in procs), default=0),
    }


async def count_case(args: argparse.Namespace) -> dict[str, Any]:
    env = {"ISTER_LIMITS__MAX_TOPICS_PER_BROKER": str(args.topics + 100)}
    with BenchBroker(env=env) as broker, Probe(broker) as probe:
        t0 = probe.started
        baseline = _proc_sample(broker.pid)
        created = await create_topics(broker.url, args.topics, args.concurrency, not args.json)
        t_created = mark(t0)
        await asyncio.sleep(args.idle)  # the broker idles; the probe keeps sampling
        t_end = mark(t0)
        end_sample = _proc_sample(broker.pid)
        data = probe.result()
        entries = log_entries(broker.log_path.read_text(errors="replace"))
        stalls = [e for e in entries if "stall_watch" in e.split("\n", 1)[0]]
        errors = [e[:500] for e in entries if " ERROR " in e.split("\n", 1)[0]]
    health = data["health"]
    return {
        "topics": args.topics,
        "concurrency": args.concurrency,
        "create": created,
        "baseline": {"threads": baseline[0], "fds": baseline[1], "rss_mib": baseline[2] / 2**20},
        "while_creating": summarize_window(data, 0.0, t_created),
        "idle": summarize_window(data, t_created, t_end),
        "after_idle": {
            "threads": end_sample[0],
            "fds": end_sample[1],
            "rss_mib": end_sample[2] / 2**20,
            "segment_files": end_sample[3],
        },
        "health": {
            **latency_us(health),
            "over_50ms": sum(1 for h in health if h > 0.05),
            # (s since start, ms, probe's and broker loop's CPU wait in ms); creation ended at created_at_s
            "over_50ms_at": [c for c in data["slow"] if c[1] > 50],
            "over_30ms": slow_summary(data["slow"]),
            "created_at_s": round(t_created, 1),
            "failures": data["failures"],
            "p999_ms": pct(health, 99.9) * 1e3 if health else None,
        },
        "broker_stall_reports": stalls,  # the broker's own: event loop stalls and long collections
        "broker_errors": errors[:20],
        "broker_error_count": len(errors),
    }


def log_entries(log_text: str) -> list[str]:
    """The broker log's entries (an entry: a timestamped line and the lines after it up to the next
    timestamped one)."""
    entries: list[list[str]] = []
    for line in log_text.splitlines():
        if line[:2] == "20" and line[4:5] == "-":  # "2026-11-29 07:40:01,123 WARNING ..."
            entries.append([line])
        elif entries:
            entries[-1].append(line)
    return ["\n".join(e) for e in entries]


def slow_summary(slow: list[list[float]]) -> dict[str, Any]:
    """The checks over SLOW_S: how many, and the medians of their time and of the CPU waits behind it."""
    if not slow:
        return {"count": 0}

    def median(i: int) -> float:
        return sorted(c[i] for c in slow)[len(slow) // 2]

    return {
        "count": len(slow),
        "median_ms": median(1),
        "median_probe_cpu_wait_ms": median(2),
        "median_loop_cpu_wait_ms": median(3),
        "max_ms": max(c[1] for c in slow),
    }


# ---- throughput ---------------------------------------------------------------------------------------


DEFAULT_BUFFER_MESSAGES = 262_144  # ister.client.Client.producer's default max_buffered_messages


def in_flight_for(partitions: int) -> int:
    """Batches in flight (send_batch calls of one batch per partition each): 8 to one topic, 2 per topic to
    several."""
    return 8 if partitions == 1 else 2


async def bench_producer(
    client: Client, topic: str, partitions: int, buffer_messages: int = DEFAULT_BUFFER_MESSAGES
) -> Producer:
    """The throughput workload's producer: reliable, batches of BATCH, up to in_flight_for(partitions) of
    them in flight per partition and `buffer_messages` unacknowledged messages in all (the client's
    default buffer unless raised; bytes are capped at 1 GiB so that the messages decide)."""
    in_flight = in_flight_for(partitions)
    return await client.producer(
        topic,
        "tp",
        reliable=True,
        partitions=partitions if partitions > 1 else None,
        max_batch_messages=BATCH,
        max_inflight_batches=in_flight,
        max_buffered_messages=buffer_messages,
        max_buffered_bytes=1 << 30,
    )


async def publish(
    url: str,
    topic: str,
    partitions: int,
    messages: int,
    buffer_messages: int = DEFAULT_BUFFER_MESSAGES,
) -> dict[str, Any]:
    """`messages` 100-byte messages in batches of BATCH through one producer: to one topic with 8 batches
    in flight (8 send_batch calls of one batch each), or to `partitions` topics (2 send_batch calls of one
    batch per topic each; the producer's buffer decides how many are in flight at once)."""
    in_flight = in_flight_for(partitions)
    async with Client(url) as client:
        producer = await bench_producer(client, topic, partitions, buffer_messages)
        per_call = BATCH * partitions
        chunk = [PAYLOAD] * per_call
        await producer.send_batch(chunk)  # warm-up: every partition's stream and WAL file is open
        cpu0 = host_cpu_ticks()
        start = time.monotonic()
        sent = 0

        async def worker() -> None:
            nonlocal sent
            while sent < messages:
                sent += per_call
                await producer.send_batch(chunk)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.monotonic() - start
        share = host_cpu_share(cpu0, host_cpu_ticks())
        await producer.close()
    return {
        "topics": partitions,
        "messages": sent,
        "seconds": elapsed,
        "msgs_per_s": sent / elapsed,
        "host_cpu": share,
    }


async def throughput_case(args: argparse.Namespace) -> dict[str, Any]:
    """`--runs` pairs, alternating, each on a fresh broker (the machine's noise moves single runs a lot)."""
    runs = []
    for _ in range(args.runs):
        with BenchBroker() as broker:
            one = await publish(broker.url, "/default/tp-one", 1, args.messages)
        with BenchBroker() as broker:
            many = await publish(
                broker.url, "/default/tp-many", args.partitions, args.messages, args.buffer_messages
            )
        runs.append({"one_topic": one, "many_topics": many, "ratio": many["msgs_per_s"] / one["msgs_per_s"]})
    ones = sorted(r["one_topic"]["msgs_per_s"] for r in runs)
    manys = sorted(r["many_topics"]["msgs_per_s"] for r in runs)
    return {
        "runs": runs,
        "median_one_topic": ones[len(ones) // 2],
        "median_many_topics": manys[len(manys) // 2],
        "median_ratio": manys[len(manys) // 2] / ones[len(ones) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--idle", type=float, default=40.0)
    parser.add_argument("--messages", type=int, default=4_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-count", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--buffer-messages", type=int, default=DEFAULT_BUFFER_MESSAGES)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average": os.getloadavg()}
    if not args.skip_count:
        result["count"] = asyncio.run(count_case(args))
    if not args.skip_throughput:
        result["throughput"] = asyncio.run(throughput_case(args))
    print(json.dumps(result, indent=None if args.json else 2, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
