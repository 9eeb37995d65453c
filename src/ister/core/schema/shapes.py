"""A registry schema's values as a neutral `Shape` (shape_model.py): Avro (shape_avro.py), JSON Schema
(shape_json.py) and Protobuf (here). Used by the Spark source and by the topic tables."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from ister.core.schema.jsonschema import JsonSchema
from ister.core.schema.model import ParsedSchema
from ister.core.schema.shape_json import JsonShapes
from ister.core.schema.shape_model import (
    BINARY,
    BOOLEAN,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    STRING,
    TIMESTAMP,
    Conv,
    DecimalOf,
    DType,
    FieldOf,
    ListOf,
    MapOf,
    Shape,
    StructOf,
    same,
)
from ister.core.schema.types import SchemaType
from ister.errors import InvalidArgument


def shape_of(schema: ParsedSchema) -> Shape:
    """The shape of a registry schema's values; InvalidArgument for what no column type holds."""
    if schema.type is SchemaType.AVRO:
        from ister.core.schema.shape_avro import AvroShapes

        return AvroShapes().of(schema.resolvable)  # type: ignore[attr-defined]
    if isinstance(schema, JsonSchema):
        return JsonShapes(schema.document).of(schema.document)
    if schema.type is SchemaType.PROTOBUF:
        return ProtoShapes().message(schema.message_class.DESCRIPTOR)  # type: ignore[attr-defined]
    raise InvalidArgument(
        f"typed values come from avro, json_schema and protobuf subjects; this one is {schema.type.value}"
    )


# FieldDescriptor.CPPTYPE_*: INT32 1, INT64 2, UINT32 3, UINT64 4, DOUBLE 5, FLOAT 6, BOOL 7, ENUM 8,
# STRING 9 (string and bytes), MESSAGE 10.
_SCALAR: dict[int, DType] = {
    1: INT,
    2: LONG,
    3: LONG,
    4: DecimalOf(20, 0),
    5: DOUBLE,
    6: FLOAT,
    7: BOOLEAN,
}
_CPP_UINT64, _CPP_STRING = 4, 9
_TYPE_BYTES = 12  # FieldDescriptor.TYPE_BYTES
_TIMESTAMP = "google.protobuf.Timestamp"


def _uint64(value: int) -> decimal.Decimal:
    return decimal.Decimal(value)


class ProtoShapes:
    """Protobuf descriptors → shapes: messages → struct (an unset message field is null), repeated →
    list, map fields → map, enums → their value's name, uint64 → decimal(20,0), Timestamp → timestamp.
    A message's conversion reads the decoded message object field by field."""

    def __init__(self) -> None:
        self.open: list[str] = []

    def message(self, desc: Any) -> Shape:
        if desc.full_name == _TIMESTAMP:
            return Shape(TIMESTAMP, True, lambda m: m.ToDatetime(tzinfo=dt.UTC))
        if desc.full_name in self.open:
            raise InvalidArgument(f"Protobuf message {desc.full_name} is recursive: no column type holds it")
        self.open.append(desc.full_name)
        try:
            plan = [(f.name, *self.field(f)) for f in desc.fields]
        finally:
            self.open.pop()
        dtype = StructOf(tuple(FieldOf(name, s.dtype, s.nullable) for name, s, _ in plan))
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
            return Shape(MapOf(key.dtype, value.dtype, value.nullable)), lambda m: [
                (key_conv(k), value_conv(v)) for k, v in getattr(m, name).items()
            ]
        element, one = self.single(f)
        if f.is_repeated:
            return Shape(ListOf(element.dtype, element.nullable)), lambda m: [
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

            return Shape(STRING, False), enum
        if f.cpp_type == _CPP_STRING:
            return Shape(BINARY if f.type == _TYPE_BYTES else STRING, False), same
        return Shape(_SCALAR[f.cpp_type], False), _uint64 if f.cpp_type == _CPP_UINT64 else same
