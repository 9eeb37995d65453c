"""Schema validation cost on publish (issue 17): batch-API publish through the Ister client to one broker,
with topic policy enforce + payload validation on a small Avro and a small JSON Schema, against the same
payloads on topics without a schema.

usage: python bench/schema_bench.py [--messages 300000] [--batch 4096] [--concurrency 8] [--fsync always]
       [--json]

Each case: a reliable topic, one producer, `--concurrency` send_batch calls of `--batch` messages in
flight, `--messages` in all; msg/s from the first send to the last acknowledgement (durable: fsync as
given). Payloads: an Avro record {id: long, name: string, score: double} (binary datum, ~20 bytes) and the
same record as JSON (~45 bytes). Not a test; numbers depend on the machine and its load. Results go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from typing import Any

import fastavro

from ister.benchmark.broker import BenchBroker
from ister.client import Client

AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": "double"},
    ],
}
JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": "number"}},
    "required": ["id", "name", "score"],
    "additionalProperties": False,
}


def avro_payloads(n: int) -> list[bytes]:
    parsed = fastavro.parse_schema(AVRO)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {"id": i, "name": f"sensor-{i % 100}", "score": i / 7})
        out.append(buf.getvalue())
    return out


def json_payloads(n: int) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"sensor-{i % 100}", "score": i / 7}).encode() for i in range(n)]


async def publish(
    c: Client, topic: str, payloads: list[bytes], total: int, batch: int, concurrency: int, **kw: Any
) -> float:
    p = await c.producer(topic, "bench", **kw)
    await p.send_batch(payloads[:batch])  # warm-up: topic loaded, schema cached on the broker
    chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]
    todo = [chunks[i % len(chunks)] for i in range(max(1, total // batch))]
    sem = asyncio.Semaphore(concurrency)

    async def one(chunk: list[bytes]) -> None:
        async with sem:
            await p.send_batch(chunk)

    start = time.perf_counter()
    await asyncio.gather(*(one(ch) for ch in todo))
    elapsed = time.perf_counter() - start
    await p.close()
    return sum(len(ch) for ch in todo) / elapsed


async def run(args: argparse.Namespace) -> dict[str, float]:
    sample = min(args.messages, 20_000)
    avro, js = avro_payloads(sample), json_payloads(sample)
    results: dict[str, float] = {}
    with BenchBroker(fsync=args.fsync) as broker:
        async with Client(broker.url) as c:
            for kind, schema_type, doc, payloads in (
                ("avro", "avro", AVRO, avro),
                ("json", "json_schema", JSON_SCHEMA, js),
            ):
                subject = f"bench-{kind}"
                await c.schemas.register(subject, schema_type, json.dumps(doc))
                plain, checked = f"/default/bench_{kind}_plain", f"/default/bench_{kind}_enforce"
                results[f"{kind} no validation"] = await publish(
                    c, plain, payloads, args.messages, args.batch, args.concurrency
                )
                await c.producer(checked, "setup", schema_subject=subject)
                await c.schemas.configure_topic(checked, subject, "enforce", True)
                results[f"{kind} enforce"] = await publish(
                    c, checked, payloads, args.messages, args.batch, args.concurrency, schema_subject=subject
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fsync", default="always")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        print(json.dumps(results))
        return
    for kind in ("avro", "json"):
        base, enforce = results[f"{kind} no validation"], results[f"{kind} enforce"]
        ratio = base / enforce
        print(f"{kind:5} no validation {base:>10,.0f} msg/s   enforce {enforce:>10,.0f} msg/s   {ratio:.2f}x")


if __name__ == "__main__":
    main()
