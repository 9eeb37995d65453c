"""Stored records → Arrow record batches in the Kafka-style row layout of the source."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pyarrow as pa

from ister.client.records import array_header
from ister.core.record import StoredMessage
from ister.core.stream_offsets import TopicPartition

_decode_all = msgspec.msgpack.Decoder(list[StoredMessage]).decode

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_FIELDS = [
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("producer", pa.string()),
    ("schemaId", pa.int64()),
    ("schemaVersion", pa.int32()),
]
BASE_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, producer string, schemaId long, schemaVersion int"
)
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"


def ddl(include_headers: bool) -> str:
    return f"{BASE_DDL}, {HEADERS_DDL}" if include_headers else BASE_DDL


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [pa.field(n, t) for n, t in _FIELDS]
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    return pa.schema(fields)


def to_batch(
    tp: TopicPartition, records: Sequence[tuple[int, bytes]], include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch from (offset, stored record) pairs; the records are decoded in one msgspec call."""
    n = len(records)
    messages = _decode_all(array_header(n) + b"".join(r for _, r in records))
    columns = [
        pa.array(
            [m.routing_key.encode() if m.routing_key is not None else None for m in messages], pa.binary()
        ),
        pa.array([m.payload for m in messages], pa.binary()),
        pa.array([tp.topic] * n, pa.string()),
        pa.array([tp.partition] * n, pa.int32()),
        pa.array([o for o, _ in records], pa.int64()),
        pa.array([m.publish_time * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        pa.array([0] * n, pa.int32()),
        pa.array([m.producer_name for m in messages], pa.string()),
        pa.array([m.schema_id for m in messages], pa.int64()),
        pa.array([m.schema_version for m in messages], pa.int32()),
    ]
    if include_headers:
        headers = [[{"key": k, "value": v.encode()} for k, v in m.attributes.items()] for m in messages]
        columns.append(pa.array(headers, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
