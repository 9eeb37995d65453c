"""Typed tables across schema versions: what the registry accepts and Iceberg can follow evolves the table
(ids kept, columns added optional, types widened), anything else is refused naming the column."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyiceberg.types import StructType

from ister.core.schema import CompatibilityMode, ParsedSchema, check, parse, parse_schema_type
from ister.errors import InvalidArgument
from ister.schema.protoc import parse_proto_sync
from ister.tables.typed import adopt_ids, evolve, table_shape


def avro(fields: list[dict[str, Any]]) -> ParsedSchema:
    return parse(parse_schema_type("avro"), json.dumps({"type": "record", "name": "R", "fields": fields}))


def json_schema(props: dict[str, Any], required: list[str] | None = None) -> ParsedSchema:
    doc = {"type": "object", "properties": props, "required": required or []}
    return parse(parse_schema_type("json_schema"), json.dumps(doc))


def registry_accepts(old: ParsedSchema, new: ParsedSchema) -> bool:
    return not check(new, [(1, old)], CompatibilityMode.BACKWARD)


def dec(precision: int, scale: int = 2) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


V1 = avro(
    [
        {"name": "a", "type": "int"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": dec(5)},
        {"name": "s", "type": {"type": "record", "name": "S", "fields": [{"name": "x", "type": "int"}]}},
        {"name": "l", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "float"}},
        {"name": "gone", "type": ["null", "string"], "default": None},
    ]
)
V2 = avro(
    [
        {"name": "a", "type": "long"},
        {"name": "f", "type": "double"},
        {"name": "d", "type": dec(9)},
        {
            "name": "s",
            "type": {
                "type": "record",
                "name": "S",
                "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "string", "default": ""}],
            },
        },
        {"name": "l", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "double"}},
        {"name": "new", "type": ["null", "int"], "default": None},
    ]
)


def test_avro_evolution_the_registry_accepts_evolves_the_table() -> None:
    assert registry_accepts(V1, V2)
    old, new = table_shape(V1, 1), table_shape(V2, 2)
    grown = evolve(old, new)
    assert grown.version == 2 and grown.schema is V2
    before = {f.name: f for f in old.iceberg_schema().fields}
    after = {f.name: f for f in grown.iceberg_schema().fields}
    # every old column keeps its id; the removed one stays (its older rows are still in the table)
    assert all(after[name].field_id == f.field_id for name, f in before.items())
    assert list(after)[: len(before)] == list(before)
    assert list(after)[len(before) :] == ["new"] and after["new"].field_id > old.last_id
    assert str(after["a"].field_type) == "long" and str(after["f"].field_type) == "double"
    assert str(after["d"].field_type) == "decimal(9, 2)"
    s_before, s_after = before["s"].field_type, after["s"].field_type
    assert isinstance(s_before, StructType) and isinstance(s_after, StructType)
    x_before, x_after, y = s_before.field_by_name("x"), s_after.field_by_name("x"), s_after.field_by_name("y")
    assert x_before is not None and x_after is not None and y is not None
    assert x_after.field_id == x_before.field_id and str(x_after.field_type) == "long" and x_after.required
    assert y.field_id > old.last_id and not y.required  # added inside the struct, optional
    assert str(after["l"].field_type) == "list<long>" and str(after["m"].field_type) == "map<string, double>"
    assert not after["gone"].required
    # the table's Arrow schema is the new shape's columns under the old ids
    assert grown.arrow_schema.names == [*old.arrow_schema.names, "new"]
    assert grown.last_id == max(grown.ids.values())


def test_evolving_again_keeps_every_id_given_before() -> None:
    v3 = avro([*json.loads(V2.raw)["fields"], {"name": "third", "type": ["null", "string"], "default": None}])
    assert registry_accepts(V2, v3)
    two = evolve(table_shape(V1, 1), table_shape(V2, 2))
    three = evolve(two, table_shape(v3, 3))
    assert {p: i for p, i in three.ids.items() if p in two.ids} == two.ids
    assert three.ids[("third",)] == two.last_id + 1 == three.last_id
    assert "gone" in three.arrow_schema.names  # still kept


def test_json_schema_evolution_adds_optional_columns() -> None:
    old = json_schema({"id": {"type": "integer"}}, ["id"])
    new = json_schema({"id": {"type": "integer"}, "note": {"type": "string"}}, ["id"])
    grown = evolve(table_shape(old), table_shape(new))
    assert grown.iceberg_schema().find_field("note").required is False
    assert grown.ids[("id",)] == table_shape(old).ids[("id",)]


def test_protobuf_evolution_adds_fields() -> None:
    old = parse_proto_sync('syntax = "proto3"; message M { int32 a = 1; }')
    new = parse_proto_sync('syntax = "proto3"; message M { int64 a = 1; repeated string b = 2; }')
    grown = evolve(table_shape(old), table_shape(new))
    assert str(grown.iceberg_schema().find_field("a").field_type) == "long"
    assert str(grown.iceberg_schema().find_field("b").field_type) == "list<string>"


def test_a_bytes_topic_that_gets_a_schema_keeps_its_value_column() -> None:
    schema = avro([{"name": "a", "type": "int"}])
    grown = evolve(table_shape(None), table_shape(schema))
    assert grown.arrow_schema.names[5:] == ["value", "_raw", "_error", "a"]
    assert not grown.iceberg_schema().find_field("value").required


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ({"type": "long"}, {"type": "int"}, "column a is long and the new schema makes it int"),
        ({"type": "double"}, {"type": "float"}, "column a is double and the new schema makes it float"),
        ({"type": "int"}, {"type": "string"}, "column a is int and the new schema makes it string"),
        ({"type": "int"}, {"type": "double"}, "column a is int and the new schema makes it double"),
        (dec(9), dec(5), r"column a is decimal\(9,2\) and the new schema makes it decimal\(5,2\)"),
        (dec(9), dec(9, 3), r"decimal\(9,2\) and the new schema makes it decimal\(9,3\)"),
        (
            {"type": "array", "items": "long"},
            {"type": "array", "items": "int"},
            "column a.element is long and the new schema makes it int",
        ),
        (
            {"type": "map", "values": "string"},
            {"type": "array", "items": "string"},
            "column a is map<string, string> and the new schema makes it list<string>",
        ),
    ],
)
def test_evolution_the_table_cannot_follow_is_refused(old: Any, new: Any, why: str) -> None:
    before, after = (
        table_shape(avro([{"name": "a", "type": old}])),
        table_shape(avro([{"name": "a", "type": new}])),
    )
    with pytest.raises(InvalidArgument, match=why):
        evolve(before, after)


def test_json_integer_to_number_is_refused_though_the_registry_widens_it() -> None:
    old = json_schema({"n": {"type": "integer"}})
    new = json_schema({"n": {"type": "number"}})
    with pytest.raises(InvalidArgument, match="column n is long and the new schema makes it double"):
        evolve(table_shape(old), table_shape(new))


def test_adopt_ids_takes_the_tables_ids_and_needs_every_column() -> None:
    shape = table_shape(V1, 1)
    table = table_shape(V1, 1).iceberg_schema()
    assert adopt_ids(shape, table).ids == shape.ids
    grown = evolve(shape, table_shape(V2, 2))
    with pytest.raises(InvalidArgument, match=r"the table has no column .*new.*: evolve its schema first"):
        adopt_ids(grown, table)
