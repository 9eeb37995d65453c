"""Payload validation and fingerprints of parsed schemas (`ister.core.schema`)."""

from __future__ import annotations

import io
import json

import fastavro
from google.protobuf import descriptor_pool
from google.protobuf.message_factory import GetMessageClass

from ister.core.schema import SchemaType, parse
from ister.schema.protoc import compile_proto_sync, parse_proto_sync

AVRO = {
    "type": "record",
    "name": "T",
    "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}],
}


def avro_datum(value: dict[str, object]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO), value)
    return out.getvalue()


def test_avro_datum_and_container_validate() -> None:
    schema = parse(SchemaType.AVRO, json.dumps(AVRO))
    good = avro_datum({"id": 7, "s": "x"})
    assert schema.validate(good) is None
    assert schema.decode(good) == {"id": 7, "s": "x"}
    assert "left over" in (schema.validate(good + b"\x00") or "")
    assert schema.validate(good[:-1]) is not None
    assert schema.validate(b"") is not None
    container = io.BytesIO()
    fastavro.writer(container, fastavro.parse_schema(AVRO), [{"id": 1, "s": "a"}, {"id": 2, "s": "b"}])
    assert schema.validate(container.getvalue()) is None
    other = {"type": "record", "name": "T", "fields": [{"name": "z", "type": "int"}]}
    container = io.BytesIO()
    fastavro.writer(container, fastavro.parse_schema(other), [{"z": 1}])
    assert "resolve" in (schema.validate(container.getvalue()) or "")


def test_json_payloads() -> None:
    schema = parse(
        SchemaType.JSON_SCHEMA,
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    )
    assert schema.validate(b'{"n": 1}') is None
    assert "not JSON" in (schema.validate(b"{") or "")
    assert "n" in (schema.validate(b'{"n": "x"}') or "")
    assert schema.validate(b"{}") is not None
    draft7 = parse(
        SchemaType.JSON_SCHEMA,
        json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "type": "string", "maxLength": 2}),
    )
    assert draft7.validate(b'"ab"') is None and draft7.validate(b'"abc"') is not None


def test_protobuf_payloads() -> None:
    text = 'syntax = "proto3"; package shop; message Order { int64 id = 1; string item = 2; }'
    schema = parse_proto_sync(text)
    assert schema.envelope()["Protobuf"]["message_name"] == "shop.Order"
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(compile_proto_sync(text))
    for f in fds.file:
        pool.Add(f)
    order = GetMessageClass(pool.FindMessageTypeByName("shop.Order"))(id=3, item="pen")
    assert schema.validate(order.SerializeToString()) is None
    assert schema.decode(order.SerializeToString()) == {"id": "3", "item": "pen"}
    assert schema.validate(b"\xff\xff\xff") is not None


def test_primitive_payloads() -> None:
    assert parse(SchemaType.STRING, "").validate("é".encode()) is None
    assert parse(SchemaType.STRING, "").validate(b"\xff") is not None
    assert parse(SchemaType.NUMBER, "").validate(b"\x00" * 8) is None
    assert parse(SchemaType.NUMBER, "").validate(b"\x00" * 3) is not None
    assert parse(SchemaType.BYTES, "").validate(b"\xff") is None
    assert parse(SchemaType.BYTES, "").fingerprint == "bytes"


def test_fingerprints_ignore_layout_but_not_meaning() -> None:
    a = parse(SchemaType.JSON_SCHEMA, '{"type": "object", "required": ["a"]}')
    b = parse(SchemaType.JSON_SCHEMA, '{\n  "required": ["a"],\n  "type": "object"\n}')
    assert a.fingerprint == b.fingerprint and a.fingerprint.startswith("sha256:")
    x = parse(SchemaType.AVRO, json.dumps(AVRO))
    y = parse(SchemaType.AVRO, json.dumps(AVRO, indent=4))
    fields = [*AVRO["fields"], {"name": "n", "type": "int", "default": 0}]  # type: ignore[list-item]
    z = parse(SchemaType.AVRO, json.dumps({**AVRO, "fields": fields}))
    assert x.fingerprint == y.fingerprint != z.fingerprint
    p = parse_proto_sync('syntax = "proto3"; message M { int32 a = 1; }')
    q = parse_proto_sync('syntax="proto3";\n// a comment\nmessage M {\n  int32 a = 1;\n}\n')
    assert p.fingerprint == q.fingerprint


def test_first_invalid_finds_each_bad_payload_in_a_batch() -> None:
    avro = parse(SchemaType.AVRO, json.dumps(AVRO))
    good = avro_datum({"id": 1, "s": "a"})
    batch = [good, good + b"\x00", good, b"\x01", good]
    assert avro.first_invalid(batch) is not None and avro.first_invalid(batch)[0] == 1  # type: ignore[index]
    assert avro.first_invalid(batch, 2)[0] == 3  # type: ignore[index]
    assert avro.first_invalid(batch, 4) is None
    js = parse(SchemaType.JSON_SCHEMA, '{"type": "integer"}')
    assert js.first_invalid([b"1", b"x", b'"s"'], 0)[0] == 1  # type: ignore[index]
    assert js.first_invalid([b"1", b"x", b'"s"'], 2)[0] == 2  # type: ignore[index]
    text = parse(SchemaType.STRING, "")
    assert text.first_invalid([b"a", b"\xff"]) == (1, text.validate(b"\xff"))
