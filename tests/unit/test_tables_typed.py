"""Typed table columns (issue 44, item 2): a topic's registry schema → the table's Arrow and Iceberg
schemas, and stored records → Arrow rows, per format; bytes topics; records that do not decode."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from pyiceberg.types import DecimalType, ListType, LongType, MapType, StructType, TimestamptzType

from ister.core.record import LeanMessage, StoredMessage, encode_message
from ister.core.schema import ParsedSchema, parse, parse_schema_type
from ister.errors import InvalidArgument
from ister.schema.protoc import parse_proto_sync
from ister.tables.typed import ENVELOPE, TableShape, table_shape, to_arrow

UTC = dt.UTC
ENVELOPE_NAMES = [f.name for f in ENVELOPE]

SENSOR = {
    "type": "record",
    "name": "Sensor",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["HOT", "COLD"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {
            "name": "where",
            "type": {"type": "record", "name": "Where", "fields": [{"name": "lat", "type": "float"}]},
        },
        {"name": "either", "type": ["int", "string"]},
    ],
}
ORDER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string", "enum": ["pen", "ink"]},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "qty": {"type": ["number", "null"]},
        "labels": {"type": "array", "items": {"type": "string"}},
        "ship": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        "anything": {},
    },
    "required": ["id", "item"],
}
PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Item {
  string sku = 1;
  int32 count = 2;
  repeated string tags = 3;
  Color color = 4;
  Dim dim = 5;
  map<string, int64> stock = 6;
  google.protobuf.Timestamp at = 7;
  optional uint64 big = 8;
  bytes blob = 9;
  repeated Dim dims = 10;
}
enum Color { RED = 0; BLUE = 1; }
message Dim { double w = 1; double h = 2; }
"""


def avro(doc: Any) -> ParsedSchema:
    return parse(parse_schema_type("avro"), json.dumps(doc))


def json_schema(doc: Any) -> ParsedSchema:
    return parse(parse_schema_type("json_schema"), json.dumps(doc))


def stored(payload: bytes, t: int = 1_000, **kw: Any) -> bytes:
    return encode_message(StoredMessage(payload, t, 7, kw.pop("producer", "p"), **kw))


def rows(shape: TableShape, payloads: list[bytes], **kw: Any) -> list[dict[str, Any]]:
    table = to_arrow(shape, [(i, stored(p)) for i, p in enumerate(payloads)], **kw)
    assert table.schema.equals(shape.arrow_schema, check_metadata=True)
    return table.to_pylist()


def typed_columns(shape: TableShape) -> dict[str, str]:
    return {f.name: str(f.type) for f in shape.arrow_schema if f.name not in ENVELOPE_NAMES}


def test_bytes_topic_gets_the_envelope_and_the_payload() -> None:
    shape = table_shape(None)
    assert shape.arrow_schema.names == [*ENVELOPE_NAMES, "value"]
    assert str(shape.arrow_schema.field("publish_time").type) == "timestamp[us, tz=UTC]"
    assert shape.arrow_schema.field("offset").type == pa.int64()
    record = stored(b"\x00\xff", 1_700_000_000_123, routing_key="k1", attributes={"a": "1", "b": "2"})
    table = to_arrow(shape, [(41, record), (42, stored(b"x", producer="q"))])
    assert table.to_pylist() == [
        {
            "offset": 41,
            "publish_time": dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
            "key": b"k1",
            "producer": "p",
            "attributes": [("a", "1"), ("b", "2")],
            "value": b"\x00\xff",
        },
        {
            "offset": 42,
            "publish_time": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
            "key": None,
            "producer": "q",
            "attributes": [],
            "value": b"x",
        },
    ]
    # a primitive schema (string, number, bytes) keeps the payload as it is
    assert table_shape(parse(parse_schema_type("string"), "")).arrow_schema == shape.arrow_schema


def test_avro_fields_become_columns() -> None:
    schema = avro(SENSOR)
    shape = table_shape(schema, 1)
    assert typed_columns(shape) == {
        "_raw": "binary",
        "_error": "string",
        "id": "int64",
        "score": "double",
        "kind": "string",
        "tags": "list<element: string not null>",
        "attrs": "map<string, int64>",
        "day": "date32[day]",
        "at": "timestamp[us, tz=UTC]",
        "price": "decimal128(9, 2)",
        "where": "struct<lat: float not null>",
        "either": "struct<member0: int32, member1: string>",
    }
    value = {
        "id": 1,
        "score": None,
        "kind": "COLD",
        "tags": ["a", "b"],
        "attrs": {"x": 5},
        "day": dt.date(2026, 12, 6),
        "at": dt.datetime(2026, 12, 6, 3, 4, 5, 678000, tzinfo=UTC),
        "price": decimal.Decimal("12.34"),
        "where": {"lat": 1.5},
        "either": "s",
    }
    [row] = rows(shape, [schema.encode(value)])
    assert {k: row[k] for k in value} == {
        **value,
        "attrs": [("x", 5)],
        "either": {"member0": None, "member1": "s"},
    }
    assert row["_raw"] is None and row["_error"] is None
    fields = {f.name: f for f in shape.iceberg_schema().fields}
    assert isinstance(fields["at"].field_type, TimestamptzType)
    assert fields["price"].field_type == DecimalType(9, 2)
    assert isinstance(fields["tags"].field_type, ListType) and fields["tags"].field_type.element_required
    assert isinstance(fields["where"].field_type, StructType)
    assert not any(f.required for f in fields.values() if f.name not in ("offset", "publish_time"))


def test_json_schema_properties_become_columns() -> None:
    schema = json_schema(ORDER)
    shape = table_shape(schema)
    assert typed_columns(shape) == {
        "_raw": "binary",
        "_error": "string",
        "id": "int64",
        "item": "string",
        "at": "timestamp[us, tz=UTC]",
        "day": "date32[day]",
        "qty": "double",
        "labels": "list<element: string not null>",
        "ship": "struct<city: string not null>",
        "extra": "map<string, int64>",
        "anything": "string",  # no single type: its JSON text
    }
    doc = {
        "id": 7,
        "item": "ink",
        "at": "2026-12-06T03:04:05+01:00",
        "day": "2026-12-06",
        "qty": 2,
        "labels": ["x"],
        "ship": {"city": "Oslo"},
        "extra": {"n": 1},
        "anything": [1, {"a": None}],
    }
    [row, sparse] = rows(shape, [json.dumps(doc).encode(), b'{"id": 8, "item": "pen"}'])
    assert {k: row[k] for k in doc} == {
        **doc,
        "at": dt.datetime(2026, 12, 6, 2, 4, 5, tzinfo=UTC),
        "day": dt.date(2026, 12, 6),
        "qty": 2.0,
        "extra": [("n", 1)],
        "anything": '[1,{"a":null}]',
    }
    assert sparse["id"] == 8 and sparse["ship"] is None and sparse["labels"] is None
    assert shape.iceberg_schema().find_field("id").field_type == LongType()


def test_protobuf_fields_become_columns() -> None:
    schema = parse_proto_sync(PROTO)
    shape = table_shape(schema)
    assert typed_columns(shape) == {
        "_raw": "binary",
        "_error": "string",
        "sku": "string",
        "count": "int32",
        "tags": "list<element: string not null>",
        "color": "string",
        "dim": "struct<w: double not null, h: double not null>",
        "stock": "map<string, int64>",
        "at": "timestamp[us, tz=UTC]",
        "big": "decimal128(20, 0)",
        "blob": "binary",
        "dims": "list<element: struct<w: double not null, h: double not null> not null>",
    }
    payload = schema.encode(
        {
            "sku": "a1",
            "count": 3,
            "tags": ["x"],
            "color": "BLUE",
            "dim": {"w": 1.5},
            "stock": {"n": 7},
            "at": "2026-12-06T03:04:05.250Z",
            "big": str(2**64 - 1),
            "blob": "AAE=",
            "dims": [{"w": 1, "h": 2}],
        }
    )
    [row, empty] = rows(shape, [payload, schema.encode({})])
    assert {k: row[k] for k in typed_columns(shape) if not k.startswith("_")} == {
        "sku": "a1",
        "count": 3,
        "tags": ["x"],
        "color": "BLUE",
        "dim": {"w": 1.5, "h": 0.0},
        "stock": [("n", 7)],
        "at": dt.datetime(2026, 12, 6, 3, 4, 5, 250000, tzinfo=UTC),
        "big": decimal.Decimal(2**64 - 1),
        "blob": b"\x00\x01",
        "dims": [{"w": 1.0, "h": 2.0}],
    }
    # proto3 defaults for scalars; unset messages and optional fields are null
    assert (empty["sku"], empty["count"], empty["color"], empty["dim"], empty["at"], empty["big"]) == (
        "",
        0,
        "RED",
        None,
        None,
        None,
    )
    stock = shape.iceberg_schema().find_field("stock").field_type
    assert isinstance(stock, MapType) and stock.value_required


def test_a_record_that_does_not_decode_keeps_its_payload_and_reason() -> None:
    schema = json_schema(ORDER)
    shape = table_shape(schema)
    bad = [
        b"not json",
        b"null",
        b'{"id": "seven", "item": "pen"}',
        b'{"item": "pen"}',
        b'{"id": 99999999999999999999}',
    ]
    got = rows(shape, [*bad, b'{"id": 1, "item": "pen"}'])
    assert [r["_raw"] for r in got] == [*bad, None]
    assert [r["id"] for r in got] == [None, None, None, None, None, 1]
    reasons = [r["_error"] for r in got]
    assert "JSON" in reasons[0]
    assert reasons[1] == "the value is null"
    assert reasons[2] == "expected an integer, got str"
    assert reasons[3] == "field 'id' is required"
    assert "does not fit a long" in reasons[4]
    assert reasons[5] is None


def test_a_value_arrow_refuses_makes_only_its_record_undecodable() -> None:
    def money(precision: int) -> ParsedSchema:
        kind = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 1}
        return avro({"type": "record", "name": "D", "fields": [{"name": "p", "type": kind}]})

    narrow, wide = money(3), money(9)
    shape = table_shape(narrow)
    too_wide = wide.encode({"p": decimal.Decimal("12345.6")})  # the same bytes encoding, more digits
    got = rows(shape, [narrow.encode({"p": decimal.Decimal("12.3")}), too_wide])
    assert got[0]["p"] == decimal.Decimal("12.3") and got[0]["_error"] is None
    assert got[1]["p"] is None and got[1]["_raw"] == too_wide
    assert got[1]["_error"].startswith("the value does not fit its column: ")


def test_field_named_like_an_envelope_column_is_prefixed() -> None:
    schema = avro(
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": "offset", "type": "string"}, {"name": "key", "type": "int"}],
        }
    )
    shape = table_shape(schema)
    assert shape.arrow_schema.names[-2:] == ["value_offset", "value_key"]
    [row] = rows(shape, [schema.encode({"offset": "o", "key": 3})])
    assert (row["offset"], row["value_offset"], row["value_key"]) == (0, "o", 3)


def test_a_value_that_is_not_a_record_is_one_typed_value_column() -> None:
    schema = avro({"type": "array", "items": "long"})
    shape = table_shape(schema)
    assert str(shape.arrow_schema.field("value").type) == "list<element: int64 not null>"
    assert [r["value"] for r in rows(shape, [schema.encode([1, 2]), schema.encode([])])] == [[1, 2], []]


def test_avro_records_of_older_versions_resolve_through_their_writer() -> None:
    v1 = avro({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    v2 = avro(
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "-"}],
        }
    )
    shape = table_shape(v2, 2)
    records = [
        stored(v1.encode({"a": 5}), schema_version=1),
        stored(v2.encode({"a": 2**40, "b": "x"}), schema_version=2),
    ]
    got = to_arrow(shape, list(enumerate(records)), writers={1: v1}).to_pylist()
    assert [(r["a"], r["b"], r["_error"]) for r in got] == [(5, "-", None), (2**40, "x", None)]
    unknown = to_arrow(shape, [(0, records[0])]).to_pylist()[0]
    assert unknown["a"] is None and unknown["_error"] == (
        "written by version 1 of the subject, whose Avro schema was not given"
    )


def test_bad_input_is_refused() -> None:
    recursive = avro(
        {
            "type": "record",
            "name": "Node",
            "fields": [{"name": "next", "type": ["null", "Node"]}],
        }
    )
    with pytest.raises(InvalidArgument, match="recursive"):
        table_shape(recursive)


def test_records_may_come_decoded_and_may_be_empty() -> None:
    schema = json_schema(ORDER)
    shape = table_shape(schema)
    record = stored(b'{"id": 1, "item": "pen"}', routing_key="r", attributes={"a": "b"})
    lean = msgspec.msgpack.decode(record, type=LeanMessage)
    expected = to_arrow(shape, [(5, record)])
    assert to_arrow(shape, [(5, lean)]).equals(expected)
    assert to_arrow(shape, [(5, lean), (6, record)]).slice(0, 1).equals(expected)
    empty = to_arrow(shape, [])
    assert empty.num_rows == 0 and empty.schema.equals(shape.arrow_schema, check_metadata=True)
