"""Registry schemas as Spark types (`valueFormat=schema`): Avro, JSON Schema and Protobuf → a Spark type,
together with the conversion of a decoded value into what Arrow takes for that type.

A `Shape` is both: the Spark type of a value, whether it may be null, and `conv` (None when the decoded
Python value is already what Arrow takes). A conversion raises `Unreadable` when a value does not fit the
type (a JSON record of an older version whose field had another type, say): the source then treats the
record as corrupt (PERMISSIVE: null value and the raw payload in the corrupt column; FAILFAST: the query
fails). Pure: no Spark session, no I/O.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ister.core.schema import AvroSchema, JsonSchema, ParsedSchema, ProtobufSchema
from ister.errors import InvalidArgument

Conv = Callable[[Any], Any]
MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType


class Unreadable(InvalidArgument):
    """A decoded value that does not fit the reader's Spark type."""


@dataclass(frozen=True)
class Shape:
    dtype: DataType
    nullable: bool = True
    conv: Conv | None = None  # decoded value → Arrow's value; None: as it is


def shape_of(schema: ParsedSchema) -> Shape:
    """The Spark shape of a registry schema's values; InvalidArgument for what Spark cannot hold."""
    if isinstance(schema, AvroSchema):
        return AvroShapes().of(schema.resolvable)
    if isinstance(schema, JsonSchema):
        return JsonShapes(schema.document).of(schema.document)
    if isinstance(schema, ProtobufSchema):
        return ProtoShapes().message(schema.message_class.DESCRIPTOR)
    raise InvalidArgument(
        "valueFormat=schema decodes avro, json_schema and protobuf subjects; this one is "
        f"{schema.type.value} (use valueFormat=raw)"
    )


def _apply(conv: Conv | None, value: Any) -> Any:
    return value if conv is None or value is None else conv(value)


def _list_conv(item: Conv | None) -> Conv:
    def conv(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise Unreadable(f"expected an array, got {type(value).__name__}")
        return value if item is None else [_apply(item, v) for v in value]

    return conv


def _map_conv(item: Conv | None) -> Conv:
    def conv(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Unreadable(f"expected a map, got {type(value).__name__}")
        return list(value.items()) if item is None else [(k, _apply(item, v)) for k, v in value.items()]

    return conv


def _struct_conv(fields: Sequence[tuple[str, Shape]]) -> Conv:
    """A mapping → a dict of exactly the struct's fields (missing ones null when nullable)."""
    plan = [(name, s.conv, s.nullable) for name, s in fields]

    def conv(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Unreadable(f"expected a record, got {type(value).__name__}")
        out: dict[str, Any] = {}
        for name, field_conv, nullable in plan:
            v = value.get(name)
            if v is None:
                if not nullable:
                    raise Unreadable(f"field {name!r} is required")
                out[name] = None
            else:
                out[name] = v if field_conv is None else field_conv(v)
        return out

    return conv


def _struct(fields: Sequence[tuple[str, Shape]], nullable: bool = True) -> Shape:
    dtype = StructType([StructField(name, s.dtype, s.nullable) for name, s in fields])
    return Shape(dtype, nullable, _struct_conv(fields))


# --- Avro --------------------------------------------------------------------------------------------------

_AVRO_PRIMITIVE: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}


def _time_millis(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + value.microsecond // 1000
    return value


def _time_micros(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return value


_AVRO_LOGICAL: dict[tuple[str, str], Shape] = {
    ("int", "date"): Shape(DateType(), False),
    ("long", "timestamp-millis"): Shape(TimestampType(), False),
    ("long", "timestamp-micros"): Shape(TimestampType(), False),
    ("long", "local-timestamp-millis"): Shape(TimestampNTZType(), False),
    ("long", "local-timestamp-micros"): Shape(TimestampNTZType(), False),
    ("int", "time-millis"): Shape(IntegerType(), False, _time_millis),  # Spark has no time of day
    ("long", "time-micros"): Shape(LongType(), False, _time_micros),
    ("string", "uuid"): Shape(StringType(), False, str),
}


def _avro_matcher(s: Any) -> Callable[[Any], bool]:
    """Whether a value fastavro decoded could come from union branch `s` (fastavro returns branch values
    without their branch index)."""
    kind = s.type
    logical = s.props.get("logicalType")
    if logical == "decimal":
        return lambda v: isinstance(v, decimal.Decimal)
    if logical == "uuid":
        return lambda v: isinstance(v, uuid.UUID)
    if logical == "date":
        return lambda v: isinstance(v, dt.date) and not isinstance(v, dt.datetime)
    if logical is not None and "timestamp" in str(logical):
        return lambda v: isinstance(v, dt.datetime)
    if kind == "record":
        names = {f.name for f in s.fields}
        return lambda v: isinstance(v, Mapping) and set(v) == names
    if kind == "enum":
        symbols = set(s.symbols)
        return lambda v: isinstance(v, str) and v in symbols
    if kind == "fixed":
        size = s.size
        return lambda v: isinstance(v, bytes) and len(v) == size
    simple: dict[str, type | tuple[type, ...]] = {
        "boolean": bool,
        "int": int,
        "long": int,
        "float": float,
        "double": float,
        "bytes": bytes,
        "string": str,
        "array": list,
        "map": Mapping,
    }
    expected = simple.get(kind, object)
    if kind in ("int", "long"):
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    return lambda v: isinstance(v, expected)


class AvroShapes:
    """Avro (Apache Avro's parsed schema, names resolved) → Spark, as Spark's own Avro support maps it:
    records → struct, enums → string, unions with null → nullable, other unions → struct of member0..n."""

    def __init__(self) -> None:
        self.open: list[str] = []  # records being mapped (a recursive record has no Spark type)

    def of(self, s: Any) -> Shape:
        kind = s.type
        logical = s.props.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(s.get_prop("precision")), int(s.get_prop("scale") or 0)
            if precision <= MAX_DECIMAL_PRECISION:
                return Shape(DecimalType(precision, scale), False)
            return Shape(StringType(), False, str)
        found = _AVRO_LOGICAL.get((kind, str(logical)))
        if found is not None:
            return found
        if kind in _AVRO_PRIMITIVE:
            return Shape(_AVRO_PRIMITIVE[kind], False)
        if kind == "null":
            return Shape(StringType())  # always null
        if kind in ("enum",):
            return Shape(StringType(), False)
        if kind == "fixed":
            return Shape(BinaryType(), False)
        if kind == "array":
            item = self.of(s.items)
            return Shape(
                ArrayType(item.dtype, item.nullable),
                False,
                None if item.conv is None else _list_conv(item.conv),
            )
        if kind == "map":
            value = self.of(s.values)
            return Shape(MapType(StringType(), value.dtype, value.nullable), False, _map_conv(value.conv))
        if kind == "union":
            return self.union(s.schemas)
        if kind in ("record", "error"):
            return self.record(s)
        raise InvalidArgument(f"Avro type {kind!r} has no Spark type")

    def record(self, s: Any) -> Shape:
        if s.fullname in self.open:
            raise InvalidArgument(f"Avro record {s.fullname} is recursive: Spark types cannot hold it")
        self.open.append(s.fullname)
        try:
            fields = [(f.name, self.of(f.type)) for f in s.fields]
        finally:
            self.open.pop()
        shape = _struct(fields, nullable=False)
        if all(f.conv is None for _, f in fields):
            return Shape(shape.dtype, False, None)  # fastavro's dicts are what Arrow takes
        return shape

    def union(self, branches: Sequence[Any]) -> Shape:
        members = [b for b in branches if b.type != "null"]
        if not members:
            return Shape(StringType())
        if len(members) == 1:
            inner = self.of(members[0])
            return Shape(inner.dtype, True, inner.conv)
        shapes = [self.of(b) for b in members]
        matchers = [_avro_matcher(b) for b in members]
        names = [f"member{i}" for i in range(len(members))]
        dtype = StructType([StructField(n, sh.dtype, True) for n, sh in zip(names, shapes, strict=True)])

        def conv(value: Any) -> Any:
            out: dict[str, Any] = dict.fromkeys(names)
            for name, shape, matches in zip(names, shapes, matchers, strict=True):
                if matches(value):
                    out[name] = _apply(shape.conv, value)
                    return out
            raise Unreadable(f"no union branch holds a {type(value).__name__}")

        return Shape(dtype, len(members) < len(branches), conv)


# --- JSON Schema -------------------------------------------------------------------------------------------

_to_json = msgspec.json.encode


def _json_text(value: Any) -> Any:
    return value if isinstance(value, str) else _to_json(value).decode()


_JSON_TEXT = Shape(StringType(), True, _json_text)  # what has no Spark type of its own: its JSON text


def _checked(kind: type | tuple[type, ...], what: str, then: Conv | None = None) -> Conv:
    def conv(value: Any) -> Any:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise Unreadable(f"expected {what}, got {type(value).__name__}")
        return value if then is None else then(value)

    return conv


def _long(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise Unreadable(f"integer {value} does not fit a long")
    return value


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise Unreadable(f"{value[:40]!r} is not a date") from None


def _timestamp(value: str) -> dt.datetime:
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        raise Unreadable(f"{value[:40]!r} is not a date-time") from None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=dt.UTC)


def _base64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise Unreadable("not base64") from None


def _json_string(node: Mapping[str, Any]) -> Shape:
    fmt, encoding = node.get("format"), node.get("contentEncoding")
    if fmt == "date":
        return Shape(DateType(), True, _checked(str, "a date string", _date))
    if fmt == "date-time":
        return Shape(TimestampType(), True, _checked(str, "a date-time string", _timestamp))
    if encoding == "base64":
        return Shape(BinaryType(), True, _checked(str, "a base64 string", _base64))
    return Shape(StringType(), True, _checked(str, "a string"))


class JsonShapes:
    """JSON Schema → Spark: objects with properties → struct (a field is non-null when `required` and its
    type excludes null), `additionalProperties` alone → map, arrays → array, integer → long, number →
    double, strings (format date / date-time → date / timestamp, base64 → binary); local `$ref`s are
    followed. What has no single Spark type (mixed types, open schemas) is its JSON text."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.open: list[str] = []

    def of(self, node: Any) -> Shape:
        if not isinstance(node, Mapping):
            return _JSON_TEXT
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self.ref(ref)
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                return self.alternatives(node[key])
        types = node.get("type")
        nullable = False
        if isinstance(types, list):
            nullable = "null" in types
            rest = [t for t in types if t != "null"]
            types = rest[0] if len(rest) == 1 else None
        if types is None and "enum" in node:
            types = "string" if all(isinstance(v, str) for v in node["enum"]) else None
        if types is None and "properties" in node:
            types = "object"
        shape = self.typed(types, node)
        return Shape(shape.dtype, nullable or shape is _JSON_TEXT or types == "null", shape.conv)

    def typed(self, kind: Any, node: Mapping[str, Any]) -> Shape:
        if kind == "string":
            return _json_string(node)
        if kind == "integer":
            return Shape(LongType(), True, _checked(int, "an integer", _long))
        if kind == "number":
            return Shape(DoubleType(), True, _checked((int, float), "a number", float))
        if kind == "boolean":
            return Shape(BooleanType(), True, _checked(bool, "a boolean"))
        if kind == "array" and isinstance(node.get("items"), Mapping):
            item = self.of(node["items"])
            return Shape(ArrayType(item.dtype, item.nullable), True, _list_conv(item.conv))
        if kind == "object":
            return self.obj(node)
        if kind == "null":
            return Shape(StringType())
        return _JSON_TEXT

    def obj(self, node: Mapping[str, Any]) -> Shape:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if not isinstance(props, Mapping) or not props:
            if isinstance(extra, Mapping) and extra:
                value = self.of(extra)
                return Shape(MapType(StringType(), value.dtype, value.nullable), True, _map_conv(value.conv))
            return _JSON_TEXT
        required = set(node.get("required") or ())
        fields = []
        for name, sub in props.items():
            shape = self.of(sub)
            fields.append((str(name), Shape(shape.dtype, shape.nullable or name not in required, shape.conv)))
        return _struct(fields)

    def alternatives(self, options: Sequence[Any]) -> Shape:
        real = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
        if len(real) == 1:
            inner = self.of(real[0])
            return Shape(inner.dtype, True, inner.conv)
        return _JSON_TEXT

    def ref(self, ref: str) -> Shape:
        if not ref.startswith("#/") or ref in self.open:
            return _JSON_TEXT  # a remote or recursive reference: kept as JSON text
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                return _JSON_TEXT
            node = node[part]
        self.open.append(ref)
        try:
            return self.of(node)
        finally:
            self.open.pop()


# --- Protobuf ----------------------------------------------------------------------------------------------

# FieldDescriptor.CPPTYPE_*: INT32 1, INT64 2, UINT32 3, UINT64 4, DOUBLE 5, FLOAT 6, BOOL 7, ENUM 8,
# STRING 9 (string and bytes), MESSAGE 10.
_PROTO_SCALAR: dict[int, DataType] = {
    1: IntegerType(),
    2: LongType(),
    3: LongType(),
    4: DecimalType(20, 0),
    5: DoubleType(),
    6: FloatType(),
    7: BooleanType(),
}
_TYPE_BYTES = 12  # FieldDescriptor.TYPE_BYTES
_TIMESTAMP = "google.protobuf.Timestamp"


def _uint64(value: int) -> decimal.Decimal:
    return decimal.Decimal(value)


class ProtoShapes:
    """Protobuf descriptors → Spark: messages → struct (an unset message field is null), repeated →
    array, map fields → map, enums → their value's name, uint64 → decimal(20,0), Timestamp → timestamp.
    A message's conversion reads the decoded message object field by field."""

    def __init__(self) -> None:
        self.open: list[str] = []

    def message(self, desc: Any) -> Shape:
        if desc.full_name == _TIMESTAMP:
            return Shape(TimestampType(), True, lambda m: m.ToDatetime(tzinfo=dt.UTC))
        if desc.full_name in self.open:
            raise InvalidArgument(
                f"Protobuf message {desc.full_name} is recursive: Spark types cannot hold it"
            )
        self.open.append(desc.full_name)
        try:
            plan = [(f.name, *self.field(f)) for f in desc.fields]
        finally:
            self.open.pop()
        dtype = StructType([StructField(name, s.dtype, s.nullable) for name, s, _ in plan])
        readers = [(name, get) for name, _, get in plan]

        def conv(msg: Any) -> Any:
            return {name: get(msg) for name, get in readers}

        return Shape(dtype, True, conv)

    def field(self, f: Any) -> tuple[Shape, Conv]:
        """The field's shape and how to read it from a message."""
        name = f.name
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, key_conv = self.single(f.message_type.fields_by_name["key"])
            value, value_conv = self.single(f.message_type.fields_by_name["value"])
            return Shape(MapType(key.dtype, value.dtype, value.nullable)), lambda m: [
                (key_conv(k), value_conv(v)) for k, v in getattr(m, name).items()
            ]
        element, one = self.single(f)
        if _repeated(f):
            return Shape(ArrayType(element.dtype, element.nullable)), lambda m: [
                one(v) for v in getattr(m, name)
            ]
        if f.message_type is not None or f.has_presence:
            return Shape(element.dtype, True), lambda m: one(getattr(m, name)) if m.HasField(name) else None
        return Shape(element.dtype, False), lambda m: one(getattr(m, name))

    def single(self, f: Any) -> tuple[Shape, Conv]:
        """One value of the field (an element, when repeated)."""
        if f.message_type is not None:
            shape = self.message(f.message_type)
            assert shape.conv is not None
            return Shape(shape.dtype, False), shape.conv
        if f.enum_type is not None:
            by_number = f.enum_type.values_by_number

            def enum(v: Any) -> Any:
                found = by_number.get(v)
                return found.name if found is not None else str(v)

            return Shape(StringType(), False), enum
        if f.cpp_type == _CPP_STRING:
            return Shape(BinaryType() if f.type == _TYPE_BYTES else StringType(), False), _same
        return Shape(_PROTO_SCALAR[f.cpp_type], False), _uint64 if f.cpp_type == _CPP_UINT64 else _same


_CPP_UINT64, _CPP_STRING = 4, 9


def _same(value: Any) -> Any:
    return value


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated)
