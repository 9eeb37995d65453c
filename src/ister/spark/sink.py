"""`df.write.format("ister")` and `df.writeStream.format("ister")`: rows become messages.

Columns: `value` (required, binary or string), `key` (routing key), `headers` (array of key/value structs
or a map), `topic` (unless the `topic` option is set, which wins), `partition` (a partition index; null →
the producer's routing). At-least-once, as Kafka's and Pulsar's sinks: a task retried by Spark sends its
rows again. Every message carries `x-ister-spark-batch` = `{queryId}:{batchId}:{partitionId}:{seq}`
(unless writeIdempotencyHeader=false), so readers can drop the duplicates of a retried task.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from ister.client.blocking import BlockingClient, BlockingProducer
from ister.client.producer import Outgoing
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.spark.options import BATCH_HEADER, SinkOptions
from ister.spark.shared import shared_client

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's task-local properties of a micro-batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"
IN_FLIGHT = 4  # Arrow batches (≤ 10k rows each by default) being published at once per task


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
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        raise InvalidArgument("a row with a null value (the 'value' column is required)")
    raise InvalidArgument(f"value must be binary or string, got {type(value).__name__}")


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidArgument(f"{what} must be UTF-8 text, got {value[:32]!r}") from None
    return str(value)


def _headers(raw: Any) -> dict[str, str]:
    """A headers cell: an array of {key, value} structs (Kafka's layout) or a map (pairs in Arrow)."""
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, Mapping) else raw
    out = {}
    for item in items:
        k, v = (item["key"], item["value"]) if isinstance(item, Mapping) else item
        out[str(k)] = "" if v is None else _text(v, f"header {k!r}")
    return out


def _column(batch: pa.RecordBatch, names: dict[str, int], name: str) -> list[Any] | None:
    index = names.get(name)
    return None if index is None else batch.column(index).to_pylist()


class _Publisher:
    """One task's rows → messages: producers per destination topic, a few Arrow batches in flight."""

    def __init__(self, opts: SinkOptions, client: BlockingClient, query_id: str, batch_id: str) -> None:
        ctx = TaskContext.get()
        self.partition_id = ctx.partitionId() if ctx is not None else 0
        self.opts = opts
        self.client = client
        self.name = opts.producer_name or f"spark-{query_id}-{self.partition_id}"
        self.mark = f"{query_id}:{batch_id}:{self.partition_id}:"
        self.producers: dict[str, BlockingProducer] = {}
        self.in_flight: deque[concurrent.futures.Future[list[int]]] = deque()
        self.count = 0

    def producer(self, topic: str) -> BlockingProducer:
        producer = self.producers.get(topic)
        if producer is None:
            name = f"{self.name}-{len(self.producers)}"
            producer = self.client.producer(topic, name, reliable=self.opts.reliable)
            self.producers[topic] = producer
        return producer

    def publish(self, batch: pa.RecordBatch) -> None:
        names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
        values = _column(batch, names, "value") or []
        keys = _column(batch, names, "key")
        headers = _column(batch, names, "headers")
        topics = None if self.opts.topic else _column(batch, names, "topic")
        partitions = _column(batch, names, "partition")
        by_topic: dict[str, list[Outgoing]] = {}
        for i, value in enumerate(values):
            topic = self.opts.topic or (topics[i] if topics is not None else None)
            if not topic:
                raise InvalidArgument("a row without topic (and no 'topic' option)")
            if partitions is not None and partitions[i] is not None:
                topic = TopicName.parse(topic).partition_topic(int(partitions[i])).full
            attributes = _headers(headers[i]) if headers is not None else {}
            if self.opts.idempotency_header:
                attributes[BATCH_HEADER] = f"{self.mark}{self.count + i}"
            key = None if keys is None or keys[i] is None else _text(keys[i], "key")
            by_topic.setdefault(topic, []).append((_bytes(value), attributes, key))
        self.count += len(values)
        for topic, messages in by_topic.items():
            self.in_flight.append(self.producer(topic).send_each_async(messages))
        while len(self.in_flight) > IN_FLIGHT:
            self.in_flight.popleft().result()  # raises a rejected batch's error

    def finish(self) -> Written:
        """Wait until every row is acknowledged (durable, for reliable topics)."""
        while self.in_flight:
            self.in_flight.popleft().result()
        return Written(self.partition_id, self.count)

    def close(self) -> None:
        """The client outlives the task (it is the worker's); the task's producers do not."""
        for producer in self.producers.values():
            with contextlib.suppress(Exception):  # a failed task: the error that ended it matters
                producer.close()
        self.producers.clear()


def write_batches(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], query_id: str, batch_id: int | str
) -> Written:
    """Send every row of the task; return once all are acknowledged. Rows keep their order per topic."""
    publisher = _Publisher(opts, shared_client(opts.service_url), query_id, str(batch_id))
    try:
        for batch in batches:
            publisher.publish(batch)
        return publisher.finish()
    finally:
        publisher.close()


class IsterBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.write_id = uuid.uuid4().hex[:12]  # a batch write has no query id: one per write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return write_batches(self.opts, iterator, self.write_id, 0)


class IsterStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        ctx = TaskContext.get()
        query_id = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None) or self.fallback_id
        batch_id = (ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None) or "0"
        return write_batches(self.opts, iterator, query_id, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row is acknowledged when its task ends; nothing is left to do per batch."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages already sent stay (at-least-once); the batch id header marks them."""
