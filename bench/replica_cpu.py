"""CPU per message of each broker of a three-broker cluster during e2e at 1,000 msg/s (issue 16).

usage: python bench/replica_cpu.py [--factor 3] [--seconds 20]

A fresh cluster (`BenchCluster`: etcd and three `ister broker` processes, fsync always) with one reliable
topic at the given replication factor; the batch-API e2e case of `ister bench` runs for `--seconds`, and
between its 6th and 16th second every broker's threads are read from /proc/PID/task/*/stat. Prints the e2e
percentiles and, per broker (the topic's leader marked), its CPU in µs per message split by thread name
(Python threads all show as `python`; `event_engine` is gRPC's). Not a test. Results go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])

import uvloop  # noqa: E402

from ister.benchmark import ister_cases  # noqa: E402
from ister.benchmark.cluster import BenchCluster, owner_of  # noqa: E402
from ister.benchmark.stats import thread_deltas, thread_stats  # noqa: E402

RATE = 1000
WINDOW_S = 10.0


async def measure(cluster: BenchCluster, seconds: float) -> None:
    topic = "/default/latency"
    case = asyncio.ensure_future(
        ister_cases.e2e_latency(cluster.url, topic, seconds=seconds, broker_cpu=cluster.cpu_seconds)
    )
    await asyncio.sleep(6)
    owner = await owner_of(cluster.url, topic)
    before = {pid: thread_stats(pid) for pid in cluster.pids}
    await asyncio.sleep(WINDOW_S)
    after = {pid: thread_stats(pid) for pid in cluster.pids}
    result = await case
    lat = result["latency_us"]
    print(f"e2e p50 {lat['p50'] / 1000:.2f} ms, p99 {lat['p99'] / 1000:.2f} ms")
    per_msg = 1e6 / (RATE * WINDOW_S)
    for url, pid in zip(cluster.urls, cluster.pids, strict=True):
        role = "leader" if owner is not None and url.endswith(owner.rsplit(":", 1)[-1]) else "other"
        by_name: Counter[str] = Counter()
        for _, name, cpu, _ in thread_deltas(before[pid], after[pid]):
            by_name[name] += cpu
        split = {k: round(v * per_msg) for k, v in by_name.most_common(4)}
        print(f"  {role} pid {pid}: {sum(by_name.values()) * per_msg:.0f} µs/msg {split}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.seconds < 6 + WINDOW_S:
        parser.error(f"--seconds must be at least {6 + WINDOW_S:g}")
    cluster = BenchCluster(3, replication_factor=args.factor)
    cluster.start()
    try:
        uvloop.run(measure(cluster, args.seconds))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
