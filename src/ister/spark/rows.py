"""Stored records → Arrow record batches in the Kafka-style row layout of the source."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import BinaryType, DataType, StructField, StructType

from ister.core.stream_offsets import TopicPartition
from ister.storage.objects import parquet
from ister.storage.objects.parquet import HEADERS_TYPE, arrow_schema

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


def to_batch(
    tp: TopicPartition, offsets: Sequence[int], records: Sequence[bytes], include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch from stored records and their offsets (the same builder writes the broker's Parquet
    copies, so both paths give the same rows)."""
    return parquet.to_batch(tp.topic, tp.partition, offsets, records, include_headers)


__all__ = ["HEADERS_TYPE", "arrow_schema", "ddl", "to_batch", "typed_schema"]
