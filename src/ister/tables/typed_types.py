"""Column types of a topic's table: the neutral types of `ister.core.schema.shape_model` with Iceberg
field ids, as Arrow and as Iceberg types.

Every column and every nested part has a field id, kept in `Ids` by path: a top-level column is
`(name,)`, a struct's field `(…, field)`, a list's element `(…, "element")`, a map's key and value
`(…, "key")` and `(…, "value")`. Ids never change once given (the table's files are read by them), so a
schema evolution keeps the old paths' ids and gives new paths the next free ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from ister.core.schema.shape_model import Atom, DecimalOf, DType, FieldOf, ListOf, MapOf, StructOf

Path = tuple[str, ...]
Ids = Mapping[Path, int]
FIELD_ID = b"PARQUET:field_id"  # what Parquet writers store as a column's field id, and pyiceberg reads

_ARROW: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "binary": pa.binary(),
    "string": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_ICEBERG: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "binary": BinaryType(),
    "string": StringType(),
    "date": DateType(),
    "timestamp": TimestamptzType(),
    "timestamp_ntz": TimestampType(),
}


class _Numbering:
    def __init__(self, ids: dict[Path, int], last_id: int) -> None:
        self.ids, self.last_id = ids, last_id

    def give(self, path: Path) -> None:
        if path not in self.ids:
            self.last_id += 1
            self.ids[path] = self.last_id

    def fresh(self, path: Path, members: Sequence[FieldOf]) -> None:
        """A new schema's order: a struct's fields, then each field's parts."""
        for f in members:
            self.give((*path, f.name))
        for f in members:
            self.fresh_type((*path, f.name), f.dtype)

    def fresh_type(self, path: Path, t: DType) -> None:
        if isinstance(t, StructOf):
            self.fresh(path, t.fields)
            return
        parts = _parts(path, t)  # a list's element; a map's key and value
        for part, _ in parts:
            self.give(part)
        for part, sub in parts:
            self.fresh_type(part, sub)

    def added(self, path: Path, members: Sequence[FieldOf]) -> None:
        """Pyiceberg's `union_by_name` order: the parts of known fields first (deepest first), then this
        level's new fields, each followed by its own parts in a new schema's order."""
        for f in members:
            if (*path, f.name) in self.ids:
                self.added_type((*path, f.name), f.dtype)
        for f in members:
            if (*path, f.name) not in self.ids:
                self.give((*path, f.name))
                self.fresh_type((*path, f.name), f.dtype)

    def added_type(self, path: Path, t: DType) -> None:
        if isinstance(t, StructOf):
            self.added(path, t.fields)
        else:
            for part, sub in _parts(path, t):
                self.added_type(part, sub)


def _parts(path: Path, t: DType) -> list[tuple[Path, DType]]:
    if isinstance(t, ListOf):
        return [((*path, "element"), t.item)]
    if isinstance(t, MapOf):
        return [((*path, "key"), t.key), ((*path, "value"), t.value)]
    return []


def assign(columns: Sequence[FieldOf], ids: dict[Path, int], last_id: int) -> int:
    """Give every path of `columns` without an id in `ids` the next free id; returns the last id given.
    The order is pyiceberg's: as it numbers a new table's schema when `ids` is empty, as its
    `union_by_name` numbers what an evolution adds otherwise, so that the table's ids are the shape's
    (`typed.adopt_ids` takes the table's ids whatever they are)."""
    numbering = _Numbering(ids, last_id)
    if ids:
        numbering.added((), columns)
    else:
        numbering.fresh((), columns)
    return numbering.last_id


def arrow_type(path: Path, t: DType, ids: Ids) -> pa.DataType:
    if isinstance(t, Atom):
        return _ARROW[t.name]
    if isinstance(t, DecimalOf):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, ListOf):
        return pa.list_(arrow_field((*path, "element"), "element", t.item, t.item_nullable, ids))
    if isinstance(t, MapOf):
        key = arrow_field((*path, "key"), "key", t.key, False, ids)
        return pa.map_(key, arrow_field((*path, "value"), "value", t.value, t.value_nullable, ids))
    return pa.struct([arrow_field((*path, f.name), f.name, f.dtype, f.nullable, ids) for f in t.fields])


def arrow_field(path: Path, name: str, t: DType, nullable: bool, ids: Ids) -> pa.Field:
    return pa.field(name, arrow_type(path, t, ids), nullable, {FIELD_ID: str(ids[path]).encode()})


def arrow_schema(columns: Sequence[FieldOf], ids: Ids) -> pa.Schema:
    return pa.schema([arrow_field((c.name,), c.name, c.dtype, c.nullable, ids) for c in columns])


def iceberg_type(path: Path, t: DType, ids: Ids) -> IcebergType:
    if isinstance(t, Atom):
        return _ICEBERG[t.name]
    if isinstance(t, DecimalOf):
        return DecimalType(t.precision, t.scale)
    if isinstance(t, ListOf):
        element = (*path, "element")
        return ListType(ids[element], iceberg_type(element, t.item, ids), not t.item_nullable)
    if isinstance(t, MapOf):
        key, value = (*path, "key"), (*path, "value")
        return MapType(
            ids[key],
            iceberg_type(key, t.key, ids),
            ids[value],
            iceberg_type(value, t.value, ids),
            not t.value_nullable,
        )
    return StructType(*(iceberg_field((*path, f.name), f, ids) for f in t.fields))


def iceberg_field(path: Path, f: FieldOf, ids: Ids) -> NestedField:
    return NestedField(ids[path], f.name, iceberg_type(path, f.dtype, ids), required=not f.nullable)


def iceberg_schema(columns: Sequence[FieldOf], ids: Ids) -> Schema:
    return Schema(*(iceberg_field((c.name,), c, ids) for c in columns))


def describe(t: DType) -> str:
    """A type as a message shows it (`long`, `decimal(10,2)`, `list<string>`, `struct<a: int>`)."""
    if isinstance(t, Atom):
        return t.name
    if isinstance(t, DecimalOf):
        return f"decimal({t.precision},{t.scale})"
    if isinstance(t, ListOf):
        return f"list<{describe(t.item)}>"
    if isinstance(t, MapOf):
        return f"map<{describe(t.key)}, {describe(t.value)}>"
    return "struct<" + ", ".join(f"{f.name}: {describe(f.dtype)}" for f in t.fields) + ">"
