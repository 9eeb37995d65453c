"""A Spark driver for tests/spark/test_spark_exactly_once.py, run as its own process (the test kills it):

1. a batch write whose one task fails on its first attempt after part of its rows are stored (Spark retries
   it: `local[2,2]` allows two attempts);
2. a streaming query from `source` into `target` that holds at row HOLD_AT of its second micro-batch,
   after the rows before it are stored, until the test kills this process.

python -m tests.spark.sink_driver URL RETRY_TOPIC SOURCE TARGET CHECKPOINT
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

FAIL_AT = 250  # the batch write's first attempt fails at this row, once FAIL_AFTER rows are stored
FAIL_AFTER = 200
HOLD_AT = b"m000500"  # the streaming query holds at this row (of its second micro-batch)
CHUNK = "50"  # messages per publish batch: several batches stored before the failure or the hold


def stored(url: str, topic: str) -> int:
    from ister.client.blocking import BlockingClient

    with BlockingClient(url) as client:
        return sum(client.offsets(p).next for p in client.partitions(topic))


def main(url: str, retry_topic: str, source: str, target: str, checkpoint: str) -> None:
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    from ister.spark.pipeline import local_session

    spark = local_session("local[2,2]", **{"spark.sql.execution.arrow.maxRecordsPerBatch": CHUNK})

    def fail_once(i: int) -> str:
        ctx = TaskContext.get()
        if i == FAIL_AT and ctx is not None and ctx.attemptNumber() == 0:
            deadline = time.monotonic() + 60
            while stored(url, retry_topic) < FAIL_AFTER and time.monotonic() < deadline:
                time.sleep(0.1)
            raise RuntimeError(f"injected failure at row {i} (first attempt)")
        return f"r{i}"

    rows = spark.range(0, 600, numPartitions=1).select(F.udf(fail_once)("id").alias("value"))
    sink: dict[str, Any] = {"ister.service.url": url, "topic": retry_topic, "batchMaxMessages": CHUNK}
    rows.write.format("ister").options(**sink).mode("append").save()
    print("batch write done", flush=True)

    def hold(value: bytes) -> bool:
        if value.startswith(HOLD_AT):
            parent = os.getppid()
            deadline = time.monotonic() + 120
            while os.getppid() == parent and time.monotonic() < deadline:  # until Spark is killed
                time.sleep(0.2)
        return True

    query = (
        spark.readStream.format("ister")
        .option("ister.service.url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .where(F.udf(hold, "boolean")("value"))
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
