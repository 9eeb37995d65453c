"""Streaming queries over topics that move, appear, or lose their history."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess
from tests.spark.test_spark_source import new_topic, produce, run_available_now
from tests.support import until_sync

pytestmark = pytest.mark.timeout(300)


def parquet_offsets(spark: Any, out: Path, topic: str | None = None) -> list[int]:
    from pyspark.errors import AnalysisException

    try:
        df = spark.read.parquet(str(out))
    except AnalysisException:  # no batch committed yet
        return []
    if topic is not None:
        df = df.where(df.topic == topic)
    return sorted(r.offset for r in df.select("offset").collect())


async def test_a_topic_moved_between_brokers_during_a_streaming_query(
    spark: Any, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 32 * 1024},
                "storage": {
                    "durable": {
                        "url": f"file://{tmp_path / 'objects'}",  # one tier both brokers export to
                        "export_interval_seconds": 0.2,
                        "segment_max_age_seconds": 3600,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    }
                },
            }
        )
    )
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--config-file", str(config))
    await cluster.start()
    query = None
    try:
        topic = "/default/moving"
        url = cluster.brokers[0].url
        produce(url, topic, 0, 1500)
        out = tmp_path / "table"
        query = (
            spark.readStream.format("ister")
            .option("ister.service.url", url)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "400")
            .load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(out / "_checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start(str(out))
        )
        until_sync(lambda: len(parquet_offsets(spark, out)) >= 400, "the first batches", 120)
        before = (await cluster.assignments())[topic]
        await cluster.unload(topic)
        await cluster.until(lambda: _moved(cluster, topic, before), "the topic assigned to the other broker")
        produce(url, topic, 1500, 1000)  # the producer follows the move; offsets continue at 1500
        until_sync(lambda: len(parquet_offsets(spark, out)) >= 2500 or query.exception(), "all rows", 180)
        assert query.exception() is None
        query.stop()
        assert parquet_offsets(spark, out) == list(range(2500))  # every offset once, across the move
    finally:
        if query is not None and query.isActive:
            query.stop()
        await cluster.stop()


async def _moved(cluster: Cluster, topic: str, before: int) -> bool:
    owner = (await cluster.assignments()).get(topic)
    return owner is not None and owner != before


@pytest.fixture(scope="module")
def admin_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.spark.conftest import durable_config

    root = tmp_path_factory.mktemp("spark-admin")
    b = BrokerProcess(root / "data", "--config-file", str(durable_config(root / "ister.yml")))
    b.start()
    yield b
    b.stop()


def admin(broker: BrokerProcess, *args: str) -> None:
    cmd = [sys.executable, "-m", "ister.cli", "admin", *args, "--admin-addr", broker.admin_addr]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def test_topics_pattern_picks_up_a_new_topic_from_earliest(
    spark: Any, admin_broker: BrokerProcess, tmp_path: Path
) -> None:
    first, second = new_topic("pat_first"), new_topic("pat_second")
    produce(admin_broker.url, first, 0, 100)
    out = tmp_path / "table"
    pattern = {"topicsPattern": r"/default/pat_.*", "ister.admin.url": admin_broker.admin_addr}
    run_available_now(spark, admin_broker, "", out, **pattern)
    assert parquet_offsets(spark, out, first) == list(range(100))
    produce(admin_broker.url, second, 0, 50)  # appears while the query is stopped
    produce(admin_broker.url, first, 100, 20)
    progress = run_available_now(spark, admin_broker, "", out, **pattern)
    assert sum(p["numInputRows"] for p in progress) == 70
    assert parquet_offsets(spark, out, second) == list(range(50))
    assert parquet_offsets(spark, out, first) == list(range(120))


def test_fail_on_data_loss_when_the_topic_was_recreated(
    spark: Any, admin_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic("loss")
    produce(admin_broker.url, topic, 0, 100)
    out = tmp_path / "table"
    run_available_now(spark, admin_broker, topic, out)
    admin(admin_broker, "topics", "delete", topic)
    produce(admin_broker.url, topic, 0, 10)  # re-created: offsets 0..9, behind the checkpoint (100)
    with pytest.raises(Exception, match="past the head"):
        run_available_now(spark, admin_broker, topic, out)
    progress = run_available_now(spark, admin_broker, topic, out, failOnDataLoss="false")
    # As Kafka's source: the re-created topic is read from its earliest offset.
    assert sum(p["numInputRows"] for p in progress) == 10
    produce(admin_broker.url, topic, 10, 5)
    progress = run_available_now(spark, admin_broker, topic, out, failOnDataLoss="false")
    assert sum(p["numInputRows"] for p in progress) == 5
