"""Engine-neutral types of registry schemas' values, and the conversions of decoded values into them.

`shapes.shape_of` walks an Avro, JSON Schema or Protobuf schema into a `Shape`: the value's type in the
small type model below, whether it may be null, and `conv` (None when the decoded Python value is already
what Arrow takes for that type). The Spark source (`ister.spark.typed`) turns the types into Spark's and
the topic tables (`ister.tables.typed`) into Arrow's and Iceberg's, so both read a schema the same way.
A conversion raises `Unreadable` when a value does not fit its type. Pure: no engine, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ister.errors import InvalidArgument

Conv = Callable[[Any], Any]
MAX_DECIMAL_PRECISION = 38  # Spark's, Arrow's decimal128 and Iceberg's limit


class Unreadable(InvalidArgument):
    """A decoded value that does not fit the reader's type."""


@dataclass(frozen=True, slots=True)
class Atom:
    """A type without parts; `name` is one of ATOMS."""

    name: str


BOOLEAN, INT, LONG = Atom("boolean"), Atom("int"), Atom("long")
FLOAT, DOUBLE = Atom("float"), Atom("double")
BINARY, STRING = Atom("binary"), Atom("string")
DATE = Atom("date")
TIMESTAMP = Atom("timestamp")  # an instant, microseconds, shown in UTC
TIMESTAMP_NTZ = Atom("timestamp_ntz")  # a wall-clock date and time without zone
ATOMS = (BOOLEAN, INT, LONG, FLOAT, DOUBLE, BINARY, STRING, DATE, TIMESTAMP, TIMESTAMP_NTZ)


@dataclass(frozen=True, slots=True)
class DecimalOf:
    precision: int
    scale: int


@dataclass(frozen=True, slots=True)
class ListOf:
    item: DType
    item_nullable: bool


@dataclass(frozen=True, slots=True)
class MapOf:
    key: DType
    value: DType
    value_nullable: bool


@dataclass(frozen=True, slots=True)
class FieldOf:
    name: str
    dtype: DType
    nullable: bool


@dataclass(frozen=True, slots=True)
class StructOf:
    fields: tuple[FieldOf, ...]


DType = Atom | DecimalOf | ListOf | MapOf | StructOf


@dataclass(frozen=True)
class Shape:
    dtype: DType
    nullable: bool = True
    conv: Conv | None = None  # decoded value → Arrow's value; None: as it is


def apply(conv: Conv | None, value: Any) -> Any:
    return value if conv is None or value is None else conv(value)


def list_conv(item: Conv | None) -> Conv:
    def conv(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise Unreadable(f"expected an array, got {type(value).__name__}")
        return value if item is None else [apply(item, v) for v in value]

    return conv


def map_conv(item: Conv | None) -> Conv:
    def conv(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Unreadable(f"expected a map, got {type(value).__name__}")
        return list(value.items()) if item is None else [(k, apply(item, v)) for k, v in value.items()]

    return conv


def struct_conv(fields: Sequence[tuple[str, Shape]]) -> Conv:
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


def struct(fields: Sequence[tuple[str, Shape]], nullable: bool = True) -> Shape:
    dtype = StructOf(tuple(FieldOf(name, s.dtype, s.nullable) for name, s in fields))
    return Shape(dtype, nullable, struct_conv(fields))


def same(value: Any) -> Any:
    return value
