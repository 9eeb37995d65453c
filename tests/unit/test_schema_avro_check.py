"""The compiled Avro check (`ister.core.schema.avro_check`) against fastavro's decoding: every datum it
accepts decodes and uses every byte; every valid datum is accepted; truncated, extended and mutated
payloads of many shapes are refused whenever fastavro refuses them."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import fastavro

from ister.core.schema import AvroSchema
from ister.core.schema.avro import STRICT_REFUSAL

RICH = {
    "type": "record",
    "name": "Rich",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Fx", "size": 3}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "u", "type": ["null", "string", "long"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "double"]}},
        {
            "name": "inner",
            "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]},
        },
        {"name": "again", "type": ["null", "Inner"]},
        {"name": "nodes", "type": {"type": "array", "items": "Inner"}},
    ],
}
LIST = {  # recursive
    "type": "record",
    "name": "Node",
    "fields": [{"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]}],
}


def rich_value(rng: random.Random) -> dict[str, Any]:
    return {
        "id": rng.randint(-(2**63), 2**63 - 1),
        "n": rng.randint(-(2**31), 2**31 - 1),
        "ok": rng.random() < 0.5,
        "f": rng.random(),
        "d": rng.random() * 1e9,
        "s": rng.choice(["", "plain", "ünïcødé ✓", "x" * 200]),
        "b": rng.randbytes(rng.randint(0, 20)),
        "fx": rng.randbytes(3),
        "e": rng.choice("ABC"),
        "u": rng.choice([None, "s", rng.randint(-1000, 10**12)]),
        "tags": [f"t{i}" for i in range(rng.randint(0, 5))],
        "m": {f"k{i}": rng.choice([None, rng.random()]) for i in range(rng.randint(0, 4))},
        "inner": {"x": rng.randint(-5, 5)},
        "again": rng.choice([None, {"x": 3}]),
        "nodes": [{"x": i} for i in range(rng.randint(0, 3))],
    }


def encode(doc: dict[str, Any], value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(doc), value)
    return out.getvalue()


def fastavro_reads(doc: dict[str, Any], payload: bytes) -> bool:
    stream = io.BytesIO(payload)
    try:
        fastavro.schemaless_reader(stream, fastavro.parse_schema(doc), None)
    except Exception:
        return False
    return stream.tell() == len(payload)


def mutations(payload: bytes, rng: random.Random) -> list[bytes]:
    out = [payload[:k] for k in range(len(payload))]  # every truncation
    out += [payload + b"\x00", payload + b"\x02\x41"]
    for _ in range(40):
        b = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return out


def check_against_fastavro(doc: dict[str, Any], payloads: list[bytes], rng: random.Random) -> int:
    schema = AvroSchema(json.dumps(doc))
    check = schema._check
    assert check is not None
    compared = 0
    for payload in payloads:
        assert check(payload), "a valid datum is accepted"
        for candidate in mutations(payload, rng):
            compared += 1
            accepted = check(candidate)
            if accepted:
                assert fastavro_reads(doc, candidate), f"accepted what fastavro refuses: {candidate!r}"
            elif fastavro_reads(doc, candidate):  # only where the specification forbids it
                assert schema.validate(candidate) == STRICT_REFUSAL
            else:
                assert schema.validate(candidate) not in (None, STRICT_REFUSAL)
    return compared


def test_rich_schema_matches_fastavro() -> None:
    rng = random.Random(17)
    payloads = [encode(RICH, rich_value(rng)) for _ in range(60)]
    assert check_against_fastavro(RICH, payloads, rng) > 5000


def test_recursive_schema_matches_fastavro() -> None:
    rng = random.Random(4)
    payloads = []
    for depth in range(6):
        node: Any = None
        for v in range(depth):
            node = {"v": v * 1000, "next": node}
        payloads.append(encode(LIST, node or {"v": 1, "next": None}))
    check_against_fastavro(LIST, payloads, rng)


def test_strict_where_fastavro_is_lenient() -> None:
    doc = {
        "type": "record",
        "name": "L",
        "fields": [
            {"name": "n", "type": "int"},
            {"name": "ok", "type": "boolean"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        ],
    }
    schema = AvroSchema(json.dumps(doc))
    assert schema.validate(b"\x02\x01\x00") is None
    for lenient in (
        b"\xff\xff\xff\xff\x7f\x01\x00",  # an int beyond 32 bits (fastavro wraps it)
        b"\x02\x02\x00",  # boolean byte 2
        b"\x02\x01\x01",  # enum index -1 (fastavro reads the last symbol)
    ):
        assert fastavro_reads(doc, lenient)
        assert schema.validate(lenient) == STRICT_REFUSAL
        assert schema.first_invalid([b"\x02\x01\x00", lenient]) == (1, STRICT_REFUSAL)


def test_logical_types_and_containers_fall_back_to_fastavro() -> None:
    dated = {
        "type": "record",
        "name": "D",
        "fields": [{"name": "d", "type": {"type": "int", "logicalType": "date"}}],
    }
    schema = AvroSchema(json.dumps(dated))
    assert schema._check is None
    assert schema.validate(b"\x02") is None
    assert schema.validate(b"\xfe\xff\xff\xff\x0f") is not None  # a date past year 9999: fastavro refuses
    plain = AvroSchema(json.dumps(LIST))
    container = io.BytesIO()
    fastavro.writer(container, fastavro.parse_schema(LIST), [{"v": 1, "next": None}])
    assert plain.first_invalid([encode(LIST, {"v": 2, "next": None}), container.getvalue()]) is None
