"""End to end with real engines: typed rows appended to an Iceberg table in pyiceberg's SQL catalog
(SQLite, local warehouse), the table evolved with the topic's schema, appended again, and read back by
pyiceberg and by DuckDB (the data files pyiceberg's scan plans: DuckDB's iceberg extension is not
installable offline)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from ister.core.record import StoredMessage, encode_message
from ister.core.schema import ParsedSchema, parse, parse_schema_type
from ister.errors import InvalidArgument
from ister.schema.protoc import parse_proto_sync
from ister.tables.typed import TableShape, adopt_ids, evolve, table_shape, to_arrow

UTC = dt.UTC
MONEY = {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}
V1 = {
    "type": "record",
    "name": "Trade",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "price", "type": MONEY},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "venue",
            "type": {"type": "record", "name": "Venue", "fields": [{"name": "mic", "type": "string"}]},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
V2 = {
    "type": "record",
    "name": "Trade",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": {**MONEY, "precision": 12}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "venue",
            "type": {
                "type": "record",
                "name": "Venue",
                "fields": [
                    {"name": "mic", "type": "string"},
                    {"name": "lane", "type": ["null", "int"], "default": None},
                ],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {
            "name": "side",
            "type": ["null", {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL"]}],
            "default": None,
        },
    ],
}
T0 = dt.datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


def avro(doc: Any) -> ParsedSchema:
    return parse(parse_schema_type("avro"), json.dumps(doc))


def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog(
        "ister", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    cat.create_namespace("default")
    return cat


def stored(payload: bytes, version: int, i: int) -> bytes:
    message = StoredMessage(payload, 1_765_000_000_000 + i, 1, "p", {"n": str(i)}, f"k{i}", 9, version)
    return encode_message(message)


def evolve_table(table: Table, shape: TableShape) -> TableShape:
    """What a committer does when the topic's schema changes: union the table's schema with the shape's
    (pyiceberg widens, adds, makes optional), then take the table's ids."""
    with table.update_schema() as update:
        update.union_by_name(shape.iceberg_schema())
    return adopt_ids(shape, table.schema())


def duck_rows(table: Table, columns: str) -> list[tuple[Any, ...]]:
    files = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    query = f'SELECT {columns} FROM read_parquet({files!r}, union_by_name = true) ORDER BY "offset"'
    return duckdb.connect().sql(query).fetchall()


def test_avro_topic_table_appends_evolves_and_reads_back_in_pyiceberg_and_duckdb(tmp_path: Path) -> None:
    v1, v2 = avro(V1), avro(V2)
    cat = catalog(tmp_path)
    shape = table_shape(v1, 1)
    table = cat.create_table("default.trades", schema=shape.iceberg_schema())
    assert table.schema() == shape.iceberg_schema()  # the catalog kept the shape's ids
    first = [
        {
            "id": i,
            "price": decimal.Decimal(f"{i}.25"),
            "at": T0 + dt.timedelta(seconds=i),
            "venue": {"mic": "XOSL"},
            "tags": ["a"] * i,
        }
        for i in range(3)
    ]
    table.append(to_arrow(shape, [(i, stored(v1.encode(v), 1, i)) for i, v in enumerate(first)]))

    grown = evolve(shape, table_shape(v2, 2))
    adopted = evolve_table(table, grown)
    assert adopted.ids == grown.ids  # pyiceberg numbered the added columns as the shape did
    second = [
        {
            **first[0],
            "id": 2**40,
            "price": decimal.Decimal("1234567.89"),
            "venue": {"mic": "XPAR", "lane": 4},
            "side": "SELL",
        }
    ]
    records = [stored(v2.encode(second[0]), 2, 3), stored(v1.encode(first[1]), 1, 4), stored(b"\x01", 2, 5)]
    table.append(to_arrow(adopted, list(zip([3, 4, 5], records, strict=True)), writers={1: v1}))

    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["offset"])
    assert [(r["offset"], r["id"], r["price"], r["venue"], r["side"]) for r in rows] == [
        (0, 0, decimal.Decimal("0.25"), {"mic": "XOSL", "lane": None}, None),
        (1, 1, decimal.Decimal("1.25"), {"mic": "XOSL", "lane": None}, None),
        (2, 2, decimal.Decimal("2.25"), {"mic": "XOSL", "lane": None}, None),
        (3, 2**40, decimal.Decimal("1234567.89"), {"mic": "XPAR", "lane": 4}, "SELL"),
        (4, 1, decimal.Decimal("1.25"), {"mic": "XOSL", "lane": None}, None),  # a v1 record after v2
        (5, None, None, None, None),
    ]
    assert rows[5]["_raw"] == b"\x01" and rows[5]["_error"]
    assert [r["key"] for r in rows] == [f"k{i}".encode() for i in range(6)]
    assert rows[2]["attributes"] == [("n", "2")] and rows[2]["at"] == T0 + dt.timedelta(seconds=2)
    assert [r["tags"] for r in rows[:3]] == [[], ["a"], ["a", "a"]]

    assert duck_rows(
        table, "\"offset\", id, price, venue.mic, venue.lane, side, attributes['n'], _error IS NULL"
    ) == [
        (0, 0, decimal.Decimal("0.25"), "XOSL", None, None, "0", True),
        (1, 1, decimal.Decimal("1.25"), "XOSL", None, None, "1", True),
        (2, 2, decimal.Decimal("2.25"), "XOSL", None, None, "2", True),
        (3, 2**40, decimal.Decimal("1234567.89"), "XPAR", 4, "SELL", "3", True),
        (4, 1, decimal.Decimal("1.25"), "XOSL", None, None, "4", True),
        (5, None, None, None, None, None, "5", False),
    ]
    # (DuckDB hands TIMESTAMPTZ values to Python through pytz, not installed here: compared as numbers)
    assert duck_rows(table, 'epoch_ms(publish_time), epoch_us("at")')[5] == (1_765_000_000_005, None)
    assert duck_rows(table, 'epoch_us("at")')[2] == (int((T0 + dt.timedelta(seconds=2)).timestamp()) * 10**6,)


def test_json_and_protobuf_topic_tables_read_back(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    doc = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "at": {"type": "string", "format": "date"}},
    }
    js = parse(parse_schema_type("json_schema"), json.dumps(doc))
    proto = parse_proto_sync('syntax = "proto3"; message M { string s = 1; repeated int64 v = 2; }')
    for name, schema, payloads, expected in [
        ("j", js, [b'{"n": 1, "at": "2026-12-06"}', b"{}"], [(1, dt.date(2026, 12, 6)), (None, None)]),
        ("p", proto, [proto.encode({"s": "x", "v": [1, 2]}), proto.encode({})], [("x", [1, 2]), ("", [])]),
    ]:
        shape = table_shape(schema, 1)
        table = cat.create_table(f"default.{name}", schema=shape.iceberg_schema())
        table.append(to_arrow(shape, [(i, stored(p, 1, i)) for i, p in enumerate(payloads)]))
        columns = [f.name for f in shape.arrow_schema][-2:]
        got = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["offset"])
        assert [tuple(r[c] for c in columns) for r in got] == expected
        assert duck_rows(table, ", ".join(f'"{c}"' for c in columns)) == expected


def test_bytes_topic_table(tmp_path: Path) -> None:
    shape = table_shape(None)
    table = catalog(tmp_path).create_table("default.raw", schema=shape.iceberg_schema())
    table.append(to_arrow(shape, [(7, stored(b"\x00a", 0, 0)), (8, stored(b"b", 0, 1))]))
    assert duck_rows(table, '"offset", value, key, producer') == [
        (7, b"\x00a", b"k0", "p"),
        (8, b"b", b"k1", "p"),
    ]


def test_evolution_the_table_cannot_follow_leaves_it_unchanged(tmp_path: Path) -> None:
    old = avro({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
    new = avro({"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]})
    shape = table_shape(old, 1)
    table = catalog(tmp_path).create_table("default.t", schema=shape.iceberg_schema())
    with pytest.raises(InvalidArgument, match="column a is long and the new schema makes it string"):
        evolve_table(table, evolve(shape, table_shape(new, 2)))
    assert table.refresh().schema() == shape.iceberg_schema()
