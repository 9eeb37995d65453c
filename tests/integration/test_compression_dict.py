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

import grpc
import msgspec
import pytest
from crc32c import crc32c

from ister import errors
from ister.client import Client
from ister.core import zdict
from ister.core.compression import Codec, dictionary_of, uses_dictionary, wrap_with_dictionary
from ister.core.frames import HEADER, HEADER_SIZE
from ister.core.record import StoredMessage, array_header, encode_message
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.integration.compression_support import log_lines, publish_raw, read_payloads
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


async def _trained(b: BrokerProcess, topic: str, lines: list[bytes]) -> int:
    """`topic` (existing) set to zstd with a dictionary, trained on `lines` sent plain: its id."""
    assert "dictionary (sampling)" in cli(
        b, "admin", "topics", "set-compression", topic, "zstd", "--dictionary"
    )
    await _publish(b.url, topic, lines)
    deadline = time.monotonic() + 60
    while True:  # trained in the background: each CLI call is the wait between two looks
        assert time.monotonic() < deadline, "no dictionary within 60 s"
        out = json.loads(cli(b, "admin", "topics", "compression", topic, "--output", "json"))
        if out.get("dictionary_id"):
            return int(out["dictionary_id"])


async def _raw_read(url: str, topic: str, start: int, end: int, dicts: bool) -> list[bytes]:
    """Records [start, end) as the broker sends them to a client with accept_compressed (and, with `dicts`,
    accept_dictionaries; without it: a client from before dictionaries)."""
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        request = pb.ReadRequest(
            topic=topic, start=start, end=end, accept_compressed=True, accept_dictionaries=dicts
        )
        out: list[bytes] = []
        async for batch in pb_grpc.IsterStub(channel).Read(request, timeout=30):
            _, records = split_frames_raw(batch.frames)
            out += records
        return out


def split_frames_raw(frames: bytes) -> tuple[list[int], list[bytes]]:
    offsets, records, pos = [], [], 0
    while pos < len(frames):
        offset, length, crc = HEADER.unpack_from(frames, pos)
        body = frames[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        assert crc32c(body) == crc
        offsets.append(offset)
        records.append(body)
        pos += HEADER_SIZE + length
    return offsets, records


async def _get_dictionary(url: str, dict_id: int, topic: str) -> tuple[grpc.StatusCode, bytes]:
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        request = pb.GetCompressionDictionaryRequest(id=dict_id, topic=topic)
        try:
            resp = await pb_grpc.IsterStub(channel).GetCompressionDictionary(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), b""
        return grpc.StatusCode.OK, resp.dictionary


def _foreign_batch(pid: int) -> pb.PublishBatch:
    """zstd records compressed with a dictionary no broker holds (trained here, never stored)."""
    registry = zdict.DictionaryRegistry()
    dict_id = registry.add(zdict.train(log_lines(100, seed=3), zdict.new_id()))
    recs = [encode_message(StoredMessage(x, 1, pid, "raw")) for x in log_lines(3, seed=4)]
    data = msgspec.msgpack.encode([wrap_with_dictionary(dict_id, r, registry) for r in recs])
    size = len(array_header(3)) + sum(map(len, recs))
    return pb.PublishBatch(sequence=1, records=data, count=3, codec=Codec.ZSTD, uncompressed_size=size)


async def test_ister_clients_fetch_the_dictionary_take_records_as_stored_and_produce_with_it(
    fresh_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = fresh_broker
    topic, plain_topic = "/default/zwire", "/default/zwire_plain"
    lines = log_lines(N, seed=11)
    danube = await client(b.url)
    for t in (topic, plain_topic):
        await producer(danube, t, "setup", reliable=True)  # the topic exists
    dcons, dqueue = await consumer(danube, topic, "danube", "s")
    cli(b, "admin", "topics", "set-compression", plain_topic, "zstd")
    dict_id = await _trained(b, topic, lines[:1000])
    await _publish(b.url, topic, lines[1000:1500])  # plain: the broker compresses with the dictionary
    assert dict_id not in zdict.REGISTRY  # this process has not fetched it yet

    # GetCompressionDictionary: the topic's namespace only
    code, data = await _get_dictionary(b.url, dict_id, topic)
    assert code == grpc.StatusCode.OK and zdict.load_id(data) == dict_id
    assert (await _get_dictionary(b.url, dict_id + 1, topic))[0] == grpc.StatusCode.NOT_FOUND
    assert (await _get_dictionary(b.url, dict_id, "/elsewhere/zwire"))[0] == grpc.StatusCode.NOT_FOUND

    # a consumer whose fetch fails stops with the error; nothing is acked or lost: the next one gets all
    async with Client(b.url) as c:

        async def refused(topic: str, dict_id: int) -> None:
            raise errors.NotFound(f"no zstd dictionary {dict_id} (refused by the test)")

        monkeypatch.setattr(c.dictionaries, "_fetch", refused)
        # a window past the first 1,000 records (no dictionary): it reaches those that need one unacked
        cons = await c.consumer(topic, "i", name="reader", initial_position="earliest", window=2000)
        seen = 0
        with pytest.raises(errors.NotFound, match="refused by the test"):
            async with asyncio.timeout(60):
                while True:
                    seen += len(await cons.receive_batch())  # records 0..999 need no dictionary
        assert seen <= 1000
        await cons.close()
    assert dict_id not in zdict.REGISTRY
    async with Client(b.url) as c:
        cons = await c.consumer(topic, "i", name="reader")  # its name: it gets it back, nothing acked
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < 1500:
                for m in await cons.receive_batch():
                    got.append(m.payload)
                    await m.ack()
        assert got == lines[:1500] and c.dictionaries.fetched == 1  # fetched on demand, once
    assert dict_id in zdict.REGISTRY

    # as stored to a client that accepts dictionaries, plain to one from before them
    assert all(uses_dictionary(r) for r in await _raw_read(b.url, topic, 1000, 1500, dicts=True))
    assert not any(uses_dictionary(r) for r in await _raw_read(b.url, topic, 1000, 1500, dicts=False))

    # a zstd producer compresses with the topic's dictionary, learnt and fetched when it opens
    async with Client(b.url) as c:
        p = await c.producer(topic, "zp", compression="zstd", max_batch_messages=100)
        assert p._pubs[0].dict_id == dict_id
        await p.send_batch(lines[1500:])
        await p.close()
        q = await c.producer(plain_topic, "zq", compression="zstd", max_batch_messages=100)
        assert q._pubs[0].dict_id == 0  # no dictionary in its policy
        await q.send_batch(lines[1500:])
        await q.close()

    # a batch with a dictionary the broker does not hold: refused, nothing stored
    code, details = await publish_raw(b.url, topic, _foreign_batch)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs dictionary" in details, details
    async with Client(b.url) as c:
        assert (await c.offsets(topic)).next == N

    got_danube = await take(dqueue, N, within=60, ack=dcons)
    assert [m.payload for m in got_danube] == lines  # the Danube wire: plain payloads
    assert await read_payloads(b.url, topic) == lines  # the Ister client's Read

    b.terminate()
    stored, zstd_only = wal_records(b.data_dir, "zwire"), wal_records(b.data_dir, "zwire_plain")
    assert len(stored) == N and len(zstd_only) == N - 1500
    assert all(dictionary_of(r) == dict_id for r in stored[1500:])  # the producer's frames name it
    assert not any(uses_dictionary(r) for r in zstd_only)
    dict_bytes, plain_bytes = sum(map(len, stored[1500:])), sum(map(len, zstd_only))
    assert dict_bytes * 1.6 < plain_bytes, (dict_bytes, plain_bytes)
    print(
        f"WAL bytes of 500 records of a zstd producer: {plain_bytes} without, {dict_bytes} with a dictionary"
    )


async def test_a_topic_fed_only_by_zstd_producers_trains_and_they_switch_to_its_dictionary(
    fresh_broker: BrokerProcess,
) -> None:
    b = fresh_broker
    topic = "/default/zonly"
    lines = log_lines(N, seed=21)
    async with Client(b.url) as c:
        p = await c.producer(topic, "zp", compression="zstd", max_batch_messages=100)
        pub = p._pubs[0]
        await p.send_batch(lines[:1])  # the topic exists: its policy can be set
        assert "dictionary (sampling)" in cli(
            b, "admin", "topics", "set-compression", topic, "zstd", "--dictionary"
        )
        await p.send_batch(lines[1:1000])  # compressed by the producer: the broker samples them decompressed
        dict_id = 0
        deadline = time.monotonic() + 60
        while not dict_id:
            assert time.monotonic() < deadline, "no dictionary within 60 s"
            out = json.loads(cli(b, "admin", "topics", "compression", topic, "--output", "json"))
            dict_id = out.get("dictionary_id", 0)
        # the producer opened before it existed: an acknowledgement names it, then it is fetched
        sent = 1000
        while pub._dict_task is None and pub.dict_id != dict_id:
            assert sent < 1500, "no acknowledgement named the dictionary"
            await p.send_batch(lines[sent : sent + 10])
            sent += 10
        if pub._dict_task is not None:
            await pub._dict_task
        assert pub.dict_id == dict_id
        await p.send_batch(lines[sent:])
        await p.close()
    stored = await _raw_read(b.url, topic, 0, N, dicts=True)
    assert len(stored) == N and all(dictionary_of(r) == dict_id for r in stored[sent:])
    assert not any(uses_dictionary(r) for r in stored[:500])  # its sample, before it existed: plain zstd
    assert await read_payloads(b.url, topic) == lines
