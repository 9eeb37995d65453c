"""Benchmark of the Prometheus exporter with many topics (issue 14 item 3). Not a test.

usage: python bench/metrics_bench.py [--topics 5000] [--reliable] [--src DIR] [--seconds 10]
                                     [--settle 10] [--idle-sockets 500] [--env KEY=VALUE ...] [--json]

Starts one `ister broker` (from `--src`, default this checkout's src/: point it at another checkout to
compare) with `--topics` topics, each with one subscription (a consumer that subscribed and left) and one
message. Non-reliable by default: they have per-topic series but no WAL thread, cursor flush or export,
so the event loop is idle and what the exporter does to it shows alone (`--reliable` for reliable ones).
After `--settle` seconds it measures:

* scrape: size of one /metrics answer and the time a scraper waits for it (the first, and the median of
  the next 5);
* loop impact: the time a HealthCheck RPC takes (it is answered on the broker's event loop), p50/p90/max
  over `--seconds`: with no scraper, while two scrapers fetch /metrics in a loop, with no scraper again;
* threads: the broker's thread count before and while `--idle-sockets` idle connections are open to the
  metrics port.

Numbers depend on the machine and its load. Results go to docs/benchmarks.md ("Metrics scrape").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from danube.proto import DanubeApi_pb2 as dpb
from danube.proto import DanubeApi_pb2_grpc as dpb_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ister.client import Client  # noqa: E402
from ister.devcluster.ports import free_port, wait_port  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Broker:
    def __init__(self, src: Path, data: Path, env: dict[str, str]) -> None:
        self.port, self.admin, self.prom = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.prom}/metrics"
        cmd = [
            sys.executable, "-m", "ister.cli", "broker", "--data-dir", str(data),
            "--broker-addr", f"127.0.0.1:{self.port}", "--admin-addr", f"127.0.0.1:{self.admin}",
            "--prom-exporter", f"127.0.0.1:{self.prom}", "--log-level", "warning",
        ]  # fmt: skip
        full_env = {**os.environ, "PYTHONPATH": str(src), **env}
        self.proc = subprocess.Popen(cmd, env=full_env)
        wait_port(self.prom, self.proc, 60.0, "broker")

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return -1

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


async def populate(url: str, topics: int, reliable: bool) -> None:
    async with Client(url) as client:
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                topic = f"/default/metrics_bench_{i}"
                producer = await client.producer(topic, f"p{i}", reliable=reliable)
                consumer = await client.consumer(topic, "sub", name=f"c{i}")
                await consumer.close()
                await producer.send_batch([b"x" * 100])
                await producer.close()

        started = time.monotonic()
        for start in range(0, topics, 500):
            await asyncio.gather(*(one(i) for i in range(start, min(topics, start + 500))))
            print(f"metrics_bench: {min(topics, start + 500)} topics ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip


def scrape(url: str) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return len(body), time.monotonic() - started


async def health_latencies(url: str, seconds: float) -> list[float]:
    target = url.removeprefix("http://")
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dpb_grpc.HealthCheckStub(channel)
        request = dpb.HealthCheckRequest(request_id=1, client=dpb.HealthCheckRequest.Producer, id=1)
        out: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            await stub.HealthCheck(request, timeout=60)
            out.append(time.monotonic() - started)
            await asyncio.sleep(0.01)
        return out


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values) * 1000, 2),
        "p90_ms": round(percentile(values, 0.9) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def scrapers(url: str, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        scrape(url)
        counts[0] += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=5000)
    ap.add_argument("--reliable", action="store_true")
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--idle-sockets", type=int, default=500)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the broker")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    result: dict[str, Any] = {
        "topics": args.topics,
        "reliable": args.reliable,
        "src": str(args.src),
        "env": env,
    }
    with tempfile.TemporaryDirectory(prefix="ister-metrics-bench-") as tmp:
        broker = Broker(args.src.resolve(), Path(tmp) / "data", env)
        try:
            asyncio.run(populate(broker.url, args.topics, args.reliable))
            time.sleep(args.settle)  # let the start-up work (cursor writes, first exports) pass
            first_size, first = scrape(broker.metrics_url)
            times = [scrape(broker.metrics_url) for _ in range(5)]
            result["scrape"] = {
                "bytes": first_size,
                "first_ms": round(first * 1000, 2),
                "next_5_median_ms": round(statistics.median(t for _, t in times) * 1000, 2),
            }
            result["health_idle"] = summary(asyncio.run(health_latencies(broker.url, args.seconds)))
            stop = threading.Event()
            counts = [0]
            workers = [
                threading.Thread(target=scrapers, args=(broker.metrics_url, stop, counts)) for _ in range(2)
            ]
            for w in workers:
                w.start()
            try:
                result["health_two_scrapers"] = summary(
                    asyncio.run(health_latencies(broker.url, args.seconds))
                )
            finally:
                stop.set()
                for w in workers:
                    w.join()
            result["health_two_scrapers"]["scrapes"] = counts[0]
            result["health_idle_after"] = summary(asyncio.run(health_latencies(broker.url, args.seconds)))
            before = broker.threads()
            idle = []
            for _ in range(args.idle_sockets):
                sock = socket.create_connection(("127.0.0.1", broker.prom))
                idle.append(sock)
            time.sleep(1.0)  # let the server take them (a benchmark, not a test)
            result["threads"] = {"before": before, f"with_{args.idle_sockets}_idle_sockets": broker.threads()}
            for sock in idle:
                sock.close()
        finally:
            broker.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
