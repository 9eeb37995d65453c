"""Stored records → Arrow record batches in the Kafka-style row layout of the source."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import msgspec
import pyarrow as pa
from pyspark.sql.types import BinaryType, DataType, StructField, StructType

from ister.client.records import array_header
from ister.core.record import LeanMessage, StoredMessage
from ister.core.stream_offsets import TopicPartition

_decode_all = msgspec.msgpack.Decoder(list[StoredMessage]).decode
_decode_lean = msgspec.msgpack.Decoder(list[LeanMessage]).decode  # no headers column: attributes stay raw

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


def typed_schema(include_headers: bool, value: DataType, corrupt_column: str) -> StructType:
    """The row layout of valueFormat=schema: `value` of the registry schema's type, and the corrupt-record
    column (the raw payload of a record that did not decode, PERMISSIVE) last."""
    raw = StructType.fromJson(_RAW_JSON[include_headers])
    fields = [StructField("value", value, True) if f.name == "value" else f for f in raw.fields]
    return StructType([*fields, StructField(corrupt_column, BinaryType(), True)])


def _raw_json(include_headers: bool) -> dict[str, object]:
    types = {
        "binary": "binary", "string": "string", "int": "integer", "long": "long", "timestamp": "timestamp",
    }  # fmt: skip
    fields: list[dict[str, object]] = []
    for column in BASE_DDL.split(", "):
        name, kind = column.split(" ")
        fields.append({"name": name, "type": types[kind], "nullable": True, "metadata": {}})
    if include_headers:
        header = {
            "type": "struct",
            "fields": [
                {"name": "key", "type": "string", "nullable": True, "metadata": {}},
                {"name": "value", "type": "binary", "nullable": True, "metadata": {}},
            ],
        }
        element = {"type": "array", "elementType": header, "containsNull": True}
        fields.append({"name": "headers", "type": element, "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}


_RAW_JSON = {False: _raw_json(False), True: _raw_json(True)}


_SCHEMAS = {
    False: pa.schema([pa.field(n, t) for n, t in _FIELDS]),
    True: pa.schema([*(pa.field(n, t) for n, t in _FIELDS), pa.field("headers", HEADERS_TYPE)]),
}


def arrow_schema(include_headers: bool) -> pa.Schema:
    return _SCHEMAS[include_headers]


def to_batch(
    tp: TopicPartition, offsets: Sequence[int], records: Sequence[bytes], include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch from stored records and their offsets; the records are decoded in one msgspec call
    and each column is built by C-level maps (this loop is the connector's per-row cost)."""
    n = len(records)
    blob = array_header(n) + b"".join(records)
    messages: Sequence[StoredMessage | LeanMessage]
    messages = _decode_all(blob) if include_headers else _decode_lean(blob)
    keys = [None if k is None else k.encode() for k in map(_routing_key, messages)]
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(list(map(_payload, messages)), pa.binary()),
        pa.repeat(pa.scalar(tp.topic, pa.string()), n) if n else pa.array([], pa.string()),
        pa.repeat(pa.scalar(tp.partition, pa.int32()), n) if n else pa.array([], pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(list(map(_publish_time, messages)), pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(0, pa.int32()), n) if n else pa.array([], pa.int32()),
        pa.array(list(map(_producer, messages)), pa.string()),
        pa.array(list(map(_schema_id, messages)), pa.int64()),
        pa.array(list(map(_schema_version, messages)), pa.int32()),
    ]
    if include_headers:
        headers = [
            [{"key": k, "value": v.encode()} for k, v in m.attributes.items()]
            for m in messages
            if isinstance(m, StoredMessage)
        ]
        columns.append(pa.array(headers, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


_routing_key = attrgetter("routing_key")
_payload = attrgetter("payload")
_publish_time = attrgetter("publish_time")
_producer = attrgetter("producer_name")
_schema_id = attrgetter("schema_id")
_schema_version = attrgetter("schema_version")
