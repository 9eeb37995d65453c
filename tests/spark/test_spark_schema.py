"""valueFormat=schema and the sink's schemaSubject (issue 17) against a real broker and a real local[2]
Spark: typed columns from Avro, JSON Schema and Protobuf subjects with no schema passed by hand, two
versions in one topic, PERMISSIVE / DROPMALFORMED / FAILFAST on records that do not decode, and the sink
registering the DataFrame's schema and stamping what the official danube-client sees."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import io
import json
from typing import Any

import fastavro
import pytest

from ister.client.blocking import BlockingClient
from ister.core.schema import AvroSchema, parse, parse_schema_type
from ister.schema.protoc import compile_proto_sync
from tests.integration.harness import BrokerProcess, client, consumer, take

pytestmark = pytest.mark.timeout(300)
_seq = iter(range(10**6))
UTC = dt.UTC

SENSOR = {
    "type": "record",
    "name": "Sensor",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["HOT", "COLD"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    ],
}
ORDER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
        "qty": {"type": ["number", "null"]},
        "labels": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id", "item"],
    "additionalProperties": False,
}
PROTO = """syntax = "proto3";
package shop;
message Item {
  string sku = 1;
  int32 count = 2;
  repeated string tags = 3;
  Color color = 4;
  Dim dim = 5;
  map<string, int64> stock = 6;
}
enum Color { RED = 0; BLUE = 1; }
message Dim { double w = 1; double h = 2; }
"""


def names(kind: str) -> tuple[str, str]:
    n = next(_seq)
    return f"/default/typed_{kind}_{n}", f"typed-{kind}-{n}"


def register(url: str, subject: str, kind: str, definition: str) -> tuple[int, int]:
    with BlockingClient(url) as c:
        r = c.call(c.client.schemas.register(subject, kind, definition))
        return r.schema_id, r.version


def produce(url: str, topic: str, payloads: list[bytes], bind: bool = False, **kw: Any) -> None:
    """Stamped by `schema_subject` when given; `bind` binds the topic to it (policy none)."""
    with BlockingClient(url) as c, c.producer(topic, reliable=True, **kw) as p:
        if bind:
            c.call(c.client.schemas.configure_topic(topic, kw["schema_subject"], "none", False))
        for f in [p.send_async(x) for x in payloads]:
            f.result()


def avro_bytes(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    return AvroSchema(json.dumps(schema)).encode(value)


def read(spark: Any, broker: BrokerProcess, topic: str, **options: str) -> Any:
    reader = spark.read.format("ister").option("ister.service.url", broker.url).option("topic", topic)
    reader = reader.option("valueFormat", "schema")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_avro_subject_reads_as_typed_columns(spark: Any, broker: BrokerProcess) -> None:
    topic, subject = names("avro")
    schema_id, _ = register(broker.url, subject, "avro", json.dumps(SENSOR))
    at = dt.datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    rows = [
        {
            "id": i,
            "name": f"s{i}",
            "score": None if i == 1 else i / 2,
            "kind": "HOT" if i % 2 else "COLD",
            "tags": ["a", f"t{i}"],
            "attrs": {"x": i},
            "day": dt.date(2026, 3, i + 1),
            "at": at,
            "price": decimal.Decimal(f"{i}.25"),
        }
        for i in range(3)
    ]
    produce(broker.url, topic, [avro_bytes(SENSOR, r) for r in rows], bind=True, schema_subject=subject)
    df = read(spark, broker, topic)  # the subject comes from the topic's binding: nothing by hand
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,name:string,score:double,kind:string,tags:array<string>,attrs:map<string,bigint>,"
        "day:date,at:timestamp,price:decimal(9,2)>"
    )
    got = df.orderBy("offset").collect()
    assert [r.schemaId for r in got] == [schema_id] * 3 and [r.schemaVersion for r in got] == [1] * 3
    assert all(r._corrupt_record is None for r in got)
    for r, want in zip(got, rows, strict=True):
        v = r.value.asDict()
        assert v["attrs"] == want["attrs"] and v["at"].astimezone(UTC) == at
        assert {k: v[k] for k in ("id", "name", "score", "kind", "tags", "day", "price")} == {
            k: want[k] for k in ("id", "name", "score", "kind", "tags", "day", "price")
        }
    # typed columns are ordinary Spark columns
    assert df.where("value.kind = 'HOT'").select("value.id").collect()[0].id == 1


def test_json_subject_reads_as_typed_columns(spark: Any, broker: BrokerProcess) -> None:
    topic, subject = names("json")
    register(broker.url, subject, "json_schema", json.dumps(ORDER))
    docs = [
        {"id": 1, "item": "pen", "at": "2026-03-01T10:00:00Z", "qty": 2.5, "labels": ["x"]},
        {"id": 2, "item": "cup"},
        {"id": 3},  # `item` is required by the reader's schema: not a value of it (stored: policy none)
    ]
    produce(broker.url, topic, [json.dumps(d).encode() for d in docs], schema_subject=subject)
    df = read(spark, broker, topic, schemaSubject=subject)
    value = df.schema["value"].dataType
    assert (
        value.simpleString() == "struct<id:bigint,item:string,at:timestamp,qty:double,labels:array<string>>"
    )
    got = [r.value.asDict() if r.value else None for r in df.orderBy("offset").collect()]
    assert got[0]["at"].astimezone(UTC) == dt.datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert (got[0]["id"], got[0]["qty"], got[0]["labels"]) == (1, 2.5, ["x"])
    assert got[1] == {"id": 2, "item": "cup", "at": None, "qty": None, "labels": None}
    assert got[2] is None


def test_protobuf_subject_reads_as_typed_columns(spark: Any, broker: BrokerProcess) -> None:
    topic, subject = names("proto")
    register(broker.url, subject, "protobuf", PROTO)
    schema = parse(parse_schema_type("protobuf"), PROTO, compile_proto_sync(PROTO))
    payloads = [
        schema.encode({"sku": "a1", "count": 3, "tags": ["x", "y"], "color": "BLUE", "dim": {"w": 1.5}}),
        schema.encode({"sku": "b2", "stock": {"north": 7}}),
    ]
    produce(broker.url, topic, payloads, bind=True, schema_subject=subject)
    df = read(spark, broker, topic)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<sku:string,count:int,tags:array<string>,color:string,dim:struct<w:double,h:double>,"
        "stock:map<string,bigint>>"
    )
    got = [r.value.asDict(recursive=True) for r in df.orderBy("offset").collect()]
    dim = {"w": 1.5, "h": 0.0}
    assert got[0] == {"sku": "a1", "count": 3, "tags": ["x", "y"], "color": "BLUE", "dim": dim, "stock": {}}
    assert got[1] == {"sku": "b2", "count": 0, "tags": [], "color": "RED", "dim": None, "stock": {"north": 7}}


def test_two_versions_in_one_topic_resolve_into_the_reader_version(spark: Any, broker: BrokerProcess) -> None:
    topic, subject = names("evolve")
    name = {"name": "name", "type": "string"}
    v1 = {"type": "record", "name": "Reading", "fields": [{"name": "id", "type": "int"}, name]}
    level = {"name": "level", "type": "int", "default": -1}
    v2 = {**v1, "fields": [{"name": "id", "type": "long"}, name, level]}
    register(broker.url, subject, "avro", json.dumps(v1))
    old = [avro_bytes(v1, {"id": i, "name": f"old{i}"}) for i in range(2)]
    produce(broker.url, topic, old, bind=True, schema_subject=subject)
    register(broker.url, subject, "avro", json.dumps(v2))  # backward: int → long promoted, level defaulted
    new = [avro_bytes(v2, {"id": 10 + i, "name": f"new{i}", "level": i}) for i in range(2)]
    produce(broker.url, topic, new, schema_subject=subject)
    latest = read(spark, broker, topic).orderBy("offset")
    assert latest.schema["value"].dataType.simpleString() == "struct<id:bigint,name:string,level:int>"
    assert [(r.schemaVersion, tuple(r.value)) for r in latest.collect()] == [
        (1, (0, "old0", -1)), (1, (1, "old1", -1)), (2, (10, "new0", 0)), (2, (11, "new1", 1)),
    ]  # fmt: skip
    pinned = read(spark, broker, topic, schemaVersion="1").orderBy("offset")
    assert pinned.schema["value"].dataType.simpleString() == "struct<id:int,name:string>"
    rows = pinned.collect()
    # v2 records are read with v1 as the reader: `level` dropped; their long ids do not resolve into int
    assert [tuple(r.value) if r.value else None for r in rows[:2]] == [(0, "old0"), (1, "old1")]
    assert [r.value for r in rows[2:]] == [None, None] and all(r._corrupt_record for r in rows[2:])


def test_permissive_dropmalformed_and_failfast(spark: Any, broker: BrokerProcess) -> None:
    topic, subject = names("bad")
    schema = {
        "type": "record",
        "name": "P",
        "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}],
    }
    register(broker.url, subject, "avro", json.dumps(schema))
    good = avro_bytes(schema, {"n": 7, "s": "ok"})
    bad = b"\x0e\x10"  # n=7, then a string of 8 bytes that are not there
    produce(broker.url, topic, [good, bad], bind=True, schema_subject=subject)  # policy none: as sent
    produce(broker.url, topic, [good])  # no schema id at all
    rows = read(spark, broker, topic).orderBy("offset").collect()
    assert [tuple(r.value) if r.value else None for r in rows] == [(7, "ok"), None, None]
    assert [r._corrupt_record for r in rows] == [None, bad, good]
    renamed = read(spark, broker, topic, mode="PERMISSIVE", columnNameOfCorruptRecord="broken")
    assert renamed.columns[-1] == "broken"
    dropped = read(spark, broker, topic, mode="DROPMALFORMED").collect()
    assert [r.offset for r in dropped] == [0]
    with pytest.raises(Exception, match=r"offset 1: the value does not decode by subject") as failed:
        read(spark, broker, topic, mode="FAILFAST").collect()
    assert "FAILFAST" in str(failed.value)


def test_sink_registers_the_dataframe_schema_and_stamps_messages(spark: Any, broker: BrokerProcess) -> None:
    from pyspark.sql.functions import col, struct

    topic, subject = names("sink")
    df = spark.createDataFrame(
        [(1, "pen", 2.5, ["a"]), (2, "cup", None, [])],
        "id long, item string, price double, tags array<string>",
    ).select(col("id").cast("string").alias("key"), struct("id", "item", "price", "tags").alias("value"))

    def write(frame: Any) -> None:
        frame.write.format("ister").option("ister.service.url", broker.url).option("topic", topic).option(
            "schemaSubject", subject
        ).mode("append").save()

    async def subscribe() -> None:  # the subscription starts before anything is written
        dc = await client(broker.url)
        cons, _ = await consumer(dc, topic, "official", "sub")
        await cons.close()

    with BlockingClient(broker.url) as c:
        c.producer(topic, reliable=True).close()  # the topic, reliable, before the subscription
    asyncio.run(subscribe())
    write(df)
    write(df)  # the same schema again: the same version, no new registration
    with BlockingClient(broker.url) as c:
        latest = c.call(c.client.schemas.latest(subject))
        assert latest.version == 1 and latest.schema.type.value == "avro"
        assert c.offsets(topic).next == 4

    async def official() -> list[Any]:
        dc = await client(broker.url)
        cons, queue = await consumer(dc, topic, "official", "sub")
        try:
            return await take(queue, 4, ack=cons)
        finally:
            await cons.close()

    got = asyncio.run(official())
    assert {(m.schema_id, m.schema_version) for m in got} == {(latest.schema_id, 1)}
    parsed = fastavro.parse_schema(json.loads(latest.schema.raw))
    decoded = [fastavro.schemaless_reader(io.BytesIO(m.payload), parsed, None) for m in got]
    decoded.sort(key=lambda d: d["id"])  # two Spark tasks wrote them
    assert decoded[::2] == [
        {"id": 1, "item": "pen", "price": 2.5, "tags": ["a"]},
        {"id": 2, "item": "cup", "price": None, "tags": []},
    ]
    # and the source reads the sink's topic back as typed columns
    back = read(spark, broker, topic, schemaSubject=subject).orderBy("value.id").select("value.*").collect()
    assert [tuple(r) for r in back[::2]] == [(1, "pen", 2.5, ["a"]), (2, "cup", None, [])]
    # an incompatible DataFrame (id becomes a string) is refused by the registry; nothing is written
    bad = spark.createDataFrame([("x", "pen")], "id string, item string").select(
        struct("id", "item").alias("value")
    )
    with pytest.raises(Exception, match=r"cannot be registered under"):
        write(bad)
    with BlockingClient(broker.url) as c:
        assert c.offsets(topic).next == 4
        assert c.call(c.client.schemas.latest(subject)).version == 1
