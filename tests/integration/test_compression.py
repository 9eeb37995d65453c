"""Compression against a real standalone broker (docs/compression.md): every codec through the Ister
client, stored compressed in the WAL and read back after a restart; plain records for the Danube client
and for batch consumers that do not accept compressed ones; topic and namespace policies that compress
what a producer sent plain; bad compressed input refused with nothing stored."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc
import msgspec
import pytest

from ister.client import Client
from ister.core.compression import ENVELOPE, MARK, Codec, compress, parse_codec, wrap
from ister.core.record import StoredMessage, array_header, encode_message
from ister.wire.gen import ister_v1_pb2 as pb
from tests.integration.compression_support import (
    CODECS,
    consumed_codecs,
    log_lines,
    publish_raw,
    read_payloads,
    stored_codecs,
)
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess, client, consumer, producer, take

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ISTER = [sys.executable, "-m", "ister.cli"]


def cli(broker: BrokerProcess, *args: str) -> str:
    done = run_ister([*args, "--admin-addr", broker.admin_addr], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _publish(url: str, topic: str, codec: str, payloads: list[bytes]) -> None:
    async with Client(url) as c:
        p = await c.producer(topic, "p", compression=codec, max_batch_messages=100)
        assert await p.send_batch(payloads) == list(range(len(payloads)))
        await p.close()


async def test_every_codec_round_trips_stored_compressed_through_a_restart(
    fresh_broker: BrokerProcess,
) -> None:
    lines = log_lines(300)
    danube = await client(fresh_broker.url)
    watched = "/default/zstd_watched"
    await producer(danube, watched, "setup", reliable=True)  # the topic exists before the consumer subscribes
    cons, queue = await consumer(danube, watched, "danube", "s")
    for codec in CODECS:
        await _publish(fresh_broker.url, f"/default/c_{codec}", codec, lines)
    await _publish(fresh_broker.url, watched, "zstd", lines[:50])

    # The Danube client gets plain payloads of a compressed topic.
    got = await take(queue, 50, ack=cons)
    assert [m.payload for m in got] == lines[:50]

    fresh_broker.terminate()  # read back from the WAL
    fresh_broker.start()
    for codec in CODECS:
        topic = f"/default/c_{codec}"
        assert await read_payloads(fresh_broker.url, topic) == lines, codec
        assert set(await stored_codecs(fresh_broker.url, topic, 0, 300)) == {parse_codec(codec)}
        # a consumer that did not say it decodes compressed records gets them plain
        assert set(await stored_codecs(fresh_broker.url, topic, 0, 300, accept=False)) == {Codec.NONE}
    # the same on a Consume stream
    assert set(await consumed_codecs(fresh_broker.url, "/default/c_gzip", "old", 300, False)) == {Codec.NONE}
    assert set(await consumed_codecs(fresh_broker.url, "/default/c_gzip", "new", 300, True)) == {Codec.GZIP}


async def test_a_consumer_of_the_ister_client_gets_plain_messages(fresh_broker: BrokerProcess) -> None:
    lines = log_lines(40)
    await _publish(fresh_broker.url, "/default/consumed", "lz4", lines)
    async with Client(fresh_broker.url) as c:
        cons = await c.consumer("/default/consumed", "s", initial_position="earliest")
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while len(got) < 40:
                for m in await cons.receive_batch():
                    got.append(m.payload)
                    await cons.ack(m)
        assert got == lines
        await cons.close()


async def test_a_non_reliable_topic_delivers_a_compressed_batch_plain(fresh_broker: BrokerProcess) -> None:
    danube = await client(fresh_broker.url)
    await producer(danube, "/default/volatile", "setup")
    cons, queue = await consumer(danube, "/default/volatile", "danube", "s")
    lines = log_lines(30)
    async with Client(fresh_broker.url) as c:
        p = await c.producer("/default/volatile", "p", reliable=False, compression="snappy")
        await p.send_batch(lines)
        await p.close()
    assert [m.payload for m in await take(queue, 30, ack=cons)] == lines
    # a codec of its own would compress nothing (nothing is stored): refused in one line; --clear is fine
    refused = run_ister(
        [
            "admin",
            "topics",
            "set-compression",
            "/default/volatile",
            "zstd",
            "--admin-addr",
            fresh_broker.admin_addr,
        ],
        timeout=60,
    )
    assert refused.returncode == 1 and refused.stderr.startswith(
        "error: /default/volatile is NonReliable: it stores nothing, so a codec of its own compresses nothing"
    ), refused.stderr
    assert "FAILED_PRECONDITION" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert "none (default)" in cli(fresh_broker, "admin", "topics", "compression", "/default/volatile")
    cli(fresh_broker, "admin", "topics", "set-compression", "/default/volatile", "--clear")


async def test_topic_and_namespace_policies_compress_what_a_producer_sent_plain(
    fresh_broker: BrokerProcess,
) -> None:
    b = fresh_broker
    cli(b, "admin", "namespaces", "create", "packed")
    assert "gzip (namespace)" in cli(b, "admin", "namespaces", "set-compression", "packed", "gzip")
    danube = await client(b.url)
    p = await producer(danube, "/packed/own", "p", reliable=True)
    assert "zstd (topic)" in cli(b, "admin", "topics", "set-compression", "/packed/own", "zstd")
    described = json.loads(cli(b, "admin", "topics", "describe", "/packed/own", "--output", "json"))
    assert (described["compression"], described["compression_source"]) == ("zstd", "topic")
    lines = log_lines(20)
    for line in lines[:10]:
        await p.send(line, None)
    await _publish(b.url, "/packed/inherits", "none", lines)
    assert await stored_codecs(b.url, "/packed/own", 0, 10) == [Codec.ZSTD] * 10
    assert await stored_codecs(b.url, "/packed/inherits", 0, 20) == [Codec.GZIP] * 20
    # a producer's own codec wins over the policy
    await _publish(b.url, "/packed/lz4", "lz4", lines[:5])
    assert await stored_codecs(b.url, "/packed/lz4", 0, 5) == [Codec.LZ4] * 5
    # cleared: the namespace's applies again, from the next publish
    assert "gzip (namespace)" in cli(b, "admin", "topics", "set-compression", "/packed/own", "--clear")
    for line in lines[10:]:
        await p.send(line, None)
    assert await stored_codecs(b.url, "/packed/own", 10, 20) == [Codec.GZIP] * 10
    assert await read_payloads(b.url, "/packed/own") == lines
    assert await read_payloads(b.url, "/packed/inherits") == lines
    # `ister produce --compression`: the producer's codec wins over the namespace's
    produce = [*ISTER, "produce", "-s", b.url, "-t", "/packed/cli", "-m", "hello", "--compression", "snappy"]
    done = await asyncio.to_thread(
        subprocess.run, produce, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert await stored_codecs(b.url, "/packed/cli", 0, 1) == [Codec.SNAPPY]
    # peek (the console's and the CLI's) shows plain payloads
    peeked = json.loads(cli(b, "admin", "topics", "peek", "/packed/own", "-n", "2", "--output", "json"))
    assert [m["payload"].encode() for m in peeked] == lines[:2]


def _records(pid: int, payloads: list[bytes]) -> list[bytes]:
    return [encode_message(StoredMessage(x, 1, pid, "raw")) for x in payloads]


def _compressed(pid: int, codec: Codec, payloads: list[bytes]) -> pb.PublishBatch:
    recs = _records(pid, payloads)
    plain = array_header(len(recs)) + b"".join(recs)
    data = msgspec.msgpack.encode([wrap(codec, r) for r in recs])
    return pb.PublishBatch(
        sequence=1, records=data, count=len(recs), codec=codec, uncompressed_size=len(plain)
    )


def _corrupt(pid: int) -> pb.PublishBatch:
    b = _compressed(pid, Codec.ZSTD, [b"a" * 500, b"b" * 500])
    stored = msgspec.msgpack.decode(b.records)
    stored[1] = stored[1][: ENVELOPE.size] + bytes(
        len(stored[1]) - ENVELOPE.size
    )  # zeros for the codec bytes
    b.records = msgspec.msgpack.encode(stored)
    return b


def _wrong_size(pid: int) -> pb.PublishBatch:
    recs = _records(pid, [b"x" * 300])
    wrong = ENVELOPE.pack(MARK, Codec.LZ4, len(recs[0]) + 7) + compress(Codec.LZ4, recs[0])
    size = len(array_header(1)) + len(recs[0]) + 7
    return pb.PublishBatch(
        sequence=1, records=msgspec.msgpack.encode([wrong]), count=1, codec=Codec.LZ4, uncompressed_size=size
    )


def _unknown_codec(pid: int) -> pb.PublishBatch:
    b = _compressed(pid, Codec.SNAPPY, [b"y" * 100])
    b.codec = 9
    return b


def _total_mismatch(pid: int) -> pb.PublishBatch:
    b = _compressed(pid, Codec.GZIP, [b"z" * 100, b"w" * 100])
    b.uncompressed_size += 1
    return b


def _codec_mismatch(pid: int) -> pb.PublishBatch:
    b = _compressed(pid, Codec.GZIP, [b"z" * 100])
    b.codec = Codec.ZSTD
    return b


async def test_bad_compressed_input_is_refused_and_nothing_of_its_batch_is_stored(
    fresh_broker: BrokerProcess,
) -> None:
    topic = "/default/bad_input"
    assert (await publish_raw(fresh_broker.url, topic, lambda pid: _compressed(pid, Codec.ZSTD, [b"ok"])))[
        0
    ] == (grpc.StatusCode.OK)
    cases = {
        "corrupt": (_corrupt, "does not decompress"),
        "wrong size": (_wrong_size, "lz4"),
        "unknown codec": (_unknown_codec, "unknown codec id 9"),
        "sizes do not add up": (_total_mismatch, "add up to"),
        "another codec": (_codec_mismatch, "not a record compressed with codec 4"),
    }
    async with Client(fresh_broker.url) as c:
        for what, (make, message) in cases.items():
            code, details = await publish_raw(fresh_broker.url, topic, make)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, what
            assert message in details, (what, details)
            assert (await c.offsets(topic)).next == 1, what  # the first, good batch only
    assert await read_payloads(fresh_broker.url, topic) == [b"ok"]
