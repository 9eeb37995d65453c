"""The envelope-only table shape: what every topic's table holds whatever its schema (docs/tables.md).

`table_shape`, `to_arrow` and `evolve` here are the interface `tables/typed.py` implements with the
registry's typed columns added; a bytes topic's table is exactly this shape. Field ids are fixed: the
envelope's columns keep them across every evolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

from ister.core.record import NO_ATTRIBUTES, LeanMessage, array_header
from ister.errors import InvalidArgument

Records = Sequence[tuple[int, bytes]]  # (offset, stored record) as a reader returns them

_decode_lean = msgspec.msgpack.Decoder(list[LeanMessage]).decode
_decode_attrs = msgspec.msgpack.Decoder(dict[str, str]).decode

ATTRIBUTES_TYPE = pa.map_(pa.string(), pa.string())
ENVELOPE = pa.schema(
    [
        pa.field("offset", pa.int64()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("producer", pa.string()),
        pa.field("attributes", ATTRIBUTES_TYPE),
        pa.field("value", pa.binary()),
    ]
)


def _iceberg_envelope() -> Schema:
    return Schema(
        NestedField(1, "offset", LongType(), required=False),
        NestedField(2, "publish_time", TimestamptzType(), required=False),
        NestedField(3, "key", BinaryType(), required=False),
        NestedField(4, "producer", StringType(), required=False),
        NestedField(
            5,
            "attributes",
            MapType(7, StringType(), 8, StringType(), value_required=False),
            required=False,
        ),
        NestedField(6, "value", BinaryType(), required=False),
    )


@dataclass(frozen=True)
class TableShape:
    """A table's columns as Arrow and Iceberg see them (the envelope only, here)."""

    arrow_schema: pa.Schema

    def iceberg_schema(self) -> Schema:
        return _iceberg_envelope()


BYTES_SHAPE = TableShape(ENVELOPE)


def table_shape(schema: Any | None) -> TableShape:
    """The shape of a topic's table; None: a bytes topic. A typed schema also gets the envelope here
    (its typed columns come from `tables/typed.py`)."""
    return BYTES_SHAPE


def evolve(old: TableShape, new: TableShape) -> TableShape:
    if new.arrow_schema != old.arrow_schema:
        raise InvalidArgument("the envelope-only shape does not evolve")
    return new


def to_arrow(shape: TableShape, records: Records) -> pa.Table:
    """The table rows of stored records, in offset order. One msgspec call decodes them all and each
    column is built by C-level maps: this runs in the broker's process, so its per-record cost is what
    publishers pay while a table is kept."""
    n = len(records)
    offsets = list(map(_first, records))
    messages: list[LeanMessage] = _decode_lean(array_header(n) + b"".join(map(_second, records))) if n else []
    raw_attrs = list(map(_attributes, messages))
    if all(a == NO_ATTRIBUTES for a in raw_attrs):
        attrs = pa.nulls(n, ATTRIBUTES_TYPE)
    else:
        attrs = pa.array(
            [None if a == NO_ATTRIBUTES else list(_decode_attrs(a).items()) for a in raw_attrs],
            ATTRIBUTES_TYPE,
        )
    columns = [
        pa.array(offsets, pa.int64()),
        pa.array(list(map(_publish_time, messages)), pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        # str -> binary is a cast of the same UTF-8 bytes: no encode per key
        pa.array(list(map(_routing_key, messages)), pa.string()).cast(pa.binary()),
        pa.array(list(map(_producer, messages)), pa.string()),
        attrs,
        pa.array(list(map(_payload, messages)), pa.binary()),
    ]
    return pa.Table.from_arrays(columns, schema=shape.arrow_schema)


_first = itemgetter(0)
_second = itemgetter(1)
_attributes = attrgetter("attributes")
_publish_time = attrgetter("publish_time")
_routing_key = attrgetter("routing_key")
_producer = attrgetter("producer_name")
_payload = attrgetter("payload")


__all__ = ["BYTES_SHAPE", "ENVELOPE", "Records", "TableShape", "evolve", "table_shape", "to_arrow"]
