"""Peek (issue 37, item 5), where a new subscription starts (item 4) and reliable-by-default CLI commands
(item 6), against a real standalone broker process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client
from tests.integration.cursor_support import ISTER, admin_fails, admin_json, cli
from tests.integration.harness import BrokerProcess, until_attached

pytestmark = pytest.mark.integration

READING = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "int"}, {"name": "v", "type": "double"}],
}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PROTO = 'syntax = "proto3";\nmessage Item {\n  string name = 1;\n  int32 n = 2;\n}\n'


async def produce(url: str, topic: str, *args: str) -> None:
    code, out, err = await cli("produce", "-s", url, "-t", topic, *args)
    assert code == 0, (out, err)


async def test_peek_decodes_by_schema_and_moves_no_cursor(
    shared_broker: BrokerProcess, topic: str, tmp_path: Path
) -> None:
    url, addr = shared_broker.url, shared_broker.admin_addr
    avsc, schema_json, proto = tmp_path / "r.avsc", tmp_path / "p.json", tmp_path / "i.proto"
    avsc.write_text(json.dumps(READING))
    schema_json.write_text(json.dumps(PERSON))
    proto.write_text(PROTO)
    await produce(url, topic + "_avro", "--schema-file", str(avsc), "-m", '{"id": 7, "v": 2.5}', "-k", "k1")
    await produce(url, topic + "_json", "--schema-file", str(schema_json), "-m", '{"name": "ada"}')
    await produce(url, topic + "_proto", "--schema-file", str(proto), "-m", '{"name": "bolt", "n": 3}')
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\x00\xffbin")
    await produce(url, topic, "-f", str(raw), "-a", "origin:test,n:1", "-n", "raw-producer")
    await produce(url, topic, "-m", "text two")

    avro = await admin_json(addr, "peek", topic + "_avro")
    assert len(avro) == 1
    assert avro[0]["value"] == {"id": 7, "v": 2.5} and avro[0]["key"] == "k1"
    assert avro[0]["schema"]["type"] == "avro" and avro[0]["schema"]["version"] == 1
    assert isinstance(avro[0]["schema"]["id"], str) and isinstance(avro[0]["producer_id"], str)
    assert (await admin_json(addr, "peek", topic + "_json"))[0]["value"] == {"name": "ada"}
    proto_value = (await admin_json(addr, "peek", topic + "_proto"))[0]["value"]
    assert proto_value["name"] == "bolt" and int(proto_value["n"]) == 3

    plain = await admin_json(addr, "peek", topic)
    assert [(m["offset"], m.get("payload_encoding")) for m in plain] == [(0, "base64"), (1, None)]
    assert plain[0]["payload"] == "AP9iaW4=" and plain[0]["attributes"] == {"n": "1", "origin": "test"}
    assert plain[0]["producer_name"] == "raw-producer" and plain[1]["payload"] == "text two"
    assert plain[0]["publish_time_iso"].endswith("Z")
    assert [m["offset"] for m in await admin_json(addr, "peek", topic, "--from", "1")] == [1]
    assert [m["offset"] for m in await admin_json(addr, "peek", topic, "-n", "1")] == [0]
    assert await admin_json(addr, "peek", topic, "--from", "9") == []
    assert [m["offset"] for m in await admin_json(addr, "peek", topic, "--time", "-1h")] == [0, 1]
    code, table, err = await cli("admin", "topics", "peek", topic, "--admin-addr", addr)
    assert code == 0, err
    assert "OFFSET" in table.splitlines()[0] and "b'\\x00\\xffbin'" in table and "text two" in table

    # Peeking created no subscription and moved nothing.
    code, subs, err = await cli("admin", "topics", "subscriptions", topic, "--admin-addr", addr, "-o", "json")
    assert code == 0 and json.loads(subs) == [], (subs, err)
    assert "NOT_FOUND" in await admin_fails(addr, "peek", topic + "_missing")
    await admin_fails(addr, "peek", topic, "--from", "0", "--time", "-1m", code=2)
    await admin_fails(addr, "peek", topic, "-n", "0", code=2)


async def test_peek_shows_dead_letters(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "p")
        consumer = await client.consumer(topic, "dl")
        await producer.send(b"poison")
        async with asyncio.timeout(60):
            for _ in range(6):  # the first delivery and 5 redeliveries, each nacked
                await (await consumer.receive()).nack(0, "bad")
            peeked: list[dict[str, object]] = []
            while not peeked:  # the dead letter is published once the last nack is handled
                code, out, _ = await cli(
                    "admin", "topics", "peek", f"{topic}-DLQ", "--admin-addr", shared_broker.admin_addr, "-o",
                    "json",
                )  # fmt: skip
                peeked = json.loads(out) if code == 0 else []
        await consumer.close()
        await producer.close()
    assert peeked[0]["payload"] == "poison"
    attrs = peeked[0]["attributes"]
    assert isinstance(attrs, dict) and attrs["x-original-topic"] == topic
    assert attrs["x-failure-reason"] == "bad"


async def test_a_new_subscription_starts_where_asked(shared_broker: BrokerProcess, topic: str) -> None:
    url = shared_broker.url
    await produce(url, topic, "-m", "old", "-c", "17")
    listed = await admin_json(shared_broker.admin_addr, "describe", topic)
    assert listed["delivery"] == "Reliable"  # `ister produce` is reliable by default
    # Default (latest, as Danube): a fresh subscription sees only what is published after it.
    async with Client(url) as client:
        latest = await client.consumer(topic, "fresh-latest", name="c")
        await client.producer(topic, "p2")
        earliest = await client.consumer(topic, "fresh-earliest", name="c", initial_position="earliest")
        async with asyncio.timeout(15):
            assert (await earliest.receive()).offset == 0
        producer = await client.producer(topic, "p3")
        await producer.send(b"new")
        async with asyncio.timeout(15):
            got = await latest.receive()
        assert got.offset == 17
        await got.ack()
        await latest.close()
        await earliest.close()
        await producer.close()
        # An existing subscription keeps its cursor, whatever the initial position asked.
        again = await client.consumer(topic, "fresh-latest", name="c", initial_position="earliest")
        with pytest.raises(errors.Timeout):
            await again.receive(timeout=2)  # nothing after offset 17: the cursor stayed there
        await again.close()

    early = ("-m", "cli-early", "--position", "earliest", "--count", "7", "--json")
    code, out, err = await cli("consume", "-s", url, "-t", topic, *early)
    assert code == 0, err
    assert [json.loads(line)["offset"] for line in out.splitlines()] == list(range(7))
    code, out, err = await cli(
        "consume", "-s", url, "-t", topic, "-m", "cli-kafka", "--from-beginning", "--count", "18", "--json"
    )
    assert code == 0, err
    assert [json.loads(line)["offset"] for line in out.splitlines()] == list(range(18))
    code, _, err = await cli("consume", "-s", url, "-t", topic, "-m", "x", "--position", "soon")
    assert code == 1 and "--position" in err
    code, _, err = await cli(
        "consume", "-s", url, "-t", topic, "-m", "x", "--position", "latest", "--from-beginning"
    )
    assert code == 1 and "contradicts" in err


async def test_cli_consume_defaults_to_latest(shared_broker: BrokerProcess, topic: str) -> None:
    url = shared_broker.url
    await produce(url, topic, "-m", "before", "-c", "3")
    proc = await asyncio.create_subprocess_exec(
        *ISTER,
        "consume", "-s", url, "-t", topic, "-m", "cli-latest", "-n", "cli-c", "--count", "1", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await until_attached(shared_broker.admin_addr, topic, "cli-latest", "cli-c", within=30)
    await produce(url, topic, "-m", "after")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    assert [json.loads(line)["offset"] for line in out.decode().splitlines()] == [3]
