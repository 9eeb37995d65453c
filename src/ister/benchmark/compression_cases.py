"""`ister bench --cases compression` (docs/compression.md, docs/benchmarks.md): for each codec, on 1 KiB
JSON log lines and on 1 KiB random bytes, the stored size ratio and the batch API's durable publish and
consume + ack throughput, beside no compression, in one run against one broker. "zstd+dict": the topic's
policy is zstd with a trained dictionary (docs/compression.md, "Dictionaries"), trained by the broker on a
warm-up of other log lines sent plain; then the producer compresses with it (it learns and fetches it when
it opens). "zstd+dict/b": the same, but the producer sends plain records and the broker compresses them.
Consumers take the records as stored and decompress them with the dictionary they fetch.

The ratio is what the WAL stores: the records' plain msgpack bytes over their stored (compressed) bytes,
computed with the same codec code the client uses, one record at a time as stored."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from ister.benchmark.ister_cases import consume_ack, publish
from ister.benchmark.payloads import log_lines, random_payloads
from ister.client import Client
from ister.core import zdict
from ister.core.compression import parse_codec, wrap, wrap_with_dictionary
from ister.core.record import StoredMessage, encode_message
from ister.wire.gen import ister_v1_pb2 as ister_pb
from ister.wire.gen import ister_v1_pb2_grpc as ister_grpc

CODECS = ("none", "lz4", "zstd", "snappy", "gzip", "zstd+dict", "zstd+dict/b")
PRODUCER_CODEC = {"zstd+dict": "zstd", "zstd+dict/b": "none"}  # the policy's dictionary: who compresses
WARMUP = 600  # plain records the broker samples (500) before the measured run, other lines than measured
DICT_WAIT_SECONDS = 60.0
DISTINCT = 1024  # distinct payloads of each kind, sent in turn
CpuProbe = Callable[[], float]


def _records(payloads: list[bytes]) -> list[bytes]:
    return [encode_message(StoredMessage(p, 1_765_000_000_000, 1, "bench-publisher")) for p in payloads]


def stored_ratio(codec: str, payloads: list[bytes], warmup: list[bytes] | None = None) -> float:
    """Plain over stored record bytes; "zstd+dict": with a dictionary trained on `warmup` (as the broker
    trains it on the topic's first records), on `payloads` it never saw."""
    records = _records(payloads)
    if codec.startswith("zstd+dict"):
        registry = zdict.DictionaryRegistry()
        dict_id = registry.add(zdict.train(_records(warmup or [])[:500], zdict.new_id()))
        stored = sum(len(wrap_with_dictionary(dict_id, r, registry)) for r in records)
    else:
        c = parse_codec(codec)
        stored = sum(len(wrap(c, r)) for r in records)
    return sum(map(len, records)) / stored


async def dictionary_topic(url: str, admin_addr: str, topic: str, warmup: list[bytes]) -> None:
    """`topic` with the zstd-with-dictionary policy and its dictionary trained on `warmup` (sent plain)."""
    async with Client(url) as c:
        p = await c.producer(topic, "bench-warmup")
        await p.send_batch(warmup[:1])  # the topic exists: its policy can be set
        async with grpc.aio.insecure_channel(admin_addr) as channel:
            admin = ister_grpc.IsterAdminStub(channel)
            set_ = ister_pb.SetCompressionRequest(topic=topic, compression="zstd", dictionary=True)
            await admin.SetCompression(set_, timeout=30)
            await p.send_batch(warmup[1:])
            request = ister_pb.GetCompressionRequest(topic=topic)
            async with asyncio.timeout(DICT_WAIT_SECONDS):  # trained in the broker's background: polled
                while True:
                    if (await admin.GetCompression(request, timeout=30)).dictionary_id:
                        break
                    await asyncio.sleep(0.1)
        await p.close()


async def run(
    url: str,
    messages: int,
    *,
    broker_cpu: CpuProbe | None = None,
    progress: Callable[[str], None] = print,
    admin_addr: str | None = None,
) -> dict[str, Any]:
    data = {"json": log_lines(DISTINCT), "random": random_payloads(DISTINCT)}
    warmups = {"json": log_lines(WARMUP, seed=99), "random": random_payloads(WARMUP, seed=99)}
    rows: list[dict[str, Any]] = []
    for kind, payloads in data.items():
        for codec in CODECS:
            dictionary = codec.startswith("zstd+dict")
            if dictionary and admin_addr is None:
                continue  # the policy is set through the admin API
            progress(f"compression: {codec} on {kind}")
            name = codec.replace("+", "_").replace("/", "_")
            topic = f"/default/bench_compression_{kind}_{name}_{int(time.time())}"
            if dictionary:
                assert admin_addr is not None
                await dictionary_topic(url, admin_addr, topic, warmups[kind])
            pub = await publish(
                url,
                topic,
                messages,
                broker_cpu=broker_cpu,
                payloads=payloads,
                compression=PRODUCER_CODEC.get(codec, codec),
                time_limit=20.0,
            )
            con = await consume_ack(url, topic, pub["total_published"], broker_cpu=broker_cpu)
            size = sum(map(len, payloads)) / len(payloads)
            rows.append(
                {
                    "payload": kind,
                    "codec": codec,
                    "ratio": round(stored_ratio(codec, payloads, warmups[kind]), 3),
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
        f"  {'payload':<7} {'codec':<11} {'ratio':>6} {'publish msg/s':>14} {'MB/s':>7} {'µs/msg':>7} "
        f"{'consume msg/s':>14} {'µs/msg':>7}",
    ]
    for r in result["runs"]:
        lines.append(
            f"  {r['payload']:<7} {r['codec']:<11} {r['ratio']:>6.2f} {r['publish_msgs_per_s']:>14,.0f} "
            f"{r['publish_mb_per_s']:>7.1f} {r['publish_broker_cpu_us_per_msg']:>7.1f} "
            f"{r['consume_msgs_per_s']:>14,.0f} {r['consume_broker_cpu_us_per_msg']:>7.1f}"
        )
    return "\n".join(lines)
