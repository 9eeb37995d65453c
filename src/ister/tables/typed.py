"""A topic's table layout from its registry schema (issue 44, docs/tables.md "Typed columns").

`table_shape(schema)` gives the table's columns: the envelope (`offset`, `publish_time`, `key`,
`producer`, `attributes`) and, for a bytes topic (no schema, or a primitive one), the payload as `value`;
for an Avro, JSON Schema or Protobuf topic the value's fields as top-level columns (a schema whose value
is not a record: one typed `value` column) plus `_raw` and `_error`, which hold the payload and the reason
for a record that does not decode by the schema (its typed columns are null: Spark's PERMISSIVE).
`to_arrow` turns stored records (plain or compressed) into an Arrow table of that layout, `evolve` merges
the layouts of two schema versions as the table can evolve (typed_evolve.py), and every column keeps an
Iceberg field id (typed_types.py) that the Arrow schema carries as Parquet field ids. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from ister.core.compression import CompressionError, plain
from ister.core.record import LeanMessage, array_header
from ister.core.schema import ParsedSchema, SchemaType
from ister.core.schema.shape_model import (
    BINARY,
    LONG,
    STRING,
    TIMESTAMP,
    FieldOf,
    MapOf,
    Shape,
    StructOf,
    Unreadable,
)
from ister.core.schema.shapes import shape_of
from ister.errors import CorruptionError, InvalidArgument
from ister.tables import typed_types as types
from ister.tables.typed_evolve import merge_columns
from ister.tables.typed_types import Ids, Path

ENVELOPE = (
    FieldOf("offset", LONG, False),
    FieldOf("publish_time", TIMESTAMP, False),
    FieldOf("key", BINARY, True),
    FieldOf("producer", STRING, True),
    FieldOf("attributes", MapOf(STRING, STRING, False), True),
)
RAW, ERROR, VALUE = "_raw", "_error", "value"
_TYPED_EXTRA = (FieldOf(RAW, BINARY, True), FieldOf(ERROR, STRING, True))
_RESERVED = {f.name for f in ENVELOPE} | {RAW, ERROR}
_TYPED = (SchemaType.AVRO, SchemaType.JSON_SCHEMA, SchemaType.PROTOBUF)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError)


class TableShape:
    """A table's columns with their field ids, and how records of the current schema fill them."""

    def __init__(
        self,
        columns: Sequence[FieldOf],
        ids: Ids,
        last_id: int,
        schema: ParsedSchema | None,
        version: int | None,
    ) -> None:
        self.columns = tuple(columns)
        self.ids: Mapping[Path, int] = dict(ids)
        self.last_id = last_id
        self.schema = schema  # None: a bytes topic (the payload is `value`)
        self.version = version  # the registry version `schema` is, when known
        self.value: Shape | None = None if schema is None else shape_of(schema)
        # The value's fields → their columns (a field named like an envelope column gets `value_` before
        # its name); None when the value is not a record and fills one `value` column.
        self.fields: dict[str, str] | None = None
        if self.value is not None and isinstance(self.value.dtype, StructOf):
            self.fields = {f.name: _column_name(f.name) for f in self.value.dtype.fields}
        self.arrow_schema: pa.Schema = types.arrow_schema(self.columns, self.ids)

    def iceberg_schema(self) -> Schema:
        return types.iceberg_schema(self.columns, self.ids)

    def __repr__(self) -> str:
        kind = "bytes" if self.schema is None else self.schema.type.value
        return f"<TableShape {kind} v{self.version} {', '.join(c.name for c in self.columns)}>"


def _column_name(name: str) -> str:
    while name in _RESERVED:
        name = f"value_{name}"
    return name


def _value_columns(schema: ParsedSchema | None) -> tuple[FieldOf, ...]:
    if schema is None:
        return (FieldOf(VALUE, BINARY, False),)
    shape = shape_of(schema)
    if isinstance(shape.dtype, StructOf):  # top-level columns are optional: a record may not decode
        typed = tuple(FieldOf(_column_name(f.name), f.dtype, True) for f in shape.dtype.fields)
    else:
        typed = (FieldOf(VALUE, shape.dtype, True),)
    return _TYPED_EXTRA + typed


def table_shape(schema: ParsedSchema | None, version: int | None = None) -> TableShape:
    """The table layout of a topic whose values have `schema` (None or a primitive type: bytes), with
    field ids numbered as Iceberg numbers a new table; InvalidArgument for a schema no table holds (a
    recursive record)."""
    if schema is not None and schema.type not in _TYPED:
        schema = None  # bytes, string and number payloads are kept as they are
    columns = ENVELOPE + _value_columns(schema)
    ids: dict[Path, int] = {}
    last = types.assign(columns, ids, 0)
    return TableShape(columns, ids, last, schema, version)


def evolve(old: TableShape, new: TableShape) -> TableShape:
    """The table after the topic's schema changed from `old`'s to `new`'s: old ids kept, new columns added
    optional with the next ids, old columns kept (optional); InvalidArgument when the table cannot hold
    both (typed_evolve.py lists what it can). Records then convert by `new`'s schema."""
    columns = merge_columns((), old.columns, new.columns)
    ids = dict(old.ids)
    last = types.assign(columns, ids, old.last_id)
    return TableShape(columns, ids, last, new.schema, new.version)


def adopt_ids(shape: TableShape, schema: Schema) -> TableShape:
    """The shape with the field ids of the table's own schema (an evolution the catalog applied with
    `union_by_name` numbers added columns its way); InvalidArgument when the table lacks a column."""
    found: dict[Path, int] = {}
    for f in schema.fields:
        found[(f.name,)] = f.field_id
        _table_ids((f.name,), f.field_type, found)
    missing = [".".join(p) for p in shape.ids if p not in found]
    if missing:
        raise InvalidArgument(f"the table has no column {', '.join(missing[:5])}: evolve its schema first")
    ids = {p: found[p] for p in shape.ids}
    return TableShape(
        shape.columns, ids, max(schema.highest_field_id, shape.last_id), shape.schema, shape.version
    )


def _table_ids(path: Path, t: IcebergType, found: dict[Path, int]) -> None:
    if isinstance(t, ListType):
        found[(*path, "element")] = t.element_id
        _table_ids((*path, "element"), t.element_type, found)
    elif isinstance(t, MapType):
        found[(*path, "key")], found[(*path, "value")] = t.key_id, t.value_id
        _table_ids((*path, "key"), t.key_type, found)
        _table_ids((*path, "value"), t.value_type, found)
    elif isinstance(t, StructType):
        for f in t.fields:
            found[(*path, f.name)] = f.field_id
            _table_ids((*path, f.name), f.field_type, found)


_decode_lean = msgspec.msgpack.Decoder(list[LeanMessage]).decode
_decode_attrs = msgspec.msgpack.Decoder(dict[str, str]).decode


Records = Sequence[tuple[int, bytes | LeanMessage]]  # (offset, stored record) as a reader returns them


def _messages(records: Records) -> list[LeanMessage]:
    stored = [r for _, r in records]
    if all(isinstance(r, LeanMessage) for r in stored):
        return stored  # type: ignore[return-value]
    try:  # a record stored compressed (docs/compression.md) is decompressed; a plain one is not copied
        raw = [plain(r) if isinstance(r, bytes) else msgspec.msgpack.encode(r) for r in stored]
    except CompressionError as exc:
        raise CorruptionError(f"a stored compressed record does not decompress: {exc}") from None
    return _decode_lean(array_header(len(raw)) + b"".join(raw))


def to_arrow(
    shape: TableShape, records: Records, *, writers: Mapping[int, ParsedSchema] | None = None
) -> pa.Table:
    """The rows of (offset, stored record) pairs (the record as the log keeps it, or decoded as a
    LeanMessage), in `shape.arrow_schema`. An Avro record stamped with another registry version than
    `shape.version` is read by Avro schema resolution from that version's schema in `writers`; without
    it the record goes to `_raw` / `_error`. Every record gives one row, decodable or not."""
    offsets = pa.array([o for o, _ in records], pa.int64())
    return _rows(shape, offsets, _messages(records), writers or {})


def run_to_arrow(
    shape: TableShape,
    first: int,
    stored: Sequence[bytes],
    *,
    writers: Mapping[int, ParsedSchema] | None = None,
) -> pa.Table:
    """`to_arrow` of the stored records of offsets first, first+1, ... (a run read from a WAL segment):
    plain records are decoded in one call, without a Python step per record."""
    offsets = pa.array(range(first, first + len(stored)), pa.int64())
    try:  # 0xC1, a compressed record's first byte, is no msgpack: one makes the bulk decode fail
        messages = _decode_lean(array_header(len(stored)) + b"".join(stored))
    except msgspec.DecodeError:
        messages = _messages([(first + i, r) for i, r in enumerate(stored)])
    return _rows(shape, offsets, messages, writers or {})


def _rows(
    shape: TableShape, offsets: pa.Array, messages: list[LeanMessage], writers: Mapping[int, ParsedSchema]
) -> pa.Table:
    filled: dict[str, pa.Array] = {
        "offset": offsets,
        "publish_time": pa.array(list(map(_publish_time, messages)), pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        "key": pa.array(list(map(_key, messages)), pa.string()).view(pa.binary()),  # no copy
        "producer": pa.array(list(map(_producer, messages)), pa.string()),
        "attributes": _attributes(messages),
    }
    if shape.schema is None:
        filled[VALUE] = pa.array(list(map(_payload, messages)), pa.binary())
    else:
        filled.update(_typed(shape, messages, writers))
    arrays = [
        _cast(filled[f.name], f.type) if f.name in filled else pa.nulls(len(messages), f.type)
        for f in shape.arrow_schema
    ]
    return pa.Table.from_arrays(arrays, schema=shape.arrow_schema)


_key = attrgetter("routing_key")
_producer = attrgetter("producer_name")
_payload = attrgetter("payload")
_attrs = attrgetter("attributes")
_NO_STRINGS = pa.array([], pa.string())
_publish_time = attrgetter("publish_time")
_ATTRIBUTES = pa.map_(pa.string(), pa.string())


def _attributes(messages: list[LeanMessage]) -> pa.Array:
    """The attributes column, built from flat keys and values: most records have none, and a Python step
    per record (a list per row) cost as much as decoding the records."""
    raws = list(map(_attrs, messages))
    # the one 1-byte msgpack map is the empty one (NO_ATTRIBUTES); the broker stores no other 1-byte value
    some = pc.indices_nonzero(pc.not_equal(pa.array(list(map(len, raws)), pa.int32()), 1)).to_pylist()
    if not some:  # no record has attributes: every map empty
        return pa.MapArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), len(raws) + 1), _NO_STRINGS, _NO_STRINGS
        )
    counts = [0] * (len(raws) + 1)
    keys: list[str] = []
    values: list[str] = []
    for i in some:
        found = _decode_attrs(raws[i])
        counts[i + 1] = len(found)
        keys += found.keys()
        values += found.values()
    offsets = pc.cumulative_sum(pa.array(counts, pa.int32()))
    return pa.MapArray.from_arrays(offsets, pa.array(keys, pa.string()), pa.array(values, pa.string()))


def _cast(array: pa.Array, to: pa.DataType) -> pa.Array:
    return array if array.type == to else array.cast(to)


def _typed(
    shape: TableShape, messages: list[LeanMessage], writers: Mapping[int, ParsedSchema]
) -> dict[str, pa.Array]:
    values: list[Any] = []
    raws: list[bytes | None] = []
    errors: list[str | None] = []
    decode = _decoder(shape, writers)
    for m in messages:
        try:
            values.append(decode(m))
            raws.append(None)
            errors.append(None)
        except Unreadable as exc:
            values.append(None)
            raws.append(m.payload)
            errors.append(str(exc))
    by_name = {f.name: f for f in shape.arrow_schema}
    if shape.fields is None:
        target = by_name[VALUE].type
    else:
        target = pa.struct([by_name[c].with_name(c) for c in shape.fields.values()])
        renamed = {k: v for k, v in shape.fields.items() if k != v}
        if renamed:
            values = [None if v is None else {renamed.get(k, k): x for k, x in v.items()} for v in values]
    column = _arrow(values, target, raws, errors, [m.payload for m in messages])
    out = {RAW: pa.array(raws, pa.binary()), ERROR: pa.array(errors, pa.string())}
    if shape.fields is None:
        out[VALUE] = column
    else:
        out.update(zip(shape.fields.values(), column.flatten(), strict=True))
    return out


def _arrow(
    values: list[Any],
    target: pa.DataType,
    raws: list[bytes | None],
    errors: list[str | None],
    payloads: list[bytes],
) -> pa.Array:
    """The decoded values as one array; a value Arrow refuses (out of range, …) makes its record one that
    does not decode, like any other."""
    try:
        return pa.array(values, target)
    except _ARROW_ERRORS:
        pass
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], target)
        except _ARROW_ERRORS as exc:
            values[i], raws[i], errors[i] = None, payloads[i], f"the value does not fit its column: {exc}"
    return pa.array(values, target)


def _decoder(shape: TableShape, writers: Mapping[int, ParsedSchema]) -> Any:
    reader, value = shape.schema, shape.value
    assert reader is not None and value is not None
    conv = value.conv
    avro = reader.type is SchemaType.AVRO
    record = shape.fields is not None  # a JSON `null` is no record: its fields are not all null

    def decode(m: LeanMessage) -> Any:
        try:
            if avro:
                decoded = _avro(reader, shape.version, writers, m)
            elif reader.type is SchemaType.PROTOBUF:
                decoded = reader.message_class.FromString(m.payload)  # type: ignore[attr-defined]
            else:
                decoded = reader.decode(m.payload)
        except (ValueError, DecodeError) as exc:  # msgspec's and fastavro's errors are ValueErrors
            raise Unreadable(str(exc) or type(exc).__name__) from None
        if decoded is None and (record or not value.nullable):
            raise Unreadable("the value is null")
        return decoded if conv is None or decoded is None else conv(decoded)

    return decode


def _avro(
    reader: ParsedSchema, version: int | None, writers: Mapping[int, ParsedSchema], m: LeanMessage
) -> Any:
    written = m.schema_version
    if written is None or version is None or written == version:
        return reader.decode(m.payload)
    writer = writers.get(written)
    if writer is None or writer.type is not SchemaType.AVRO:
        raise Unreadable(f"written by version {written} of the subject, whose Avro schema was not given")
    return writer.read_as(m.payload, reader)  # type: ignore[attr-defined]
