"""Reset a cursor by publish time on a topic of 1,000,000 messages (issue 37): time per lookup.

usage: python bench/reset_by_time_bench.py [--messages 1000000] [--lookups 200] [--json]

Starts a standalone `ister broker` (fsync always; the durable tier exports closed 16 MiB WAL segments every
second, so most of the topic is in `.dnb1` objects and its tail in the WAL), publishes the messages with
the batch API (`send_batch`, 1,000 per batch, 100-byte payloads; the client stamps each batch's publish
time), waits until the objects are written, then resets one subscription `--lookups` times to random
publish times between the first and the last message's (`Client.seek(topic, sub, datetime)`, the
`SeekCursor` RPC: the owner finds the offset from the units' publish-time ranges and a search inside one
unit, rebuilds the subscription there and persists the cursor). Each answer is checked: the record at the
answer was published at or after the time, the one before it earlier. p50/p99/max per lookup, measured at
the client (one gRPC round trip included).

Not a test: numbers depend on the machine and its load. Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import support

from ister.benchmark.broker import BenchBroker
from ister.client import Client
from ister.core.record import decode_message

TOPIC = "/default/reset-by-time"
ENV = {
    "ISTER_WAL__SEGMENT_MAX_BYTES": str(16 * 1024 * 1024),
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "1",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "5",
}


async def record_time(client: Client, offset: int) -> int:
    async for batch in client.read(TOPIC, offset, offset + 1):
        return decode_message(batch[0][1]).publish_time
    raise RuntimeError(f"offset {offset} is not stored")


async def run(messages: int, lookups: int) -> dict[str, float | int]:
    with BenchBroker(env=ENV) as broker:
        async with Client(broker.url) as client:
            producer = await client.producer(TOPIC, "bench")
            payload = b"x" * 100
            started = time.perf_counter()
            for _ in range(0, messages, 1000):
                await producer.send_batch([payload] * 1000)
            publish_s = time.perf_counter() - started
            await producer.close()
            offsets = await client.offsets(TOPIC)
            objects = Path(broker.tmp) / "data" / "objects" / "default" / "reset-by-time"
            await support.until(lambda: list(objects.glob("*.dnb1")), "an exported object", within=120)
            first, last = await record_time(client, 0), await record_time(client, offsets.next - 1)
            await client.seek(TOPIC, "bench-sub", "latest")  # create the subscription
            rng = random.Random(37)
            took: list[float] = []
            for _ in range(lookups):
                t_ms = rng.randint(first, last)
                at = datetime.fromtimestamp(t_ms / 1000, tz=UTC)
                t0 = time.perf_counter()
                moved = await client.seek(TOPIC, "bench-sub", at)
                took.append((time.perf_counter() - t0) * 1000)
                n = moved[0].next
                assert await record_time(client, n) >= t_ms, (t_ms, n)
                assert n == 0 or await record_time(client, n - 1) < t_ms, (t_ms, n)
            took.sort()
            return {
                "messages": offsets.next,
                "objects": len(list(objects.glob("*.dnb1"))),
                "publish_s": round(publish_s, 2),
                "lookups": lookups,
                "p50_ms": round(statistics.median(took), 2),
                "p99_ms": round(took[int(len(took) * 0.99) - 1], 2),
                "max_ms": round(took[-1], 2),
                "mean_ms": round(statistics.fmean(took), 2),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.messages, args.lookups))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['messages']:,} messages ({result['objects']} objects + the WAL tail), "
        f"published in {result['publish_s']} s; {result['lookups']} resets by time: "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms, "
        f"mean {result['mean_ms']} ms per lookup"
    )


if __name__ == "__main__":
    main()
