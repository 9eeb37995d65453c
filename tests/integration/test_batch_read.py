"""Offsets and Read of the batch API against a real standalone broker process whose durable tier exports
quickly (idle WAL segments rotate after 0.3 s, exports every 0.2 s, no local retention): history is read
back from `.dnb1` objects, the tail from the WAL, without any subscription."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client, TopicOffsets
from ister.client.blocking import BlockingClient
from ister.core.record import decode_message
from ister.storage.objects.segment import parse_object_name
from ister.storage.wal.names import parse_segment_name
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = pytest.mark.integration

FAST_EXPORT_ENV = {
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.3",
    "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_BYTES": "0",
    "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_SECONDS": "0",
}

Sent = tuple[int, bytes, dict[str, str], str | None]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("reads") / "data", env=FAST_EXPORT_ENV)
    process.start()
    yield process
    process.stop()


def exported_through(data_dir: Path, topic: str) -> int:
    """The highest offset in the topic's objects (-1 when none)."""
    ns, name = topic.strip("/").split("/")
    ends = [parse_object_name(p.name) for p in (data_dir / "objects" / ns / name).glob("data-*.dnb1")]
    return max((r[1] for r in ends if r is not None), default=-1)


def wal_first_offset(data_dir: Path, topic: str) -> int:
    ns, name = topic.strip("/").split("/")
    firsts = [parse_segment_name(p.name) for p in (data_dir / "wal" / ns / name).iterdir()]
    return min(f for f in firsts if f is not None)


async def publish(client: Client, topic: str, first: int, n: int) -> list[Sent]:
    producer = await client.producer(topic, "reads-producer")
    sent: list[Sent] = []
    for at in range(first, first + n, 10):  # batches of 10 sharing attributes and key
        attrs, key = {"batch": str(at), "x": "y"}, (f"key-{at}" if at % 20 else None)
        payloads = [b"p%06d" % i for i in range(at, min(at + 10, first + n))]
        offsets = await producer.send_batch(payloads, attributes=attrs, key=key)
        sent += [(o, p, attrs, key) for o, p in zip(offsets, payloads, strict=True)]
    await producer.close()
    return sent


def decoded(batches: list[list[tuple[int, bytes]]]) -> list[Sent]:
    out: list[Sent] = []
    for batch in batches:
        for offset, raw in batch:
            m = decode_message(raw)
            out.append((offset, m.payload, m.attributes, m.routing_key))
    return out


async def read(client: Client, topic: str, start: int, end: int, **kw: int) -> list[list[tuple[int, bytes]]]:
    async with asyncio.timeout(30):  # a read never waits for new messages
        return [b async for b in client.read(topic, start, end, **kw)]


async def test_offsets_of_an_empty_topic(broker: BrokerProcess, topic: str) -> None:
    async with Client(broker.url) as client:
        await client.producer(topic, "empty")  # creates the reliable topic
        span = await client.offsets(topic)
        url = (broker.data_dir / "objects").resolve().as_uri()
        assert span == TopicOffsets(topic, 0, 0, url, topic.strip("/"))
        assert await read(client, topic, 0, 1000) == []


async def test_read_history_from_objects_and_tail_from_the_wal(broker: BrokerProcess, topic: str) -> None:
    async with Client(broker.url) as client:
        sent = await publish(client, topic, 0, 300)
        # The broker exports the idle segment and deletes the local file: 0..299 only exist as objects.
        await until(lambda: exported_through(broker.data_dir, topic) == 299, "0..299 exported", within=30)
        await until(
            lambda: wal_first_offset(broker.data_dir, topic) == 300, "local WAL files dropped", within=30
        )
        sent += await publish(client, topic, 300, 50)
        span = await client.offsets(topic)
        assert (span.earliest, span.next) == (0, 350)
        assert span.durable_url is not None and span.object_prefix == topic.strip("/")
        batches = await read(client, topic, 0, span.next, max_records=64)
        assert all(1 <= len(b) <= 64 for b in batches)
        assert decoded(batches) == sent
        # start inside, end exclusive, end past the head
        assert decoded(await read(client, topic, 295, 305)) == sent[295:305]
        assert decoded(await read(client, topic, 123, 2**63)) == sent[123:]
        assert await read(client, topic, 350, 400) == []


async def test_partition_topics_are_read_one_by_one(broker: BrokerProcess, topic: str) -> None:
    async with Client(broker.url) as client:
        producer = await client.producer(topic, partitions=2, max_batch_messages=10)
        await producer.send_batch([b"%d" % i for i in range(100)])
        got: list[bytes] = []
        for part in producer.partitions:
            span = await client.offsets(part)
            assert span.earliest == 0 and span.next > 0
            got += [m[1] for m in decoded(await read(client, part, 0, span.next))]
        assert sorted(got) == sorted(b"%d" % i for i in range(100))
        with pytest.raises(errors.NotFound):
            await client.offsets(topic)  # the partitioned topic itself is not a concrete topic


async def test_errors(broker: BrokerProcess, topic: str) -> None:
    async with Client(broker.url) as client:
        producer = await client.producer(topic, "volatile", reliable=False)
        await producer.send(b"x")
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            await client.offsets(topic)
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            await read(client, topic, 0, 10)
        with pytest.raises(errors.NotFound):
            await client.offsets(topic + "_missing")
        with pytest.raises(errors.NotFound):
            await read(client, topic + "_missing", 0, 10)
        with pytest.raises(errors.InvalidArgument):
            await read(client, topic, 10, 9)
        with pytest.raises(errors.InvalidArgument):
            await read(client, topic, 0, 2**63 + 1)


def test_blocking_offsets_and_read(broker: BrokerProcess, topic: str) -> None:
    with BlockingClient(broker.url) as client:
        with client.producer(topic, "blocking") as producer:
            offsets = producer.send_batch([b"b%d" % i for i in range(25)], attributes={"a": "1"}, key="k")
        span = client.offsets(topic)
        assert (span.topic, span.earliest, span.next) == (topic, 0, 25)
        batches = list(client.read(topic, 3, 2**63, max_records=10))
        assert [len(b) for b in batches] == [10, 10, 2]
        records = [(o, decode_message(r)) for b in batches for o, r in b]
        assert [o for o, _ in records] == offsets[3:]
        assert [m.payload for _, m in records] == [b"b%d" % i for i in range(3, 25)]
        assert all(m.attributes == {"a": "1"} and m.routing_key == "k" for _, m in records)
        with client.producer(topic + "_nr", "nr", reliable=False):
            pass
        with pytest.raises(errors.FailedPrecondition, match="not reliable"):
            client.offsets(topic + "_nr")
        with pytest.raises(errors.NotFound):
            list(client.read(topic + "_missing", 0, 10))
