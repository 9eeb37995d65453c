"""Idempotent producers against a real standalone broker (docs/idempotence.md).

The batch API is driven by hand here so that a lost acknowledgement is exact: the same batch (producer key
and first sequence) is sent again on a new stream, after a restart, after kill -9 and after the WAL was
trimmed to the durable tier; each time the broker answers with the original offsets and stores nothing.
A gap in sequences is refused. tests/integration/test_idempotence_chaos.py drives the real client through
kill -9 rounds.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import msgspec
import pytest

from ister import errors
from ister.client import Client
from ister.core.record import StoredMessage, array_header, decode_message, encode_message
from ister.limits import PUBLISH_TIMEOUT_SECONDS
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.integration.diskfault import DiskFault, build_library
from tests.integration.harness import BrokerProcess, broker_metric, client, consumer, take

pytestmark = pytest.mark.integration


class Stream:
    """One Publish stream opened by hand."""

    def __init__(self, url: str, topic: str, name: str = "idem") -> None:
        self.channel = grpc.aio.insecure_channel(url.removeprefix("http://"))
        self.call = pb_grpc.IsterStub(self.channel).Publish()
        self.topic, self.name = topic, name
        self.pid = 0
        self.stream_seq = 0

    async def open(self) -> Stream:
        opening = pb.PublishOpen(topic=self.topic, producer_name=self.name, delivery=pb.RELIABLE)
        await self.call.write(pb.PublishRequest(open=opening))
        resp = await asyncio.wait_for(self.call.read(), 30)
        self.pid = resp.opened.producer_id
        return self

    async def send(
        self, payloads: list[bytes], key: int, first_seq: int, age_ms: int = 0, wait: float = 30
    ) -> pb.PublishAck:
        self.stream_seq += 1
        now = time.time_ns() // 1_000_000 - age_ms  # the window is measured in publish time
        recs = [encode_message(StoredMessage(p, now, self.pid, self.name)) for p in payloads]
        records = array_header(len(recs)) + b"".join(recs)
        batch = pb.PublishBatch(
            sequence=self.stream_seq,
            records=records,
            count=len(recs),
            producer_key=key,
            first_sequence=first_seq,
        )
        await self.call.write(pb.PublishRequest(batch=batch))
        resp = await asyncio.wait_for(self.call.read(), wait)
        if resp is grpc.aio.EOF:
            raise await _status(self.call)
        return resp.ack

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


async def _status(call: grpc.aio.StreamStreamCall) -> grpc.aio.AioRpcError:
    code = await call.code()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), await call.details())


@pytest.fixture
async def streams(fresh_broker: BrokerProcess) -> AsyncIterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for s in opened:
        await s.close()


async def _stream(broker: BrokerProcess, topic: str, opened: list[Stream]) -> Stream:
    s = Stream(broker.url, topic)
    opened.append(s)
    return await s.open()


async def _stored(url: str, topic: str) -> list[tuple[int, bytes]]:
    async with Client(url) as c:
        head = (await c.offsets(topic)).next
        out: list[tuple[int, bytes]] = []
        async for batch in c.read(topic, 0, head):
            out.extend((o, decode_message(r).payload) for o, r in batch)
        return out


async def test_a_retried_batch_gets_its_original_offsets_across_streams_restart_and_kill9(
    fresh_broker: BrokerProcess, topic: str, streams: list[Stream]
) -> None:
    key = secrets.randbits(63) + 1
    first = await _stream(fresh_broker, topic, streams)
    a = await first.send([b"a0", b"a1", b"a2"], key, 0)
    b = await first.send([b"b0"], key, 3)
    assert (a.first_offset, a.count, b.first_offset) == (0, 3, 3)
    other = await first.send([b"x"], key + 1, 0)  # another producer in between
    assert other.first_offset == 4

    # The ack was "lost": the same batches again on a new stream.
    second = await _stream(fresh_broker, topic, streams)
    assert (await second.send([b"a0", b"a1", b"a2"], key, 0)).first_offset == 0
    assert (await second.send([b"b0"], key, 3)).first_offset == 3
    assert broker_metric(fresh_broker.metrics_url, "ister_publish_duplicates_total") == 4
    assert (await second.send([b"c0"], key, 4)).first_offset == 5

    # Rebuilt from the WAL after a graceful restart and after kill -9.
    for stop in (fresh_broker.terminate, fresh_broker.kill9):
        stop()
        fresh_broker.start()
        again = await _stream(fresh_broker, topic, streams)
        assert (await again.send([b"a0", b"a1", b"a2"], key, 0)).first_offset == 0
        assert (await again.send([b"c0"], key, 4)).first_offset == 5

    stored = await _stored(fresh_broker.url, topic)
    assert [p for _, p in stored] == [b"a0", b"a1", b"a2", b"b0", b"x", b"c0"]
    assert [o for o, _ in stored] == list(range(6))


async def test_a_gap_in_sequences_is_refused_and_stores_nothing(
    fresh_broker: BrokerProcess, topic: str, streams: list[Stream]
) -> None:
    key = 7
    s = await _stream(fresh_broker, topic, streams)
    await s.send([b"m0", b"m1"], key, 0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await s.send([b"m5"], key, 5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "out of order sequence" in (err.value.details() or "")
    assert "expected 2" in (err.value.details() or "")
    # A batch that overlaps the stored ones without being one of them: refused too, nothing stored.
    s2 = await _stream(fresh_broker, topic, streams)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await s2.send([b"m1", b"m2"], key, 1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "overlapping" in (err.value.details() or "")
    s2 = await _stream(fresh_broker, topic, streams)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # inside what is stored: stored, offsets unknown
        await s2.send([b"m1"], key, 1)
    assert "duplicate sequence" in (err.value.details() or "")
    s3 = await _stream(fresh_broker, topic, streams)
    assert (await s3.send([b"m2"], key, 2)).first_offset == 2
    assert [p for _, p in await _stored(fresh_broker.url, topic)] == [b"m0", b"m1", b"m2"]


async def test_without_a_key_a_retry_is_stored_again(
    fresh_broker: BrokerProcess, topic: str, streams: list[Stream]
) -> None:
    s = await _stream(fresh_broker, topic, streams)
    await s.send([b"m"], 0, 0)
    assert (await s.send([b"m"], 0, 0)).first_offset == 1


async def test_stored_tags_do_not_reach_readers(fresh_broker: BrokerProcess, topic: str) -> None:
    """The tag on a batch's first record is invisible to consumers: the Ister client's and Danube's."""
    dc = await client(fresh_broker.url)
    async with Client(fresh_broker.url) as c:
        p = await c.producer(topic, "tagged")
        danube_sub, queue = await consumer(dc, topic, "d", "danube")
        sub = await c.consumer(topic, "s")
        offsets = await p.send_batch([b"one", b"two"])
        got = await sub.receive_batch(2, 10)
        assert [m.payload for m in got] == [b"one", b"two"]
        assert offsets == [0, 1]
        seen = await take(queue, 2, ack=danube_sub)
        assert [m.payload for m in seen] == [b"one", b"two"]
        assert [m.producer_name for m in seen] == ["tagged", "tagged"]
    raw = [r async for r in _raw_records(fresh_broker.url, topic)]
    assert msgspec.msgpack.decode(raw[0])[8][1:] == [0, 2]  # [key, first sequence, count]
    assert len(msgspec.msgpack.decode(raw[1])) == 8


async def _raw_records(url: str, topic: str) -> AsyncIterator[bytes]:
    async with Client(url) as c:
        async for batch in c.read(topic, 0, (await c.offsets(topic)).next):
            for _, r in batch:
                yield r


async def test_after_a_restart_only_producers_within_the_window_are_remembered(
    fresh_broker: BrokerProcess, topic: str, streams: list[Stream]
) -> None:
    """The table is rebuilt from the records published within `idempotence.window_seconds` (an hour): a
    producer idle for longer is forgotten, and its retry is stored again (the documented bound)."""
    s = await _stream(fresh_broker, topic, streams)
    two_hours = 2 * 3_600_000
    assert (await s.send([b"old"], 11, 0, age_ms=two_hours)).first_offset == 0
    assert (await s.send([b"new"], 12, 0)).first_offset == 1
    fresh_broker.kill9()
    fresh_broker.start()
    again = await _stream(fresh_broker, topic, streams)
    assert (await again.send([b"new"], 12, 0)).first_offset == 1  # remembered
    assert (await again.send([b"old"], 11, 0, age_ms=two_hours)).first_offset == 2  # forgotten


async def test_a_rejected_batch_gives_its_sequences_to_the_next_ones(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    """The Ister client: a batch the broker refuses (over max_message_size) stores nothing, and the batches
    sent after it take its sequences, so the broker sees no gap; a retry of a later one is still answered."""
    async with Client(fresh_broker.url) as c:
        p = await c.producer(topic, "rejects", max_batch_bytes=32 * 2**20)
        assert await p.send(b"first") == 0
        with pytest.raises(errors.InvalidArgument, match="max_message_size"):
            await p.send(b"x" * (11 * 2**20))  # the broker's 10 MiB policy
        assert await p.send_batch([b"second", b"third"]) == [1, 2]
        assert await p.send(b"fourth") == 3
    assert broker_metric(fresh_broker.metrics_url, "ister_publish_sequence_refusals_total") == 0
    stored = await _stored(fresh_broker.url, topic)
    assert [p for _, p in stored] == [b"first", b"second", b"third", b"fourth"]
    tags = [
        msgspec.msgpack.decode(r)[8][1:]
        for r in [x async for x in _raw_records(fresh_broker.url, topic)]
        if len(msgspec.msgpack.decode(r)) == 9
    ]
    assert tags == [[0, 1], [1, 2], [3, 1]]  # [first sequence, count]: no gap after the rejected batch


async def test_a_fixed_key_makes_a_repeat_by_another_producer_a_retry(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    """The Spark sink's mechanism: a second producer object with the same `producer_key` sending the same
    batches (`send_whole`) is answered with the first one's offsets and stores nothing; a repeat cut
    otherwise is refused and that producer fails every later send instead of going on under a new key."""
    key = 0x5EED_0001
    batches = [[(f"m{i}".encode(), {"n": str(i)}, None) for i in range(j, j + 3)] for j in (0, 3, 6)]
    async with Client(fresh_broker.url) as c:
        first = await c.producer(topic, "first", producer_key=key)
        assert [await first.send_whole(b) for b in batches[:2]] == [0, 3]  # a task killed after two
        repeat = await c.producer(topic, "repeat", producer_key=key)
        assert [await repeat.send_whole(b) for b in batches] == [0, 3, 6]  # its re-run: the third is new
        assert first.batch_limits()[0] >= 3
        cut_otherwise = await c.producer(topic, "cut", producer_key=key)
        with pytest.raises(errors.DuplicateSequence):  # 0..1: inside what is stored, not a batch of it
            await cut_otherwise.send_whole(batches[0][:2])
        with pytest.raises(errors.OutOfOrderSequence, match="overlapping"):  # 2..9: part stored
            await cut_otherwise.send_whole([*batches[0][2:], *batches[1], *batches[2], (b"m9", None, None)])
        with pytest.raises(errors.IsterError):
            await cut_otherwise.send_whole([(b"later", None, None)])  # stopped: not sent under a new key
        with pytest.raises(errors.InvalidArgument, match="producer_key"):
            await c.producer(topic, "zero", producer_key=0)
    assert [p for _, p in await _stored(fresh_broker.url, topic)] == [f"m{i}".encode() for i in range(9)]


async def test_keys_past_max_producers_are_forgotten_and_counted(tmp_path: Path, topic: str) -> None:
    """The LRU bound: with `max_producers: 1` a second key evicts the first, the metric counts it, and the
    first key's retry is stored again (the documented cost of the bound)."""
    config = tmp_path / "ister.yml"
    config.write_text("idempotence:\n  max_producers: 1\n")
    broker = BrokerProcess(tmp_path / "data", "--config-file", str(config))
    broker.start()
    opened: list[Stream] = []
    try:
        s = await _stream(broker, topic, opened)
        assert (await s.send([b"a"], 21, 0)).first_offset == 0
        assert (await s.send([b"b"], 22, 0)).first_offset == 1
        assert broker_metric(broker.metrics_url, "ister_idempotence_evicted_producers_total") == 1
        assert (await s.send([b"b"], 22, 0)).first_offset == 1  # remembered
        assert (await s.send([b"a"], 21, 0)).first_offset == 2  # forgotten: stored again
    finally:
        for st in opened:
            await st.close()
        broker.stop()


async def test_a_publish_timed_out_on_a_slow_disk_is_stored_once_when_retried(
    tmp_path: Path, topic: str
) -> None:
    """The WAL took the batch's offsets, then its fsync outlasted the publish deadline (30 s): the broker
    answers a timeout, yet the WAL still writes the records. The retry must wait for them and get their
    offsets; it used to be taken for new (the table rolled the key back) and stored a second time."""
    library = build_library(tmp_path)
    if library is None:
        pytest.skip("no C compiler (gcc) to build the disk-fault library")
    broker = BrokerProcess(tmp_path / "data")
    disk = DiskFault(library, tmp_path / "disk.ctl", broker.data_dir)
    broker.env = {**broker.env, **disk.env()}
    broker.start()
    opened: list[Stream] = []
    try:
        s = await _stream(broker, topic, opened)
        assert (await s.send([b"a"], 31, 0)).first_offset == 0
        # The deadline is the fault: waited for in real time. The library reads its command every 50 ms.
        disk.slow(int(PUBLISH_TIMEOUT_SECONDS * 1000) + 3_000)
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.send([b"b"], 31, 1, wait=PUBLISH_TIMEOUT_SECONDS + 20)
        assert "did not make the message durable" in (err.value.details() or "")
        disk.heal()
        retry = await _stream(broker, topic, opened)
        assert (await retry.send([b"b"], 31, 1)).first_offset == 1  # the first copy's offset
        assert (await retry.send([b"c"], 31, 2)).first_offset == 2
        assert [p for _, p in await _stored(broker.url, topic)] == [b"a", b"b", b"c"]
    finally:
        for st in opened:
            await st.close()
        broker.stop()
