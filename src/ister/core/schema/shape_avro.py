"""Avro schemas (Apache Avro's parsed schema, names resolved) → neutral shapes (shape_model.py), as
Spark's own Avro support maps them: records → struct, enums → string, unions with null → nullable, other
unions → struct of member0..n, logical types → date / timestamp / decimal (a time of day stays its int or
long count, as Spark has no time type)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ister.core.schema.shape_model import (
    BINARY,
    BOOLEAN,
    DATE,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    MAX_DECIMAL_PRECISION,
    STRING,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    Atom,
    DecimalOf,
    FieldOf,
    ListOf,
    MapOf,
    Shape,
    StructOf,
    Unreadable,
    apply,
    list_conv,
    map_conv,
    struct,
)
from ister.errors import InvalidArgument

_PRIMITIVE: dict[str, Atom] = {
    "boolean": BOOLEAN,
    "int": INT,
    "long": LONG,
    "float": FLOAT,
    "double": DOUBLE,
    "bytes": BINARY,
    "string": STRING,
}


def _time_millis(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + value.microsecond // 1000
    return value


def _time_micros(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return value


_LOGICAL: dict[tuple[str, str], Shape] = {
    ("int", "date"): Shape(DATE, False),
    ("long", "timestamp-millis"): Shape(TIMESTAMP, False),
    ("long", "timestamp-micros"): Shape(TIMESTAMP, False),
    ("long", "local-timestamp-millis"): Shape(TIMESTAMP_NTZ, False),
    ("long", "local-timestamp-micros"): Shape(TIMESTAMP_NTZ, False),
    ("int", "time-millis"): Shape(INT, False, _time_millis),
    ("long", "time-micros"): Shape(LONG, False, _time_micros),
    ("string", "uuid"): Shape(STRING, False, str),
}


def _matcher(s: Any) -> Callable[[Any], bool]:
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
        "float": float,
        "double": float,
        "bytes": bytes,
        "string": str,
        "array": list,
        "map": Mapping,
    }
    if kind in ("int", "long"):
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    expected = simple.get(kind, object)
    return lambda v: isinstance(v, expected)


class AvroShapes:
    def __init__(self) -> None:
        self.open: list[str] = []  # records being mapped (a recursive record has no finite type)

    def of(self, s: Any) -> Shape:
        kind = s.type
        logical = s.props.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(s.get_prop("precision")), int(s.get_prop("scale") or 0)
            if precision <= MAX_DECIMAL_PRECISION:
                return Shape(DecimalOf(precision, scale), False)
            return Shape(STRING, False, str)
        found = _LOGICAL.get((kind, str(logical)))
        if found is not None:
            return found
        if kind in _PRIMITIVE:
            return Shape(_PRIMITIVE[kind], False)
        if kind == "null":
            return Shape(STRING)  # always null
        if kind == "enum":
            return Shape(STRING, False)
        if kind == "fixed":
            return Shape(BINARY, False)
        if kind == "array":
            item = self.of(s.items)
            conv = None if item.conv is None else list_conv(item.conv)
            return Shape(ListOf(item.dtype, item.nullable), False, conv)
        if kind == "map":
            value = self.of(s.values)
            return Shape(MapOf(STRING, value.dtype, value.nullable), False, map_conv(value.conv))
        if kind == "union":
            return self.union(s.schemas)
        if kind in ("record", "error"):
            return self.record(s)
        raise InvalidArgument(f"Avro type {kind!r} has no column type")

    def record(self, s: Any) -> Shape:
        if s.fullname in self.open:
            raise InvalidArgument(f"Avro record {s.fullname} is recursive: no column type holds it")
        self.open.append(s.fullname)
        try:
            fields = [(f.name, self.of(f.type)) for f in s.fields]
        finally:
            self.open.pop()
        shape = struct(fields, nullable=False)
        if all(f.conv is None for _, f in fields):
            return Shape(shape.dtype, False, None)  # fastavro's dicts are what Arrow takes
        return shape

    def union(self, branches: Sequence[Any]) -> Shape:
        members = [b for b in branches if b.type != "null"]
        if not members:
            return Shape(STRING)
        if len(members) == 1:
            inner = self.of(members[0])
            return Shape(inner.dtype, True, inner.conv)
        shapes = [self.of(b) for b in members]
        matchers = [_matcher(b) for b in members]
        names = [f"member{i}" for i in range(len(members))]
        dtype = StructOf(tuple(FieldOf(n, sh.dtype, True) for n, sh in zip(names, shapes, strict=True)))

        def conv(value: Any) -> Any:
            out: dict[str, Any] = dict.fromkeys(names)
            for name, shape, matches in zip(names, shapes, matchers, strict=True):
                if matches(value):
                    out[name] = apply(shape.conv, value)
                    return out
            raise Unreadable(f"no union branch holds a {type(value).__name__}")

        return Shape(dtype, len(members) < len(branches), conv)
