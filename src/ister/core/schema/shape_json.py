"""JSON Schema → neutral shapes (shape_model.py): objects with properties → struct (a field is non-null
when `required` and its type excludes null), `additionalProperties` alone → map, arrays → list, integer →
long, number → double, strings (format date / date-time → date / timestamp, base64 → binary); local
`$ref`s are followed. What has no single type (mixed types, open schemas) is its JSON text."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ister.core.schema.shape_model import (
    BINARY,
    BOOLEAN,
    DATE,
    DOUBLE,
    LONG,
    STRING,
    TIMESTAMP,
    Conv,
    ListOf,
    MapOf,
    Shape,
    Unreadable,
    list_conv,
    map_conv,
    struct,
)

_to_json = msgspec.json.encode


def _json_text(value: Any) -> Any:
    return value if isinstance(value, str) else _to_json(value).decode()


JSON_TEXT = Shape(STRING, True, _json_text)  # what has no type of its own: its JSON text


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


def _string(node: Mapping[str, Any]) -> Shape:
    fmt, encoding = node.get("format"), node.get("contentEncoding")
    if fmt == "date":
        return Shape(DATE, True, _checked(str, "a date string", _date))
    if fmt == "date-time":
        return Shape(TIMESTAMP, True, _checked(str, "a date-time string", _timestamp))
    if encoding == "base64":
        return Shape(BINARY, True, _checked(str, "a base64 string", _base64))
    return Shape(STRING, True, _checked(str, "a string"))


class JsonShapes:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.open: list[str] = []

    def of(self, node: Any) -> Shape:
        if not isinstance(node, Mapping):
            return JSON_TEXT
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
        return Shape(shape.dtype, nullable or shape is JSON_TEXT or types == "null", shape.conv)

    def typed(self, kind: Any, node: Mapping[str, Any]) -> Shape:
        if kind == "string":
            return _string(node)
        if kind == "integer":
            return Shape(LONG, True, _checked(int, "an integer", _long))
        if kind == "number":
            return Shape(DOUBLE, True, _checked((int, float), "a number", float))
        if kind == "boolean":
            return Shape(BOOLEAN, True, _checked(bool, "a boolean"))
        if kind == "array" and isinstance(node.get("items"), Mapping):
            item = self.of(node["items"])
            return Shape(ListOf(item.dtype, item.nullable), True, list_conv(item.conv))
        if kind == "object":
            return self.obj(node)
        if kind == "null":
            return Shape(STRING)
        return JSON_TEXT

    def obj(self, node: Mapping[str, Any]) -> Shape:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if not isinstance(props, Mapping) or not props:
            if isinstance(extra, Mapping) and extra:
                value = self.of(extra)
                return Shape(MapOf(STRING, value.dtype, value.nullable), True, map_conv(value.conv))
            return JSON_TEXT
        required = set(node.get("required") or ())
        fields = []
        for name, sub in props.items():
            shape = self.of(sub)
            fields.append((str(name), Shape(shape.dtype, shape.nullable or name not in required, shape.conv)))
        return struct(fields)

    def alternatives(self, options: Sequence[Any]) -> Shape:
        real = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
        if len(real) == 1:
            inner = self.of(real[0])
            return Shape(inner.dtype, True, inner.conv)
        return JSON_TEXT

    def ref(self, ref: str) -> Shape:
        if not ref.startswith("#/") or ref in self.open:
            return JSON_TEXT  # a remote or recursive reference: kept as JSON text
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                return JSON_TEXT
            node = node[part]
        self.open.append(ref)
        try:
            return self.of(node)
        finally:
            self.open.pop()
