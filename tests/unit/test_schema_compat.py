"""Compatibility tables per schema type and mode (pure: `ister.core.schema`; Protobuf compiled by protoc).

Each row: an evolution old -> new and whether BACKWARD (new reads old data) and FORWARD (old reads new
data) accept it; FULL accepts what both accept and NONE accepts everything. docs/schema-registry.md
shows the same table.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from ister.core.schema import CompatibilityMode, JsonRules, SchemaType, check, parse
from ister.errors import InvalidArgument
from ister.schema.protoc import parse_proto_sync

M = CompatibilityMode


def avro(fields: list[dict[str, object]], name: str = "User") -> str:
    return json.dumps({"type": "record", "name": name, "fields": fields})


A_BASE = avro([{"name": "id", "type": "int"}, {"name": "name", "type": "string"}])
AVRO_ROWS = [
    # (label, old, new, backward ok, forward ok)
    (
        "add field with default",
        A_BASE,
        avro(
            [
                {"name": "id", "type": "int"},
                {"name": "name", "type": "string"},
                {"name": "age", "type": "int", "default": 0},
            ]
        ),
        True,
        True,
    ),
    (
        "add field without default",
        A_BASE,
        avro(
            [
                {"name": "id", "type": "int"},
                {"name": "name", "type": "string"},
                {"name": "age", "type": "int"},
            ]
        ),
        False,
        True,
    ),
    ("remove field without default", A_BASE, avro([{"name": "id", "type": "int"}]), True, False),
    (
        "promote int to long",
        A_BASE,
        avro([{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]),
        True,
        False,
    ),
    (
        "change string to int",
        A_BASE,
        avro([{"name": "id", "type": "int"}, {"name": "name", "type": "int"}]),
        False,
        False,
    ),
    (
        "rename with alias",
        A_BASE,
        avro([{"name": "id", "type": "int"}, {"name": "full_name", "aliases": ["name"], "type": "string"}]),
        True,
        False,
    ),
    (
        "widen to union with null",
        A_BASE,
        avro([{"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]),
        True,
        False,
    ),
    (
        "rename record",
        A_BASE,
        avro([{"name": "id", "type": "int"}, {"name": "name", "type": "string"}], name="Person"),
        False,
        False,
    ),
]

E_BASE = avro([{"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}}])
AVRO_ROWS += [
    (
        "add enum symbol",
        E_BASE,
        avro([{"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}}]),
        True,
        False,
    ),
    (
        "remove enum symbol",
        E_BASE,
        avro([{"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["RED"]}}]),
        False,
        True,
    ),
]


def js(props: dict[str, object], required: list[str] = (), closed: bool = False) -> str:  # type: ignore[assignment]
    doc: dict[str, object] = {"type": "object", "properties": props, "required": list(required)}
    if closed:
        doc["additionalProperties"] = False
    return json.dumps(doc)


J_OPEN = js({"id": {"type": "integer"}}, ["id"])
J_CLOSED = js({"id": {"type": "integer"}}, ["id"], closed=True)


def nested(inner: dict[str, object], required: list[str] = ()) -> str:  # type: ignore[assignment]
    return json.dumps(
        {
            "type": "object",
            "properties": {
                "address": {"type": "object", "properties": inner, "required": list(required)},
                "tags": {"type": "array", "items": {"type": "object", "properties": inner}},
            },
        }
    )


# (label, old, new, (backward, forward) under DANUBE rules, (backward, forward) under STRICT rules).
# docs/schema-registry.md has this table; keep them the same.
JSON_TABLE = [
    (
        "add optional property",
        J_OPEN,
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id"]),
        (True, True),
        (False, True),
    ),
    (
        "closed: add optional property",
        J_CLOSED,
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id"], closed=True),
        (True, False),
        (True, False),
    ),
    (
        "closed: add required property",
        J_CLOSED,
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id", "n"], closed=True),
        (False, False),
        (False, False),
    ),
    (
        "add required property",
        J_OPEN,
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id", "n"]),
        (False, True),
        (False, True),
    ),
    (
        "remove optional property",
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id"]),
        J_OPEN,
        (True, True),
        (True, False),
    ),
    (
        "remove required property",
        js({"id": {"type": "integer"}, "n": {"type": "string"}}, ["id", "n"]),
        J_OPEN,
        (True, False),
        (True, False),
    ),
    ("make property optional", J_OPEN, js({"id": {"type": "integer"}}), (True, False), (True, False)),
    ("make property required", js({"id": {"type": "integer"}}), J_OPEN, (False, True), (False, True)),
    ("widen integer to number", J_OPEN, js({"id": {"type": "number"}}, ["id"]), (True, False), (True, False)),
    (
        "narrow number to integer",
        js({"id": {"type": "number"}}, ["id"]),
        J_OPEN,
        (False, True),
        (False, True),
    ),
    (
        "change integer to string",
        J_OPEN,
        js({"id": {"type": "string"}}, ["id"]),
        (False, False),
        (False, False),
    ),
    (
        "add enum value",
        js({"c": {"enum": ["a", "b"]}}),
        js({"c": {"enum": ["a", "b", "c"]}}),
        (True, False),
        (True, False),
    ),
    (
        "remove enum value",
        js({"c": {"enum": ["a", "b"]}}),
        js({"c": {"enum": ["a"]}}),
        (False, True),
        (False, True),
    ),
    (
        "tighten maxLength",
        js({"s": {"type": "string"}}),
        js({"s": {"type": "string", "maxLength": 5}}),
        (False, True),
        (False, True),
    ),
    (
        "nested: add optional property",
        nested({"x": {"type": "string"}}),
        nested({"x": {"type": "string"}, "y": {"type": "integer"}}),
        (True, True),
        (False, True),
    ),
    (
        "nested: add required property",
        nested({"x": {"type": "string"}}),
        nested({"x": {"type": "string"}, "y": {"type": "integer"}}, ["y"]),
        (False, True),
        (False, True),
    ),
    (
        "nested: change type",
        nested({"x": {"type": "string"}}),
        nested({"x": {"type": "integer"}}),
        (False, False),
        (False, False),
    ),
]
JSON_ROWS = [(label, old, new, *danube) for label, old, new, danube, _ in JSON_TABLE]


P_BASE = 'syntax = "proto3";\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n  int32 qty = 3;\n}\n'
PROTO_ROWS = [
    (
        "add field",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; int32 qty = 3; bool paid = 4; }',
        True,
        True,
    ),
    (
        "rename field",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string product = 2; int32 qty = 3; }',
        True,
        True,
    ),
    (
        "int32 to int64 (same varint)",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; int64 qty = 3; }',
        True,
        True,
    ),
    (
        "string to bytes",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; bytes item = 2; int32 qty = 3; }',
        True,
        True,
    ),
    (
        "int32 to string (wire type)",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; string qty = 3; }',
        False,
        False,
    ),
    (
        "int32 to sint32 (zigzag)",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; sint32 qty = 3; }',
        False,
        False,
    ),
    (
        "remove field, number reserved",
        P_BASE,
        'syntax = "proto3";\nmessage Order { reserved 3; int64 id = 1; string item = 2; }',
        True,
        True,
    ),
    (
        "remove field, number not reserved",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; }',
        False,
        False,
    ),
    (
        "singular to repeated",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; repeated string item = 2; int32 qty = 3; }',
        False,
        False,
    ),
    (
        "one field into a new oneof",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; oneof what { string item = 2; } int32 qty = 3; }',
        True,
        True,
    ),
    (
        "two fields into one oneof",
        P_BASE,
        'syntax = "proto3";\nmessage Order { int64 id = 1; oneof what { string item = 2; int32 qty = 3; } }',
        False,
        True,
    ),
]
P_RESERVED = 'syntax = "proto3";\nmessage Order { reserved 3; int64 id = 1; string item = 2; }'
PROTO_ROWS += [
    (
        "reuse a reserved number",
        P_RESERVED,
        'syntax = "proto3";\nmessage Order { int64 id = 1; string item = 2; string note = 3; }',
        False,
        False,
    ),
]
P2 = 'syntax = "proto2";\nmessage Order { required int64 id = 1; optional string item = 2; }'
PROTO_ROWS += [
    (
        "proto2: add required field",
        P2,
        'syntax = "proto2";\nmessage Order { required int64 id = 1; optional string item = 2; '
        "required int32 qty = 3; }",
        False,
        True,
    ),
    (
        "proto2: remove required field, reserved",
        P2,
        'syntax = "proto2";\nmessage Order { reserved 1; optional string item = 2; }',
        True,
        False,
    ),
]
P_NESTED = (
    'syntax = "proto3";\nmessage Order { Line line = 1; }\nmessage Line { string sku = 1; int32 n = 2; }'
)
PROTO_ROWS += [
    (
        "nested message: change field type",
        P_NESTED,
        'syntax = "proto3";\nmessage Order { Line line = 1; }\n'
        "message Line { string sku = 1; double n = 2; }",
        False,
        False,
    ),
]


@cache
def parsed(kind: SchemaType, text: str):  # type: ignore[no-untyped-def]
    if kind is SchemaType.PROTOBUF:
        return parse_proto_sync(text)
    return parse(kind, text)


ROWS = (
    [(SchemaType.AVRO, *r) for r in AVRO_ROWS]
    + [(SchemaType.JSON_SCHEMA, *r) for r in JSON_ROWS]
    + [(SchemaType.PROTOBUF, *r) for r in PROTO_ROWS]
)


@pytest.mark.parametrize(
    ("kind", "label", "old", "new", "backward", "forward"), ROWS, ids=[f"{r[0].value}-{r[1]}" for r in ROWS]
)
def test_compatibility_table(
    kind: SchemaType, label: str, old: str, new: str, backward: bool, forward: bool
) -> None:
    o, n = parsed(kind, old), parsed(kind, new)
    history = [(1, o)]
    got = {mode: not check(n, history, mode) for mode in (M.NONE, M.BACKWARD, M.FORWARD, M.FULL)}
    assert got == {M.NONE: True, M.BACKWARD: backward, M.FORWARD: forward, M.FULL: backward and forward}, (
        label,
        {m.value: check(n, history, m) for m in (M.BACKWARD, M.FORWARD)},
    )


@pytest.mark.parametrize(
    ("label", "old", "new", "danube", "strict"), JSON_TABLE, ids=[r[0] for r in JSON_TABLE]
)
def test_json_rules_strict_keeps_the_open_content_model(
    label: str, old: str, new: str, danube: tuple[bool, bool], strict: tuple[bool, bool]
) -> None:
    o, n = parsed(SchemaType.JSON_SCHEMA, old), parsed(SchemaType.JSON_SCHEMA, new)
    got = (
        not check(n, [(1, o)], M.BACKWARD, JsonRules.STRICT),
        not check(n, [(1, o)], M.FORWARD, JsonRules.STRICT),
    )
    assert got == strict, (label, check(n, [(1, o)], M.FULL, JsonRules.STRICT))
    default = (not check(n, [(1, o)], M.BACKWARD), not check(n, [(1, o)], M.FORWARD))
    assert default == danube  # DANUBE is the default


def test_json_errors_name_the_nested_path() -> None:
    old = parsed(SchemaType.JSON_SCHEMA, nested({"x": {"type": "string"}}))
    new = parsed(SchemaType.JSON_SCHEMA, nested({"x": {"type": "string"}, "y": {"type": "integer"}}, ["y"]))
    errors = check(new, [(1, old)], M.BACKWARD)
    assert any("'address.y'" in e and "required" in e for e in errors), errors
    new = parsed(SchemaType.JSON_SCHEMA, nested({"x": {"type": "integer"}}))
    errors = check(new, [(1, old)], M.BACKWARD)
    assert any("address.x" in e for e in errors) and any("tags[].x" in e for e in errors), errors
    added = parsed(SchemaType.JSON_SCHEMA, nested({"x": {"type": "string"}, "y": {"type": "integer"}}))
    assert any("strict" in e for e in check(added, [(1, old)], M.BACKWARD, JsonRules.STRICT))


def test_errors_name_the_reason() -> None:
    old, new = parsed(SchemaType.AVRO, A_BASE), parsed(SchemaType.AVRO, AVRO_ROWS[1][2])
    errors = check(new, [(1, old)], M.BACKWARD)
    assert errors and "age" in errors[0] and "version 1" in errors[0]
    old, new = parsed(SchemaType.PROTOBUF, P_BASE), parsed(SchemaType.PROTOBUF, PROTO_ROWS[7][2])
    assert any("field 3" in e and "reserv" in e for e in check(new, [(1, old)], M.BACKWARD))
    old, new = parsed(SchemaType.JSON_SCHEMA, J_CLOSED), parsed(SchemaType.JSON_SCHEMA, JSON_TABLE[2][2])
    assert any("'n'" in e and "required" in e for e in check(new, [(1, old)], M.BACKWARD))


def test_transitive_modes_check_every_version() -> None:
    # v1 -> v2 adds an optional field with a default; v3 drops the default: compatible with v2 only
    v1 = parsed(SchemaType.AVRO, avro([{"name": "id", "type": "int"}]))
    v2 = parsed(
        SchemaType.AVRO, avro([{"name": "id", "type": "int"}, {"name": "x", "type": "int", "default": 1}])
    )
    v3 = parsed(SchemaType.AVRO, avro([{"name": "id", "type": "int"}, {"name": "x", "type": "int"}]))
    history = [(1, v1), (2, v2)]
    assert check(v3, history, M.BACKWARD) == []
    errors = check(v3, history, M.BACKWARD_TRANSITIVE)
    assert errors and all("version 1" in e for e in errors)
    assert check(v3, history, M.FULL) == []
    assert check(v3, history, M.FULL_TRANSITIVE)


def test_type_change_refused_except_under_none() -> None:
    a = parsed(SchemaType.AVRO, A_BASE)
    j = parsed(SchemaType.JSON_SCHEMA, J_OPEN)
    assert check(j, [(1, a)], M.NONE) == []
    for mode in (M.BACKWARD, M.FORWARD, M.FULL):
        assert any("type changes only under" in e for e in check(j, [(1, a)], mode))
    s, b = parse(SchemaType.STRING, ""), parse(SchemaType.BYTES, "")
    assert check(b, [(1, s)], M.BACKWARD)
    assert check(s, [(1, parse(SchemaType.STRING, ""))], M.FULL_TRANSITIVE) == []


@pytest.mark.parametrize(
    ("kind", "text", "fragment"),
    [
        (SchemaType.AVRO, "{not json", "not JSON"),
        (SchemaType.AVRO, '{"type": "record", "name": "X"}', "invalid Avro"),
        (SchemaType.AVRO, '{"type": "nosuch"}', "invalid Avro"),
        (SchemaType.JSON_SCHEMA, '{"type": 12}', "invalid JSON Schema"),
        (SchemaType.JSON_SCHEMA, "[1, 2]", "object or a boolean"),
        (SchemaType.JSON_SCHEMA, '{"$ref": "http://example.com/s.json"}', "invalid JSON Schema"),
        (SchemaType.PROTOBUF, "message X { int32 a = 1 }", "invalid Protobuf"),
        (SchemaType.PROTOBUF, 'syntax = "proto3"; enum E { A = 0; }', "no message"),
        (SchemaType.PROTOBUF, 'syntax = "proto3"; import "other.proto"; message X {}', "invalid Protobuf"),
    ],
)
def test_unparsable_definitions_are_refused(kind: SchemaType, text: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        parsed.__wrapped__(kind, text)


def json_table_markdown() -> str:
    """The JSON Schema table of docs/schema-registry.md, from JSON_TABLE."""

    def word(ok: bool) -> str:
        return "accepted" if ok else "**rejected**"

    lines = [
        "| Evolution (old → new) | BACKWARD, danube | FORWARD, danube | BACKWARD, strict | FORWARD, strict |",
        "|---|---|---|---|---|",
    ]
    for label, _, _, (db, df), (sb, sf) in JSON_TABLE:
        lines.append(f"| {label} | {word(db)} | {word(df)} | {word(sb)} | {word(sf)} |")
    return "\n".join(lines) + "\n"


def test_the_docs_json_table_is_this_one() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "schema-registry.md").read_text()
    assert json_table_markdown() in docs, "regenerate the table: print(json_table_markdown())"
