"""The lakehouse export job: Ister topics → a Parquet table partitioned by topic and date, exactly once.

A Structured Streaming query: the `ister` source (offset ranges, deterministic replays) into staged
writes (`ister.spark.staged`: each micro-batch is written aside and moved into the table once complete,
so every engine, not only Spark, sees committed files only), with the checkpoint tying the two together.
A query killed at any point and started again with the same checkpoint neither loses nor duplicates a
row in the table, as Spark, DuckDB or pyarrow read it.

Other formats than Spark's file formats (`delta`, with its jars on the cluster) go to that format's own
streaming sink, which has its own exactly-once commit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ister.errors import InvalidArgument
from ister.spark.staged import StagedOutput

TRIGGERS = ("availableNow", "interval")
CHECKPOINT_DIR = "_ister_checkpoint"  # inside the table; readers skip names starting with "_"
FILE_FORMATS = ("parquet", "orc", "json", "csv")  # written through staged batches
PARTITION_BY = ("topic", "date")


@dataclass(frozen=True)
class ExportJob:
    service_url: str
    topics: Sequence[str]
    path: str
    format: str = "parquet"
    trigger: str = "availableNow"
    interval: str = "10 seconds"
    checkpoint: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    lag_subscription: str | None = None  # predefinedSubscription: the job's lag visible on the broker
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.topics:
            raise InvalidArgument("export needs at least one --topic")
        if self.trigger not in TRIGGERS:
            raise InvalidArgument(f"--trigger must be one of {', '.join(TRIGGERS)}, got {self.trigger!r}")

    @property
    def checkpoint_location(self) -> str:
        return self.checkpoint or os.path.join(self.path, CHECKPOINT_DIR)

    def start(self, spark: Any) -> Any:
        """Start the query on `spark` (the `ister` format must be registered); returns the StreamingQuery."""
        from pyspark.sql import functions as F

        reader = (
            spark.readStream.format("ister")
            .option("ister.service.url", self.service_url)
            .option("topics", ",".join(self.topics))
            .option("startingOffsets", self.starting_offsets)
        )
        if self.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(self.max_offsets_per_trigger))
        if self.lag_subscription is not None:
            reader = reader.option("predefinedSubscription", self.lag_subscription)
        for key, value in self.options.items():
            reader = reader.option(key, value)
        rows = reader.load().withColumn("date", F.to_date(F.col("timestamp")))
        writer = rows.writeStream.option("checkpointLocation", self.checkpoint_location)
        if self.trigger == "availableNow":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.interval)
        if self.format not in FILE_FORMATS:
            return writer.format(self.format).partitionBy(*PARTITION_BY).start(self.path)
        staged = StagedOutput(spark, self.path, self.checkpoint_location, self.format, PARTITION_BY)
        if staged.written_by_file_sink():
            raise InvalidArgument(
                f"{self.path} was written by an older export (Spark's file sink, _spark_metadata): "
                "export into a new directory (and a new checkpoint)"
            )
        staged.recover()  # before anything else: only committed files stay visible
        return writer.foreachBatch(staged.write).start()


def local_session(master: str = "local[*]", **conf: str) -> Any:
    """A SparkSession for running the job on this machine (extra `conf` settings allowed), with the
    `ister` format registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import ister.spark

    builder = (
        SparkSession.builder.master(master)
        .appName("ister-pipeline-export")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    ister.spark.register(spark)
    return spark
