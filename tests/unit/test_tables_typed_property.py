"""Property: for generated Avro and JSON Schema record schemas and values of them, the table rows that
`to_arrow` makes hold exactly the values (the typed columns decoded, nothing in `_raw` / `_error`)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ister.core.record import StoredMessage, encode_message
from ister.core.schema import parse, parse_schema_type
from ister.tables.typed import table_shape, to_arrow

Norm = Callable[[Any], Any]
Node = tuple[Any, st.SearchStrategy[Any], Norm]  # (type definition, values, value → what the row holds)


def _same(v: Any) -> Any:
    return v


TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
UTC_TIMES = st.datetimes(
    min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC)
)
AVRO_LEAVES: list[Node] = [
    ("int", st.integers(-(2**31), 2**31 - 1), _same),
    ("long", st.integers(-(2**63), 2**63 - 1), _same),
    ("float", st.floats(width=32, allow_nan=False), _same),
    ("double", st.floats(allow_nan=False), _same),
    ("boolean", st.booleans(), _same),
    ("string", TEXT, _same),
    ("bytes", st.binary(max_size=8), _same),
    ({"type": "int", "logicalType": "date"}, st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)), _same),
    ({"type": "long", "logicalType": "timestamp-micros"}, UTC_TIMES, _same),
    (
        {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        st.decimals(min_value=-(10**9) + 1, max_value=10**9 - 1, places=3, allow_nan=False),
        _same,
    ),
]


@st.composite
def avro_node(draw: st.DrawFn, names: Any, depth: int = 0) -> Node:
    kinds = ["leaf"] * 4 + (["array", "map", "record", "nullable", "enum"] if depth < 3 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return draw(st.sampled_from(AVRO_LEAVES))
    if kind == "enum":
        symbols = ["A", "B", "C"]
        return (
            {"type": "enum", "name": f"E{next(names)}", "symbols": symbols},
            st.sampled_from(symbols),
            _same,
        )
    if kind == "nullable":
        t, values, norm = draw(avro_node(names, depth + 1).filter(lambda n: not isinstance(n[0], list)))
        return ["null", t], st.none() | values, lambda v: None if v is None else norm(v)
    if kind == "array":
        t, values, norm = draw(avro_node(names, depth + 1))
        return {"type": "array", "items": t}, st.lists(values, max_size=3), lambda v: [norm(x) for x in v]
    if kind == "map":
        t, values, norm = draw(avro_node(names, depth + 1))
        return (
            {"type": "map", "values": t},
            st.dictionaries(TEXT, values, max_size=3),
            lambda v: [(k, norm(x)) for k, x in v.items()],
        )
    return draw(avro_record(names, depth + 1))


@st.composite
def avro_record(draw: st.DrawFn, names: Any, depth: int = 0) -> Node:
    count = draw(st.integers(1, 4))
    fields = [(f"f{i}", draw(avro_node(names, depth))) for i in range(count)]
    definition = {
        "type": "record",
        "name": f"R{next(names)}",
        "fields": [{"name": n, "type": t} for n, (t, _, _) in fields],
    }
    values = st.fixed_dictionaries({n: v for n, (_, v, _) in fields})
    norms = {n: norm for n, (_, _, norm) in fields}
    return definition, values, lambda v: {k: norms[k](x) for k, x in v.items()}


@st.composite
def avro_case(draw: st.DrawFn) -> tuple[Any, list[Any], Norm]:
    definition, values, norm = draw(avro_record(itertools.count()))
    return definition, draw(st.lists(values, min_size=1, max_size=5)), norm


def stored(payload: bytes) -> bytes:
    return encode_message(StoredMessage(payload, 1_000, 1, "p"))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(avro_case())
def test_avro_values_round_trip_through_the_table(case: tuple[Any, list[Any], Norm]) -> None:
    definition, values, norm = case
    schema = parse(parse_schema_type("avro"), json.dumps(definition))
    shape = table_shape(schema, 1)
    table = to_arrow(shape, [(i, stored(schema.encode(v))) for i, v in enumerate(values)])
    assert table.schema.equals(shape.arrow_schema, check_metadata=True)
    rows = table.to_pylist()
    assert [r["_error"] for r in rows] == [None] * len(values)
    assert [{k: r[k] for k in definition_names(definition)} for r in rows] == [norm(v) for v in values]


def definition_names(definition: Any) -> list[str]:
    return [f["name"] for f in definition["fields"]]


JSON_LEAVES: list[Node] = [
    ({"type": "integer"}, st.integers(-(2**63), 2**63 - 1), _same),
    ({"type": "number"}, st.floats(allow_nan=False, allow_infinity=False), float),
    ({"type": "boolean"}, st.booleans(), _same),
    ({"type": "string"}, TEXT, _same),
    ({"type": "string", "format": "date"}, st.dates().map(dt.date.isoformat), dt.date.fromisoformat),
    (
        {"type": "string", "format": "date-time"},
        UTC_TIMES.map(lambda t: t.isoformat()),
        dt.datetime.fromisoformat,
    ),
]


@st.composite
def json_node(draw: st.DrawFn, depth: int = 0) -> Node:
    kind = draw(st.sampled_from(["leaf"] * 3 + (["array", "object", "map"] if depth < 3 else [])))
    if kind == "leaf":
        return draw(st.sampled_from(JSON_LEAVES))
    if kind == "array":
        t, values, norm = draw(json_node(depth + 1))
        return {"type": "array", "items": t}, st.lists(values, max_size=3), lambda v: [norm(x) for x in v]
    if kind == "map":
        t, values, norm = draw(json_node(depth + 1))
        return (
            {"type": "object", "additionalProperties": t},
            st.dictionaries(TEXT, values, max_size=3),
            lambda v: [(k, norm(x)) for k, x in v.items()],
        )
    return draw(json_object(depth + 1))


@st.composite
def json_object(draw: st.DrawFn, depth: int = 0) -> Node:
    fields = [(f"p{i}", draw(json_node(depth))) for i in range(draw(st.integers(1, 4)))]
    required = [n for n, _ in fields if draw(st.booleans())]
    definition = {"type": "object", "properties": {n: t for n, (t, _, _) in fields}, "required": required}
    values = st.fixed_dictionaries(
        {n: v for n, (_, v, _) in fields if n in required},
        optional={n: v for n, (_, v, _) in fields if n not in required},
    )
    norms = {n: norm for n, (_, _, norm) in fields}
    return definition, values, lambda v: {n: norms[n](v[n]) if n in v else None for n in norms}


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(json_object(), st.data())
def test_json_values_round_trip_through_the_table(node: Node, data: st.DataObject) -> None:
    definition, values_of, norm = node
    values = data.draw(st.lists(values_of, min_size=1, max_size=5))
    schema = parse(parse_schema_type("json_schema"), json.dumps(definition))
    shape = table_shape(schema)
    records = [stored(json.dumps(v).encode()) for v in values]
    rows = to_arrow(shape, list(enumerate(records))).to_pylist()
    assert [r["_error"] for r in rows] == [None] * len(values)
    assert [{n: r[n] for n in definition["properties"]} for r in rows] == [norm(v) for v in values]
