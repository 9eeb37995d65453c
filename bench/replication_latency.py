"""End-to-end latency at 1,000 msg/s on a fresh three-broker cluster, RF 1 against RF 3 (issue 16).

usage: python bench/replication_latency.py [--runs 2] [--seconds 8] [--factors 1,3] [--json]

For each run and replication factor: etcd and three `ister broker` processes in cluster mode (fsync always,
no durable tier), one reliable topic, a batch-API producer sending one message every millisecond (open
loop: a message is sent on time whatever the previous one's ack) and a consumer in another process
acknowledging each; the latency is send -> receive. Unlike `ister bench --cases replicated`, nothing runs
before it (no 1,000,000-message publish whose aftermath the brokers are still working through). Also the
brokers' CPU per message (all three processes, every thread) and the host's CPU use over the case.

Brokers run this checkout's code (src/ goes first on PYTHONPATH). Not a test: timings depend on the machine
and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])

import uvloop  # noqa: E402

from ister.benchmark import ister_cases  # noqa: E402
from ister.benchmark.cluster import BenchCluster  # noqa: E402
from ister.benchmark.stats import host_cpu_share, host_cpu_ticks  # noqa: E402


def one(factor: int, seconds: float) -> dict[str, Any]:
    cluster = BenchCluster(3, replication_factor=factor)
    cluster.start()
    try:
        before = host_cpu_ticks()
        result = uvloop.run(
            ister_cases.e2e_latency(
                cluster.url, "/default/latency", seconds=seconds, broker_cpu=cluster.cpu_seconds
            )
        )
        result["host_cpu"] = host_cpu_share(before, host_cpu_ticks())
        return result
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--factors", default="1,3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    factors = [int(f) for f in args.factors.split(",")]
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        runs.append({f"rf{f}": one(f, args.seconds) for f in factors})
    if args.json:
        print(json.dumps(runs, indent=1))
        return
    for i, run in enumerate(runs, 1):
        for key, r in run.items():
            lat = r["latency_us"]
            print(
                f"run {i} {key}: p50 {lat['p50'] / 1e3:.2f} ms, p99 {lat['p99'] / 1e3:.2f} ms, "
                f"p99.9 {lat['p999'] / 1e3:.2f} ms; broker CPU {r['broker_cpu_us_per_msg']:.0f} µs/msg, "
                f"host {r['host_cpu']['busy_pct']:.0f} % busy"
            )
        if "rf1" in run and "rf3" in run:
            ratio = run["rf3"]["latency_us"]["p99"] / run["rf1"]["latency_us"]["p99"]
            print(f"run {i}: RF 3 / RF 1 p99 x{ratio:.2f}")
    if len(runs) > 1 and all("rf1" in r and "rf3" in r for r in runs):
        ratios = [r["rf3"]["latency_us"]["p99"] / r["rf1"]["latency_us"]["p99"] for r in runs]
        print(f"median RF 3 / RF 1 p99 x{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
