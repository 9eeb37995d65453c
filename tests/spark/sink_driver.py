"""A Spark driver for tests/spark/test_spark_exactly_once.py, run as its own process (the test kills it):

1. a batch write whose one task fails on its first attempt at row FAIL_AT, once the 200 rows before it are
   stored (Spark retries it: `local[2,2]` allows two attempts);
2. a streaming query from `source` into `target` that holds at row HOLD_AT of its second micro-batch,
   once the publish batches its rows before it filled are stored, until the test kills this process.

The failure and the hold are placed in the sink's workers by tests/spark/inject/sitecustomize.py.

python -m tests.spark.sink_driver URL RETRY_TOPIC SOURCE TARGET CHECKPOINT
"""

from __future__ import annotations

import os
import sys
from typing import Any

FAIL_AT = b"r250"  # the batch write's first attempt fails at this row
FAIL_AFTER = 200  # rows stored by then (publish batches of 50)
HOLD_AT = b"m000700"  # the streaming query holds at this row (of its second micro-batch)
CHUNK = "50"  # messages per publish batch: several batches stored before the failure or the hold


def stored(url: str, topic: str) -> int:
    from ister.client.blocking import BlockingClient

    with BlockingClient(url) as client:
        return sum(client.offsets(p).next for p in client.partitions(topic))


def environment(held: str) -> dict[str, str]:
    """The driver's environment: the injection on the workers' path, and what it injects (`held`: the file
    the hold creates)."""
    inject = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inject")
    path = os.pathsep.join(p for p in (inject, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "ISTER_TEST_SINK_FAIL": FAIL_AT.decode(),
        "ISTER_TEST_SINK_HOLD": HOLD_AT.decode(),
        "ISTER_TEST_SINK_HELD": held,
    }


def main(url: str, retry_topic: str, source: str, target: str, checkpoint: str) -> None:
    from pyspark.sql import functions as F

    from ister.spark.pipeline import local_session

    spark = local_session("local[2,2]", **{"spark.sql.execution.arrow.maxRecordsPerBatch": CHUNK})

    rows = spark.range(0, 600, numPartitions=1).select(F.concat(F.lit("r"), F.col("id")).alias("value"))
    sink: dict[str, Any] = {"ister.service.url": url, "topic": retry_topic, "batchMaxMessages": CHUNK}
    rows.write.format("ister").options(**sink).mode("append").save()
    print("batch write done", flush=True)

    query = (
        spark.readStream.format("ister")
        .option("ister.service.url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .select("value", "key")
        .writeStream.format("ister")
        .options(**{**sink, "topic": target})
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("the query ended: it should have been killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:6])
