"""Spark connector benchmarks (issue 7): batch read of objects into Parquet, the export job, the sink.

usage: python bench/spark_bench.py [--messages 1000000] [--parquet] [--json]

One standalone broker whose WAL segments (8 MiB) are exported to its file:// tier within a second and not
kept locally; N reliable 100-byte messages produced through the batch API; once every offset is in objects,
on a local[2] Spark session:

* objects → parquet: `spark.read.format("ister")` of the whole topic written as Parquet (rows/s);
* broker path → parquet: the same read with the object store made unreachable from Spark
  (`ister.storage.url=memory://`), so every record comes through the broker's Read RPC (rows/s);
* export job: `ister pipeline export`'s query (availableNow, partitioned by topic and date) on the topic
  (rows/s);
* sink: `df.write.format("ister")` of N 100-byte rows (2 tasks) into a new reliable topic, with and without
  the per-row batch-id header (rows/s), as a ratio to the client's own batch publish of the same N
  messages at the start of the run.

* with --parquet the broker also writes each object's Parquet copy (storage.durable.parquet), and one more
  read is measured: `ister.spark.read` (history through Spark's own Parquet reader from the copies, the
  rest through the format) written as Parquet (rows/s); "objects → parquet" then reads the copies in the
  format's Python workers (pyarrow) instead of decoding the objects.

* baseline (the peer): Spark's own in-JVM source (`spark.range`) shaped like the same rows (100-byte value,
  same columns and types, 4 partitions) written as Parquet: what this machine's local[2] Spark can do at
  all, with no Python in the path. Figures are also given as a ratio to it.

Every step runs twice and the second run is timed (the first warms the JVM's JIT and the Python workers).
Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ister.client import Client
from ister.devcluster.ports import free_port, wait_port
from ister.spark.pipeline import ExportJob, local_session
from ister.storage.objects.segment import list_topic_files
from ister.storage.objects.store import open_store

TOPIC = "/default/spark_bench"


def start_broker(root: Path, parquet: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    config = root / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 8 << 20},
                "storage": {
                    "durable": {
                        "export_interval_seconds": 0.5,
                        "segment_max_age_seconds": 1,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                        **({"parquet": True} if parquet else {}),
                    }
                },
            }
        )
    )
    port = free_port()
    log = open(root / "broker.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "ister.cli", "broker", "--data-dir", str(root / "data"), "--config-file",
         str(config), "--broker-addr", f"127.0.0.1:{port}", "--admin-addr", f"127.0.0.1:{free_port()}",
         "--prom-exporter", f"127.0.0.1:{free_port()}", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_port(port, proc, 30.0, "broker")
    return proc, f"http://127.0.0.1:{port}"


async def produce(url: str, count: int) -> float:
    payload = b"x" * 100
    start = time.monotonic()
    async with Client(url) as client:
        producer = await client.producer(TOPIC, reliable=True)
        window: list[asyncio.Task[list[int]]] = []
        for _ in range(0, count, 10_000):
            window.append(asyncio.ensure_future(producer.send_batch([payload] * 10_000)))
            if len(window) >= 8:
                await window.pop(0)
        for task in window:
            await task
        await producer.close()
    return time.monotonic() - start


async def exported_until(data: Path, parquet: bool = False) -> int:
    """The offset below which every record is in objects (and, with `parquet`, has its Parquet copy)."""
    store = open_store(f"file://{data / 'objects'}")
    found, copies = await list_topic_files(store, TOPIC.strip("/"))
    if parquet:
        found = [f for f in found if (f[0], f[1]) in copies]
    at = 0
    for first, last, _ in found:
        if first != at:
            break
        at = last + 1
    return at


def ister_df(spark: Any, url: str, **options: str) -> Any:
    reader = spark.read.format("ister").option("ister.service.url", url).option("topic", TOPIC)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def baseline_df(spark: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n, numPartitions=4).select(
        F.lit(None).cast("binary").alias("key"),
        F.expr("cast(repeat('x', 100) as binary)").alias("value"),
        F.lit(TOPIC).alias("topic"),
        F.lit(-1).alias("partition"),
        F.col("id").alias("offset"),
        F.current_timestamp().alias("timestamp"),
        F.lit(0).alias("timestampType"),
        F.lit("ister-producer-0123456789ab").alias("producer"),
        F.lit(None).cast("long").alias("schemaId"),
        F.lit(None).cast("int").alias("schemaVersion"),
    )


def timed_parquet(spark: Any, make: Any, out: Path, n: int) -> dict[str, float]:
    """Second of two runs (the first warms the JIT and the workers); the row count is checked."""
    for _ in range(2):
        start = time.monotonic()
        make().write.mode("overwrite").parquet(str(out))
        elapsed = time.monotonic() - start
    rows = spark.read.parquet(str(out)).count()
    assert rows == n, rows
    return {"seconds": round(elapsed, 2), "rows_per_s": round(n / elapsed)}


def timed_sink(spark: Any, url: str, n: int, header: str) -> dict[str, float]:
    """`df.write.format("ister")` of n 100-byte rows into a new reliable topic (second of two runs),
    with or without the per-row batch-id header; the topic's head is checked."""
    from pyspark.sql import functions as F

    for run in range(2):
        topic = f"{TOPIC}_sink_{header}_{run}"
        df = spark.range(n, numPartitions=2).select(F.expr("cast(repeat('x', 100) as binary)").alias("value"))
        start = time.monotonic()
        df.write.format("ister").option("ister.service.url", url).option("topic", topic).option(
            "writeIdempotencyHeader", header
        ).mode("append").save()
        elapsed = time.monotonic() - start
    head = asyncio.run(head_of(url, topic))
    assert head == n, head
    return {"seconds": round(elapsed, 2), "rows_per_s": round(n / elapsed)}


async def head_of(url: str, topic: str) -> int:
    async with Client(url) as client:
        return (await client.offsets(topic)).next


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--parquet", action="store_true", help="the broker writes Parquet copies (and measure them)"
    )
    args = ap.parse_args()
    n = args.messages
    root = Path(tempfile.mkdtemp(prefix="ister-spark-bench-"))
    broker, url = start_broker(root, args.parquet)
    result: dict[str, Any] = {"messages": n, "parquet_copies": args.parquet}
    try:
        result["produce_s"] = round(asyncio.run(produce(url, n)), 2)
        deadline = time.monotonic() + 300
        while asyncio.run(exported_until(root / "data", args.parquet)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("export did not finish")
            time.sleep(0.5)
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = local_session("local[2]")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            result["baseline_jvm_to_parquet"] = timed_parquet(
                spark, lambda: baseline_df(spark, n), root / "b", n
            )
            result["objects_to_parquet"] = timed_parquet(spark, lambda: ister_df(spark, url), root / "o", n)
            if args.parquet:
                import ister.spark

                result["read_api_to_parquet"] = timed_parquet(
                    spark,
                    lambda: ister.spark.read(spark, {"ister.service.url": url, "topic": TOPIC}),
                    root / "p",
                    n,
                )
            result["broker_to_parquet"] = timed_parquet(
                spark, lambda: ister_df(spark, url, **{"ister.storage.url": "memory://"}), root / "r", n
            )
            for run in range(2):
                job = ExportJob(service_url=url, topics=[TOPIC], path=str(root / f"table{run}"))
                start = time.monotonic()
                query = job.start(spark)
                query.awaitTermination()
                secs = time.monotonic() - start
                rows = sum(p["numInputRows"] for p in query.recentProgress)
                assert rows == n, rows
            result["export_job"] = {"seconds": round(secs, 2), "rows_per_s": round(n / secs)}
            for header in ("true", "false"):
                result[f"sink_header_{header}"] = timed_sink(spark, url, n, header)
            base = result["baseline_jvm_to_parquet"]["rows_per_s"]
            for k in ("objects_to_parquet", "read_api_to_parquet", "broker_to_parquet", "export_job"):
                if k in result:
                    result[k]["ratio_to_baseline"] = round(result[k]["rows_per_s"] / base, 2)
            publish = n / result["produce_s"]  # the client's own batch publish, same broker, same run
            for header in ("true", "false"):
                sink = result[f"sink_header_{header}"]
                sink["ratio_to_client_publish"] = round(sink["rows_per_s"] / publish, 2)
        finally:
            spark.stop()
    finally:
        broker.kill()
        broker.wait()
        result["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
