"""Per-record cost of the publish path's codec, in-process: the client encoding a PublishBatch's records
(`encode_records`) and the broker checking them (`decode_batch`), for 100-byte messages that each carry
their own attribute (as the Spark sink's batch-id header) and for messages without attributes.

usage: python bench/publish_codec_bench.py [--records 10000] [--json]

Best of 20 runs over one batch of N records; microseconds per record. Not a test.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ister.client.records import encode_records
from ister.server.ister_api import decode_batch
from ister.wire.gen import ister_v1_pb2 as pb


def best_us_per_record(fn: Callable[[], Any], n: int, runs: int = 20) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best / n * 1e6, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n, as_json = args.records, args.json
    producer = SimpleNamespace(id=7, name="bench-producer")
    # The reliable-topic form (no StoredMessage needed); older code had no `messages` argument.
    reliable = {"messages": False} if "messages" in inspect.signature(decode_batch).parameters else {}
    results: dict[str, dict[str, float]] = {}
    for case, attrs in (("one_attribute", True), ("no_attributes", False)):
        segments = [
            [[b"x" * 100], 1_700_000_000_000, {"x-ister-spark-batch": f"q:0:0:{i}"} if attrs else {}, None]
            for i in range(n)
        ]
        records = encode_records(segments, n, producer.id, producer.name)
        batch = pb.PublishBatch(sequence=1, records=records, count=n)
        results[case] = {
            "client_encode_us": best_us_per_record(
                lambda s=segments: encode_records(s, n, producer.id, producer.name), n
            ),
            "broker_check_us": best_us_per_record(
                lambda b=batch: decode_batch(b, producer, 0, **reliable),
                n,  # type: ignore[arg-type]
            ),
        }
    if as_json:
        print(json.dumps(results))
        return
    for case, r in results.items():
        encode, check = r["client_encode_us"], r["broker_check_us"]
        print(f"{case:>14}: client encode {encode} µs/record, broker check {check} µs/record")


if __name__ == "__main__":
    main()
