"""`ister bench --cases compression` (docs/compression.md, docs/benchmarks.md): for each codec, on 1 KiB
JSON log lines and on 1 KiB random bytes, the stored size ratio and the batch API's durable publish and
consume + ack throughput, beside no compression, in one run against one broker.

The ratio is what the WAL stores: the records' plain msgpack bytes over their stored (compressed) bytes,
computed with the same codec code the client uses, one record at a time as stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ister.benchmark.ister_cases import consume_ack, publish
from ister.benchmark.payloads import log_lines, random_payloads
from ister.core.compression import parse_codec, wrap
from ister.core.record import StoredMessage, encode_message

CODECS = ("none", "lz4", "zstd", "snappy", "gzip")
DISTINCT = 1024  # distinct payloads of each kind, sent in turn
CpuProbe = Callable[[], float]


def stored_ratio(codec: str, payloads: list[bytes]) -> float:
    records = [encode_message(StoredMessage(p, 1_765_000_000_000, 1, "bench-publisher")) for p in payloads]
    c = parse_codec(codec)
    stored = sum(len(wrap(c, r)) for r in records)
    return sum(map(len, records)) / stored


async def run(
    url: str, messages: int, *, broker_cpu: CpuProbe | None = None, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    data = {"json": log_lines(DISTINCT), "random": random_payloads(DISTINCT)}
    rows: list[dict[str, Any]] = []
    for kind, payloads in data.items():
        for codec in CODECS:
            progress(f"compression: {codec} on {kind}")
            topic = f"/default/bench_compression_{kind}_{codec}_{int(time.time())}"
            pub = await publish(
                url,
                topic,
                messages,
                broker_cpu=broker_cpu,
                payloads=payloads,
                compression=codec,
                time_limit=20.0,
            )
            con = await consume_ack(url, topic, pub["total_published"], broker_cpu=broker_cpu)
            size = sum(map(len, payloads)) / len(payloads)
            rows.append(
                {
                    "payload": kind,
                    "codec": codec,
                    "ratio": round(stored_ratio(codec, payloads), 3),
                    "publish_msgs_per_s": pub["msgs_per_s"],
                    "publish_mb_per_s": pub["msgs_per_s"] * size / 1e6,
                    "publish_broker_cpu_us_per_msg": pub["broker_cpu_us_per_msg"],
                    "consume_msgs_per_s": con["msgs_per_s"],
                    "consume_broker_cpu_us_per_msg": con["broker_cpu_us_per_msg"],
                    "messages": pub["messages"],
                }
            )
    return {"messages": messages, "payload_bytes": 1024, "runs": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"compression ({result['messages']:,} messages of about 1 KiB per run; "
        "ratio = plain / stored record bytes):",
        f"  {'payload':<7} {'codec':<7} {'ratio':>6} {'publish msg/s':>14} {'MB/s':>7} {'µs/msg':>7} "
        f"{'consume msg/s':>14} {'µs/msg':>7}",
    ]
    for r in result["runs"]:
        lines.append(
            f"  {r['payload']:<7} {r['codec']:<7} {r['ratio']:>6.2f} {r['publish_msgs_per_s']:>14,.0f} "
            f"{r['publish_mb_per_s']:>7.1f} {r['publish_broker_cpu_us_per_msg']:>7.1f} "
            f"{r['consume_msgs_per_s']:>14,.0f} {r['consume_broker_cpu_us_per_msg']:>7.1f}"
        )
    return "\n".join(lines)
