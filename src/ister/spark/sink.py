"""`df.write.format("ister")` and `df.writeStream.format("ister")`: rows become messages.

Columns: `value` (required, binary or string), `key` (routing key), `headers` (array of key/value structs
or a map), `topic` (unless the `topic` option is set, which wins), `partition` (a partition index; null →
the producer's routing). At-least-once, as Kafka's and Pulsar's sinks: a task retried by Spark sends its
rows again. Every message carries `x-ister-spark-batch` = `{queryId}:{batchId}:{partitionId}:{seq}`
(unless writeIdempotencyHeader=false), so readers can drop the duplicates of a retried task.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from ister.client.blocking import BlockingClient, BlockingProducer
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.spark.options import BATCH_HEADER, SinkOptions

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's task-local properties of a micro-batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class Written(WriterCommitMessage):
    partition_id: int
    count: int


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    names = {f.name.lower(): f for f in schema.fields}
    value = names.get("value")
    if value is None or not isinstance(value.dataType, BinaryType | StringType):
        raise InvalidArgument("the ister sink needs a 'value' column of type binary or string")
    if opts.topic is None and "topic" not in names:
        raise InvalidArgument("set the 'topic' option or give the rows a 'topic' column")


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise InvalidArgument(f"value must be binary or string, got {type(value).__name__}")


def _headers(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    items = raw.items() if isinstance(raw, Mapping) else ((h["key"], h["value"]) for h in raw)
    out = {}
    for k, v in items:
        out[str(k)] = v.decode() if isinstance(v, bytes | bytearray) else str(v)
    return out


def write_rows(opts: SinkOptions, rows: Iterator[Row], query_id: str, batch_id: int | str) -> Written:
    """Send every row; return once all are acknowledged (durable, for reliable topics)."""
    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else 0
    pending: list[concurrent.futures.Future[int]] = []
    producers: dict[str, BlockingProducer] = {}
    name = opts.producer_name or f"spark-{query_id}-{partition_id}"
    count = 0
    with BlockingClient(opts.service_url) as client:
        for seq, row in enumerate(rows):
            fields = row.asDict()
            topic = opts.topic or fields.get("topic")
            if not topic:
                raise InvalidArgument("a row without topic (and no 'topic' option)")
            partition = fields.get("partition")
            if partition is not None:
                topic = TopicName.parse(topic).partition_topic(int(partition)).full
            producer = producers.get(topic)
            if producer is None:
                producer = client.producer(topic, f"{name}-{len(producers)}", reliable=opts.reliable)
                producers[topic] = producer
            attributes = _headers(fields.get("headers"))
            if opts.idempotency_header:
                attributes[BATCH_HEADER] = f"{query_id}:{batch_id}:{partition_id}:{seq}"
            key = fields.get("key")
            routing = (
                key.decode()
                if isinstance(key, bytes | bytearray)
                else (str(key) if key is not None else None)
            )
            pending.append(producer.send_async(_bytes(fields["value"]), attributes, routing))
            count += 1
            if len(pending) >= 10_000:
                for f in pending:
                    f.result()
                pending.clear()
        for f in pending:
            f.result()
        for producer in producers.values():
            producer.close()
    return Written(partition_id, count)


class IsterBatchWriter(DataSourceWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex[:12]  # a batch write has no query id: one per write

    def write(self, iterator: Iterator[Row]) -> Written:
        return write_rows(self.opts, iterator, self.write_id, 0)


class IsterStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[Row]) -> Written:
        ctx = TaskContext.get()
        query_id = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None) or self.fallback_id
        batch_id = (ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None) or "0"
        return write_rows(self.opts, iterator, query_id, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row is acknowledged when its task ends; nothing is left to do per batch."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages already sent stay (at-least-once); the batch id header marks them."""
