"""zstd dictionaries against a real standalone broker (docs/compression.md, "Dictionaries"): a topic whose
policy asks for one trains it on its first plain records and stores the rest with it; every reader gets
the records back equal (the Danube wire, the Ister client's Read and Consume, peek), the WAL holds fewer
bytes than plain zstd's, and a restarted broker reads them (its dictionary loaded from metadata)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from crc32c import crc32c

from ister.client import Client
from ister.core.compression import uses_dictionary
from ister.core.frames import HEADER, HEADER_SIZE
from tests.integration.compression_support import log_lines, read_payloads
from tests.integration.harness import BrokerProcess, client, consumer, producer, take
from tests.integration.test_compression import cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
N = 2000


async def _publish(url: str, topic: str, payloads: list[bytes]) -> None:
    async with Client(url) as c:
        p = await c.producer(topic, "p", max_batch_messages=100)  # plain: the topic's policy compresses
        await p.send_batch(payloads)
        await p.close()


def wal_records(data: Path, topic: str, namespace: str = "default") -> list[bytes]:
    """The records of a topic's WAL segment files as stored (frames read until the preallocated tail)."""
    out: list[bytes] = []
    root = data / "wal" / namespace / topic
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix == ".wal"):
        raw, pos = f.read_bytes(), 0
        while pos + HEADER_SIZE <= len(raw):
            _, length, crc = HEADER.unpack_from(raw, pos)
            body = raw[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
            if length == 0 or crc32c(body) != crc:
                break
            out.append(body)
            pos += HEADER_SIZE + length
    return out


async def _consume(url: str, topic: str, n: int) -> list[bytes]:
    async with Client(url) as c:
        cons = await c.consumer(topic, "ister", initial_position="earliest")
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < n:
                for m in await cons.receive_batch():
                    got.append(m.payload)
                    await cons.ack(m)
        await cons.close()
        return got


async def test_a_dictionary_topic_stores_fewer_bytes_and_reads_back_everywhere(
    fresh_broker: BrokerProcess, tmp_path: Path
) -> None:
    b = fresh_broker
    lines = log_lines(N)
    danube = await client(b.url)
    for t in ("zdict", "zplain"):
        await producer(danube, f"/default/{t}", "setup", reliable=True)  # the topic exists
    cons, queue = await consumer(danube, "/default/zdict", "danube", "s")
    shown = cli(b, "admin", "topics", "set-compression", "/default/zdict", "zstd", "--dictionary")
    assert "zstd (topic), dictionary (sampling)" in shown
    cli(b, "admin", "topics", "set-compression", "/default/zplain", "zstd")

    # the first 1,000 plain records: 500 are sampled, the dictionary is trained and stored
    await _publish(b.url, "/default/zdict", lines[:1000])
    dict_id = 0
    deadline = time.monotonic() + 60
    while not dict_id:  # trained in the background: each CLI call is the wait between two looks
        assert time.monotonic() < deadline, "no dictionary within 60 s"
        out = json.loads(cli(b, "admin", "topics", "compression", "/default/zdict", "--output", "json"))
        dict_id = out.get("dictionary_id", 0)
    await _publish(b.url, "/default/zdict", lines[1000:])
    await _publish(b.url, "/default/zplain", lines)

    got = await take(queue, N, within=60, ack=cons)
    assert [m.payload for m in got] == lines  # the Danube wire: plain payloads
    assert await read_payloads(b.url, "/default/zdict") == lines  # the Ister client's Read
    assert await _consume(b.url, "/default/zdict", N) == lines  # and Consume stream
    peeked = json.loads(
        cli(b, "admin", "topics", "peek", "/default/zdict", "--from", "1990", "-n", "10", "--output", "json")
    )
    assert [m["payload"].encode() for m in peeked] == lines[1990:]

    b.terminate()  # the WAL as stored, then a restart that must load the dictionary from metadata
    stored = wal_records(b.data_dir, "zdict")
    zstd_only = wal_records(b.data_dir, "zplain")
    assert len(stored) == len(zstd_only) == N
    with_dict = [r for r in stored if uses_dictionary(r)]
    assert len(with_dict) >= 1000
    assert not any(uses_dictionary(r) for r in zstd_only)
    dict_bytes, plain_bytes = sum(map(len, stored[1000:])), sum(map(len, zstd_only[1000:]))
    assert dict_bytes * 1.6 < plain_bytes, (dict_bytes, plain_bytes)
    print(f"stored bytes of records 1000..1999: zstd {plain_bytes}, zstd+dict {dict_bytes}")

    b.start()
    assert await read_payloads(b.url, "/default/zdict") == lines
    peeked = json.loads(
        cli(b, "admin", "topics", "peek", "/default/zdict", "--from", "1500", "-n", "3", "--output", "json")
    )
    assert [m["payload"].encode() for m in peeked] == lines[1500:1503]
    assert re.search(rf"dictionary {dict_id}\b", cli(b, "admin", "topics", "compression", "/default/zdict"))
