"""Where the 1,000-topic publish loses to the one-topic publish (issue 14 item 2): the broker's event-loop
CPU, its other threads' CPU and the loop's page faults per message, and the broker's RSS afterwards.

usage: python bench/many_topics_cpu.py [--topics 1,1000] [--messages 4000000] [--rounds 1]

For each count, a fresh `ister broker` (fsync always): a 200,000-message warm-up publish, then
`--messages` through the batch API exactly as `bench/topic_count_bench.py`'s throughput part sends them,
with the broker's threads read from /proc/PID/task/*/stat before and after. Prints one JSON line per run.
Set ISTER_WAL__CACHE_MAX_BYTES / ISTER_WAL__CACHE_TOTAL_BYTES in the environment to try cache settings.
Not a test: timings depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ister.benchmark.broker import BenchBroker
from topic_count_bench import publish


def threads(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread: (minor page faults, CPU ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[tid] = (int(fields[7]), int(fields[11]) + int(fields[12]))
    return out


def rss(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def one(topics: int, messages: int) -> dict[str, float]:
    with BenchBroker() as broker:
        pid = broker.pid
        await publish(broker.url, "/default/tp", topics, 200_000)
        before = threads(pid)
        result = await publish(broker.url, "/default/tp", topics, messages)
        after = threads(pid)
        rss_mib = rss(pid)
    sent, tick = result["messages"], os.sysconf("SC_CLK_TCK")
    loop = str(pid)
    others = sum(c - before.get(t, (0, 0))[1] for t, (_, c) in after.items() if t != loop)
    return {
        "topics": topics,
        "msgs_per_s": round(result["msgs_per_s"]),
        "loop_cpu_us_per_msg": round((after[loop][1] - before[loop][1]) / tick / sent * 1e6, 2),
        "other_threads_cpu_us_per_msg": round(others / tick / sent * 1e6, 2),
        "loop_faults_per_1k_msgs": round((after[loop][0] - before[loop][0]) / sent * 1000, 1),
        "rss_mib": round(rss_mib),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="1,1000")
    parser.add_argument("--messages", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for topics in (int(t) for t in args.topics.split(",")):
            print(json.dumps(asyncio.run(one(topics, args.messages))), flush=True)


if __name__ == "__main__":
    main()
