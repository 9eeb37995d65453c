"""`df.write.format("ister")` and `df.writeStream.format("ister")`: rows become messages.

Columns: `value` (required, binary or string), `key` (routing key), `headers` (array of key/value structs
or a map), `topic` (unless the `topic` option is set, which wins), `partition` (an existing partition's
index; null or -1 → the producer's routing; a partition is never created). Their types are checked on
the driver before any task runs; other columns are ignored (as by Kafka's sink). Exactly once by default
(`ister.spark.once`): a retried task or a micro-batch replayed from the checkpoint stores nothing twice;
`exactlyOnce=false` (or a non-reliable topic) is at-least-once, as Kafka's and Pulsar's sinks. Every
message carries `x-ister-spark-batch` = `{queryId}:{batchId}:{partitionId}:{seq}` (unless
writeIdempotencyHeader=false), which names the row a message came from.
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
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegralType,
    MapType,
    StringType,
    StructType,
)

from ister.client.blocking import BlockingClient, BlockingProducer
from ister.client.producer import Outgoing
from ister.core.stream_offsets import NOT_PARTITIONED, TopicPartition
from ister.errors import InvalidArgument
from ister.ids import TopicName
from ister.spark.derive import ValueEncoder
from ister.spark.once import ExactSends
from ister.spark.options import BATCH_HEADER, SinkOptions
from ister.spark.registry import SinkSchema, sink_schema
from ister.spark.shared import shared_client
from ister.spark.values import parsed

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's task-local properties of a micro-batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"
IN_FLIGHT = 4  # Arrow batches (≤ 10k rows each by default) being published at once per task


@dataclass
class Written(WriterCommitMessage):
    partition_id: int
    count: int


HEADERS_TYPES = "array<struct<key: string, value: binary or string>> or map<string, string or binary>"


def _text_type(dt: DataType) -> bool:
    return isinstance(dt, BinaryType | StringType)


def _headers_type(dt: DataType) -> bool:
    if isinstance(dt, MapType):
        return isinstance(dt.keyType, StringType) and _text_type(dt.valueType)
    if isinstance(dt, ArrayType) and isinstance(dt.elementType, StructType):
        fields = {f.name.lower(): f.dataType for f in dt.elementType.fields}
        key, value = fields.get("key"), fields.get("value")
        return len(fields) == 2 and isinstance(key, StringType) and value is not None and _text_type(value)
    return False


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """The DataFrame's columns, checked on the driver before any task writes: a wrong type never reaches
    a task (where it would fail after other tasks sent their rows, or be converted silently)."""
    names = {f.name.lower(): f for f in schema.fields}
    value = names.get("value")
    if value is not None and opts.schema is not None and isinstance(value.dataType, StructType):
        pass  # encoded by the subject's schema
    elif value is None or not _text_type(value.dataType):
        got = f", got {value.dataType.simpleString()}" if value is not None else ""
        raise InvalidArgument(f"the ister sink needs a 'value' column of type binary or string{got}")
    key = names.get("key")
    if key is not None and not _text_type(key.dataType):
        raise InvalidArgument(
            f"key must be string or binary, got {key.dataType.simpleString()} (cast it: CAST(key AS STRING))"
        )
    headers = names.get("headers")
    if headers is not None and not _headers_type(headers.dataType):
        raise InvalidArgument(f"headers must be {HEADERS_TYPES}, got {headers.dataType.simpleString()}")
    topic = names.get("topic")
    if opts.topic is None:
        if topic is None:
            raise InvalidArgument("set the 'topic' option or give the rows a 'topic' column")
        if not isinstance(topic.dataType, StringType):
            raise InvalidArgument(f"topic must be a string, got {topic.dataType.simpleString()}")
    partition = names.get("partition")
    if partition is not None and not isinstance(partition.dataType, IntegralType):
        raise InvalidArgument(
            "partition must be an integer (null or -1: no partition), "
            f"got {partition.dataType.simpleString()}"
        )


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        raise InvalidArgument("a row with a null value (the 'value' column is required)")
    raise InvalidArgument(f"value must be binary or string, got {type(value).__name__}")


def _text(value: Any, what: str) -> str:
    """A string or binary cell (the schema was checked on the driver) as text."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidArgument(f"{what} must be UTF-8 text, got {value[:32]!r}") from None
    if isinstance(value, str):
        return value
    raise InvalidArgument(f"{what} must be string or binary, got {type(value).__name__}")


def _headers(raw: Any) -> dict[str, str]:
    """A headers cell: an array of {key, value} structs (Kafka's layout) or a map (pairs in Arrow)."""
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, Mapping) else raw
    out = {}
    for item in items:
        k, v = (item["key"], item["value"]) if isinstance(item, Mapping) else item
        out[_text(k, "a header key")] = "" if v is None else _text(v, f"header {k!r}")
    return out


def _column(batch: pa.RecordBatch, names: dict[str, int], name: str) -> list[Any] | None:
    index = names.get(name)
    return None if index is None else batch.column(index).to_pylist()


class _Publisher:
    """One task's rows → messages: producers per destination topic, a few Arrow batches in flight."""

    def __init__(
        self,
        opts: SinkOptions,
        client: BlockingClient,
        query_id: str,
        batch_id: str,
        schema: SinkSchema | None = None,
    ) -> None:
        ctx = TaskContext.get()
        self.schema = schema
        self.encoder: ValueEncoder | None = None
        self.partition_id = ctx.partitionId() if ctx is not None else 0
        self.opts = opts
        self.client = client
        self.name = opts.producer_name or f"spark-{query_id}-{self.partition_id}"
        self.mark = f"{query_id}:{batch_id}:{self.partition_id}:"
        self.producers: dict[str, BlockingProducer] = {}
        self.partitions: dict[str, list[int]] = {}  # a destination topic's partition indexes
        self.in_flight: deque[concurrent.futures.Future[list[int]]] = deque()
        self.count = 0
        self.exact: ExactSends | None = None
        if opts.exactly_once:
            self.exact = ExactSends(
                self.producer, self.client.partitions, query_id, batch_id, self.partition_id, IN_FLIGHT
            )

    def producer(self, topic: str, key: int | None = None) -> BlockingProducer:
        producer = self.producers.get(topic)
        if producer is None:
            name = f"{self.name}-{len(self.producers)}"
            stamp: dict[str, Any] = {}
            if self.schema is not None:  # every message carries the schema's id and version
                stamp = {"schema_subject": self.schema.subject, "schema_version": self.schema.version}
            producer = self.client.producer(
                topic,
                name,
                reliable=self.opts.reliable,
                max_batch_messages=self.opts.batch_max_messages,
                producer_key=key,
                **stamp,
            )
            self.producers[topic] = producer
        return producer

    def destination(self, topic: str, partition: Any) -> str:
        """The topic a row goes to: its `partition` of `topic` when one is given, which must exist."""
        if partition is None or partition == NOT_PARTITIONED:
            return topic
        base = TopicName.parse(topic).full
        indexes = self.partitions.get(base)
        if indexes is None:
            # [] when the topic does not exist, [-1] when it has no partitions.
            indexes = sorted({TopicPartition.of(n).partition for n in self.client.partitions(base)})
            self.partitions[base] = indexes
        never = "the sink never creates partitions"
        if not indexes:
            raise InvalidArgument(
                f"{base} does not exist, so it has no partition {partition} ({never}): create it with its "
                "partitions first, or write null or -1 as the partition to let the producer route"
            )
        if indexes == [NOT_PARTITIONED]:
            raise InvalidArgument(
                f"{base} has no partitions, so no partition {partition} ({never}): write null or -1 as "
                "the partition, or drop the column"
            )
        if partition not in indexes:
            raise InvalidArgument(
                f"{base} has no partition {partition} (it has {len(indexes)}: 0..{max(indexes)}); {never}"
            )
        return TopicName.parse(base).partition_topic(int(partition)).full

    def publish(self, batch: pa.RecordBatch) -> None:
        names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
        values = _column(batch, names, "value") or []
        if self.schema is not None and self.schema.encode:
            values = self.value_encoder(batch.schema.field(names["value"]).type).encode(values)
        keys = _column(batch, names, "key")
        headers = _column(batch, names, "headers")
        topics = None if self.opts.topic else _column(batch, names, "topic")
        partitions = _column(batch, names, "partition")
        by_topic: dict[str, list[Outgoing]] = {}
        exact = self.exact
        routed: list[tuple[str, Outgoing]] = []  # exactly once: added once the whole Arrow batch is checked
        for i, value in enumerate(values):
            topic = self.opts.topic or (topics[i] if topics is not None else None)
            if not topic:
                raise InvalidArgument("a row without topic (and no 'topic' option)")
            key = None if keys is None or keys[i] is None else _text(keys[i], "key")
            part = NOT_PARTITIONED if partitions is None else partitions[i]
            if part is not None and part != NOT_PARTITIONED:
                topic = self.destination(topic, part)
            elif exact is not None:
                topic = exact.route(topic, key)
            attributes = _headers(headers[i]) if headers is not None else {}
            if self.opts.idempotency_header:
                attributes[BATCH_HEADER] = f"{self.mark}{self.count + i}"
            message: Outgoing = (_bytes(value), attributes, key)
            if exact is not None:
                routed.append((topic, message))
            else:
                by_topic.setdefault(topic, []).append(message)
        self.count += len(values)
        if exact is not None:
            for destination, outgoing in routed:
                exact.add(destination, outgoing)
        for topic, messages in by_topic.items():
            self.in_flight.append(self.producer(topic).send_each_async(messages))
        while len(self.in_flight) > IN_FLIGHT:
            self.in_flight.popleft().result()  # raises a rejected batch's error

    def value_encoder(self, arrow_type: pa.DataType) -> ValueEncoder:
        if self.encoder is None:
            assert self.schema is not None
            s = self.schema
            self.encoder = ValueEncoder(
                parsed(s.schema_type, s.definition, s.fingerprint), from_arrow_type(arrow_type)
            )
        return self.encoder

    def finish(self) -> Written:
        """Wait until every row is acknowledged (durable, for reliable topics)."""
        if self.exact is not None:
            self.exact.finish()
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
    opts: SinkOptions,
    batches: Iterator[pa.RecordBatch],
    query_id: str,
    batch_id: int | str,
    schema: SinkSchema | None = None,
) -> Written:
    """Send every row of the task; return once all are acknowledged. Rows keep their order per topic."""
    client = shared_client(opts.service_url, opts.connect_timeout, opts.auth)
    publisher = _Publisher(opts, client, query_id, str(batch_id), schema)
    try:
        for batch in batches:
            publisher.publish(batch)
        return publisher.finish()
    finally:
        publisher.close()


def prepare(opts: SinkOptions, schema: StructType) -> SinkSchema | None:
    """On the driver: the columns checked and, with schemaSubject, the DataFrame's value schema registered
    (or the pinned version resolved) before any task writes."""
    check_schema(schema, opts)
    if opts.schema is None:
        return None
    value = next(f for f in schema.fields if f.name.lower() == "value")
    return sink_schema(opts, value.dataType)


class IsterBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.value_schema = prepare(opts, schema)
        self.opts = opts
        self.write_id = uuid.uuid4().hex[:12]  # a batch write has no query id: one per write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return write_batches(self.opts, iterator, self.write_id, 0, self.value_schema)


class IsterStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.value_schema = prepare(opts, schema)
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        ctx = TaskContext.get()
        query_id = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None) or self.fallback_id
        batch_id = (ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None) or "0"
        return write_batches(self.opts, iterator, query_id, batch_id, self.value_schema)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row is acknowledged when its task ends; nothing is left to do per batch."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages already sent stay: a re-run of the batch finds them stored (exactly once), or sends
        them again (exactlyOnce=false); the batch id header marks them."""
