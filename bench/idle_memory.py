"""What idle streams cost in memory (session 18): a fresh standalone broker, then

* publish: `--topics` reliable topics, one producer each (one batch-API Publish stream), each sends one
  batch of 1,024 messages of 100 bytes and stays open: the broker's RSS before and after;
* consume: `--consumers` topics with 1,000 messages of 1 KB each, read and acked by one consumer each
  (window 1,000), which then waits: the broker's RSS before and after, and the memory still allocated in
  the client process (tracemalloc) once every consumer has taken and acked everything and waits.

usage: python bench/idle_memory.py [--topics 1000] [--consumers 50] [--json]

Run it against another checkout with `PYTHONPATH=<checkout>/src python <checkout>/bench/idle_memory.py`.
Not a test; figures depend on the machine (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ister.benchmark.broker import BenchBroker
from ister.benchmark.stats import PAYLOAD
from ister.client import Client


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) / 1024


async def publish(broker: BenchBroker, topics: int) -> dict[str, Any]:
    async with Client(broker.url) as client:
        producer = await client.producer("/default/idle-pub", "p", reliable=True, partitions=topics)
        await producer.send_batch([PAYLOAD] * topics)  # every stream open
        before = rss_mib(broker.pid)
        await producer.send_batch([PAYLOAD] * (1024 * topics))  # one batch of 1,024 per topic
        after = rss_mib(broker.pid)
        await producer.close()
    return {"topics": topics, "broker_rss_mib_before": before, "broker_rss_mib_after": after}


async def consume(broker: BenchBroker, consumers: int) -> dict[str, Any]:
    async with Client(broker.url) as client:
        names = [f"/default/idle-con-{i}" for i in range(consumers)]
        producers = [await client.producer(t, "p", reliable=True) for t in names]
        subs = [await client.consumer(t, "s", window=1000) for t in names]
        before = rss_mib(broker.pid)
        tracemalloc.start(1)
        for producer in producers:
            await producer.send_batch([b"q" * 1000] * 1000)
        for sub in subs:
            got = 0
            while got < 1000:
                batch = await sub.receive_batch(max_messages=1000)
                got += len(batch)
                for m in batch:
                    await sub.ack(m)
            del batch
        await asyncio.sleep(1.5)  # the acks are sent; every stream waits
        gc.collect()
        traced = sum(s.size for s in tracemalloc.take_snapshot().statistics("filename"))
        tracemalloc.stop()
        after = rss_mib(broker.pid)
        for c in subs:
            await c.close()
        for p in producers:
            await p.close()
    return {
        "consumers": consumers,
        "broker_rss_mib_before": before,
        "broker_rss_mib_after": after,
        "client_traced_mb_while_idle": traced / 1e6,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with BenchBroker() as broker:
        pub = await publish(broker, args.topics)
    with BenchBroker() as broker:
        con = await consume(broker, args.consumers)
    return {"publish": pub, "consume": con}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
