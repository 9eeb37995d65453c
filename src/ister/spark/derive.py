"""The sink's side of `schemaSubject`: a DataFrame's `value` struct as an Avro or JSON Schema definition
(registered under the subject, so the registry checks compatibility), and rows encoded by it.

Spark → Avro: struct → record (nested records named `{parent}_{field}`), a nullable field → union with
null and default null, array → array, map<string, _> → map, string, binary → bytes, boolean, byte /
short / int → int, long, float, double, date → int/date, timestamp → long/timestamp-micros,
timestamp_ntz → long/local-timestamp-micros, decimal(p,s) → bytes/decimal. Spark → JSON Schema (2020-12):
struct → closed object (non-nullable fields required), nullable → `type: [t, "null"]`, binary →
base64 string, date / timestamp → string with format date / date-time, decimal → number. Other Spark
types (intervals, variant, maps with non-string keys) are refused on the driver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ister.core.schema import ParsedSchema
from ister.errors import InvalidArgument

_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AVRO_SIMPLE: list[tuple[type[DataType], Any]] = [
    (StringType, "string"),
    (BinaryType, "bytes"),
    (BooleanType, "boolean"),
    (ByteType, "int"),
    (ShortType, "int"),
    (IntegerType, "int"),
    (LongType, "long"),
    (FloatType, "float"),
    (DoubleType, "double"),
    (DateType, {"type": "int", "logicalType": "date"}),
    (TimestampType, {"type": "long", "logicalType": "timestamp-micros"}),
    (TimestampNTZType, {"type": "long", "logicalType": "local-timestamp-micros"}),
]
_JSON_SIMPLE: list[tuple[type[DataType], dict[str, Any]]] = [
    (StringType, {"type": "string"}),
    (BinaryType, {"type": "string", "contentEncoding": "base64"}),
    (BooleanType, {"type": "boolean"}),
    (ByteType, {"type": "integer"}),
    (ShortType, {"type": "integer"}),
    (IntegerType, {"type": "integer"}),
    (LongType, {"type": "integer"}),
    (FloatType, {"type": "number"}),
    (DoubleType, {"type": "number"}),
    (DecimalType, {"type": "number"}),
    (DateType, {"type": "string", "format": "date"}),
    (TimestampType, {"type": "string", "format": "date-time"}),
    (TimestampNTZType, {"type": "string", "format": "date-time"}),
]


def record_name(subject: str) -> str:
    """A default Avro record name from the subject (`orders-value` → `orders_value`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", subject)
    return name if _AVRO_NAME.fullmatch(name) else f"r_{name}"


def _avro(dtype: DataType, name: str, where: str) -> Any:
    for kind, avro_type in _AVRO_SIMPLE:
        if isinstance(dtype, kind):
            return avro_type
    if isinstance(dtype, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dtype.precision, "scale": dtype.scale}
    if isinstance(dtype, ArrayType):
        return {
            "type": "array",
            "items": _nullable(_avro(dtype.elementType, name, where), dtype.containsNull),
        }
    if isinstance(dtype, MapType):
        if not isinstance(dtype.keyType, StringType):
            raise InvalidArgument(f"{where}: Avro maps have string keys, got {dtype.keyType.simpleString()}")
        values = _avro(dtype.valueType, name, where)
        return {"type": "map", "values": _nullable(values, dtype.valueContainsNull)}
    if isinstance(dtype, StructType):
        fields = []
        for f in dtype.fields:
            if not _AVRO_NAME.fullmatch(f.name):
                raise InvalidArgument(f"{where}.{f.name}: not an Avro field name (letters, digits, _)")
            inner = _avro(f.dataType, f"{name}_{f.name}", f"{where}.{f.name}")
            field: dict[str, Any] = {"name": f.name, "type": _nullable(inner, f.nullable)}
            if f.nullable:
                field["default"] = None
            fields.append(field)
        return {"type": "record", "name": name, "fields": fields}
    raise InvalidArgument(f"{where}: Spark type {dtype.simpleString()} has no Avro type")


def _nullable(avro_type: Any, nullable: bool) -> Any:
    return ["null", avro_type] if nullable else avro_type


def avro_definition(value: StructType, name: str) -> str:
    return json.dumps(_avro(value, name, "value"))


def _json(dtype: DataType, where: str) -> dict[str, Any]:
    for kind, json_type in _JSON_SIMPLE:
        if isinstance(dtype, kind):
            return dict(json_type)
    if isinstance(dtype, ArrayType):
        return {"type": "array", "items": _json_nullable(_json(dtype.elementType, where), dtype.containsNull)}
    if isinstance(dtype, MapType):
        if not isinstance(dtype.keyType, StringType):
            raise InvalidArgument(
                f"{where}: JSON objects have string keys, got {dtype.keyType.simpleString()}"
            )
        values = _json_nullable(_json(dtype.valueType, where), dtype.valueContainsNull)
        return {"type": "object", "additionalProperties": values}
    if isinstance(dtype, StructType):
        properties = {
            f.name: _json_nullable(_json(f.dataType, f"{where}.{f.name}"), f.nullable) for f in dtype.fields
        }
        required = [f.name for f in dtype.fields if not f.nullable]
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
    raise InvalidArgument(f"{where}: Spark type {dtype.simpleString()} has no JSON Schema type")


def _json_nullable(node: dict[str, Any], nullable: bool) -> dict[str, Any]:
    if not nullable:
        return node
    if isinstance(node.get("type"), str):
        return {**node, "type": [node["type"], "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def json_definition(value: StructType) -> str:
    return json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema", **_json(value, "value")})


Conv = Callable[[Any], Any]


def _maps_to_dicts(dtype: DataType) -> Conv | None:
    """Arrow's Python value of `dtype` → what the encoders take: maps arrive as lists of pairs."""
    if isinstance(dtype, MapType):
        inner = _maps_to_dicts(dtype.valueType)
        if inner is None:
            return dict
        return lambda pairs: {k: None if v is None else inner(v) for k, v in pairs}
    if isinstance(dtype, ArrayType):
        item = _maps_to_dicts(dtype.elementType)
        return None if item is None else (lambda xs: [None if x is None else item(x) for x in xs])
    if isinstance(dtype, StructType):
        plan = [(f.name, _maps_to_dicts(f.dataType)) for f in dtype.fields]
        if all(c is None for _, c in plan):
            return None
        return lambda row: {n: row[n] if c is None or row[n] is None else c(row[n]) for n, c in plan}
    return None


_json_encode = msgspec.json.Encoder(decimal_format="number").encode


class ValueEncoder:
    """Rows of the `value` struct → payloads of the sink's schema version."""

    def __init__(self, schema: ParsedSchema, value_type: DataType) -> None:
        self.schema = schema
        self.conv = _maps_to_dicts(value_type)

    def encode(self, rows: list[Any]) -> list[bytes]:
        values = rows if self.conv is None else [None if r is None else self.conv(r) for r in rows]
        if any(v is None for v in values):
            raise InvalidArgument("a row with a null value (the 'value' struct is what is encoded)")
        if self.schema.type.value == "json_schema":
            payloads = [_json_encode(v) for v in values]
            bad = self.schema.first_invalid(payloads)
            if bad is not None:
                raise InvalidArgument(f"a row is not a value of the JSON Schema: {bad[1]}")
            return payloads
        return [self.schema.encode(v) for v in values]
