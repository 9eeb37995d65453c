"""The sink's exactly-once (docs/spark.md, "Exactly once"): a task that Spark retries after part of its rows
were stored, and a streaming query whose driver is killed mid-batch and restarted from its checkpoint,
leave each row in the topic once. One driver process (tests/spark/sink_driver.py) runs the retried task
and the first run of the query, which the test kills; the restart runs in this worker's Spark session."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ister.client.blocking import BlockingClient
from tests.integration.harness import BrokerProcess, broker_metric
from tests.spark.sink_driver import FAIL_AFTER, environment, stored
from tests.spark.test_spark_source import new_topic, produce
from tests.support import until_sync

pytestmark = pytest.mark.timeout(400)

DUPLICATES = "ister_publish_duplicates_total"


def values(spark: Any, broker: BrokerProcess, topic: str) -> list[bytes]:
    df = spark.read.format("ister").option("ister.service.url", broker.url).option("topic", topic).load()
    return [r.value for r in df.select("value").collect()]


def duplicates(broker: BrokerProcess) -> float:
    return broker_metric(broker.metrics_url, DUPLICATES) or 0.0


def test_a_retried_task_and_a_killed_driver_store_each_row_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    retried, source, target = new_topic("eo_retry"), new_topic("eo_in"), new_topic("eo_out")
    produce(broker.url, source, 0, 1000)  # keys k0..k4: the target's 3 partitions by key
    with BlockingClient(broker.url) as client, client.producer(target, partitions=3):
        pass
    checkpoint = tmp_path / "cp"
    log_path = tmp_path / "driver.log"
    cmd = [sys.executable, "-m", "tests.spark.sink_driver", broker.url, retried, source, target]
    cmd.append(str(checkpoint))
    held = tmp_path / "held"
    env = environment(str(held))
    before = duplicates(broker)
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            # The query's first micro-batch (400 rows) is in, and its second holds at row 700 after the
            # publish batches its rows 400..699 filled (50 rows each) were stored: kill the driver there.
            until_sync(
                lambda: held.exists() or driver.poll() is not None,
                lambda: "the query holding in batch 2; driver log: " + log_path.read_text()[-2000:],
                300,
            )
            assert driver.poll() is None, log_path.read_text()[-3000:]
            driver.send_signal(signal.SIGKILL)
            driver.wait()
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    text = log_path.read_text()
    assert "batch write done" in text, text[-3000:]
    assert "injected failure at b'r250'" in text  # the retry happened
    # The retried task: its first attempt had stored at least FAIL_AFTER rows, answered again, not stored.
    assert sorted(values(spark, broker, retried)) == sorted(f"r{i}".encode() for i in range(600))
    after_retry = duplicates(broker)
    assert after_retry - before >= FAIL_AFTER
    at_kill = stored(broker.url, target)
    assert 500 <= at_kill < 1000

    # The restart replays the killed micro-batch from the checkpoint (same query id, batch id, tasks).
    query = (
        spark.readStream.format("ister")
        .option("ister.service.url", broker.url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .select("value", "key")
        .writeStream.format("ister")
        .option("ister.service.url", broker.url)
        .option("topic", target)
        .option("batchMaxMessages", "50")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    got = values(spark, broker, target)
    assert len(got) == 1000 and sorted(got) == sorted(f"m{i:06d}".encode() + b"x" * 90 for i in range(1000))
    assert duplicates(broker) - after_retry >= at_kill - 400  # the replay met what batch 1 had stored
