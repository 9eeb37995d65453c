"""Resetting a subscription's cursor (issue 37, item 3) against real standalone broker processes: by offset,
earliest, latest and publish time (in durable objects and in WAL segments), while consumers are attached
(they are moved and receive from the new position; acks of the old position do not move the new cursor),
partitioned topics, the client's `Consumer.seek`, and bad input that changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client
from ister.storage.objects.segment import parse_object_name
from tests.integration.cursor_support import admin_fails, admin_json, publish_at
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = pytest.mark.integration

T0 = 1_780_000_000_000  # 2026-05-28: the first record's publish time; record i is published at T0 + 10 i
OBJECTS_ENV = {  # closed segments exported at once, local WAL files deleted once exported
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.3",
    "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_BYTES": "0",
    "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_SECONDS": "0",
}
WAL_ENV = {  # no durable tier; small WAL segments (1,000 to 2,000 records: sparse-index entries inside)
    "ISTER_STORAGE__DURABLE__URL": "none",
    "ISTER_WAL__SEGMENT_MAX_BYTES": "65536",
}


@pytest.fixture(scope="module")
def objects_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("reset-obj") / "data", env=OBJECTS_ENV)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def wal_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("reset-wal") / "data", env=WAL_ENV)
    process.start()
    yield process
    process.stop()


def exported_through(data_dir: Path, topic: str) -> int:
    ns, name = topic.strip("/").split("/")
    ends = [parse_object_name(p.name) for p in (data_dir / "objects" / ns / name).glob("data-*.dnb1")]
    return max((r[1] for r in ends if r is not None), default=-1)


def wal_segments(data_dir: Path, topic: str) -> int:
    ns, name = topic.strip("/").split("/")
    return len(list((data_dir / "wal" / ns / name).glob("*.wal")))


async def reset_time(broker: BrokerProcess, topic: str, sub: str, t_ms: int) -> int:
    got = await admin_json(broker.admin_addr, "reset-cursor", topic, "-s", sub, "--time", str(t_ms))
    assert len(got["positions"]) == 1
    return int(got["positions"][0]["next"])


LOOKUPS = [  # (time, the offset it must land on) for records 0..3999 at T0 + 10 i
    (T0 - 5_000, 0),
    (T0, 0),
    (T0 + 1, 1),
    (T0 + 10 * 999 + 1, 1000),  # the first record of a sparse-index interval
    (T0 + 10 * 1000, 1000),
    (T0 + 10 * 1234 + 3, 1235),
    (T0 + 10 * 2000 - 5, 2000),
    (T0 + 10 * 2999, 2999),
    (T0 + 10 * 2999 + 1, 3000),
    (T0 + 10 * 3500, 3500),
    (T0 + 10 * 3999, 3999),
    (T0 + 10 * 3999 + 1, 4000),  # newer than everything: the head
]


async def test_reset_by_time_finds_the_first_record_at_or_after_it_in_objects(
    objects_broker: BrokerProcess, topic: str
) -> None:
    await publish_at(objects_broker.url, topic, [T0 + 10 * i for i in range(3000)])
    await until(lambda: exported_through(objects_broker.data_dir, topic) == 2999, "offsets 0..2999 exported")
    await publish_at(objects_broker.url, topic, [T0 + 10 * i for i in range(3000, 4000)], first_seq=10)
    async with Client(objects_broker.url) as client:
        await client.seek(topic, "by-time", "latest")  # creates the subscription
    for t_ms, expected in LOOKUPS:
        assert await reset_time(objects_broker, topic, "by-time", t_ms) == expected, t_ms


async def test_reset_by_time_finds_the_record_across_wal_segments(
    wal_broker: BrokerProcess, topic: str
) -> None:
    await publish_at(wal_broker.url, topic, [T0 + 10 * i for i in range(4000)], batch=250)
    assert wal_segments(wal_broker.data_dir, topic) >= 2
    async with Client(wal_broker.url) as client:
        await client.seek(topic, "by-time", "latest")
    for t_ms, expected in LOOKUPS:
        assert await reset_time(wal_broker, topic, "by-time", t_ms) == expected, t_ms
    iso = datetime.fromtimestamp((T0 + 10 * 42) / 1000, tz=UTC).isoformat().replace("+00:00", "Z")
    got = await admin_json(wal_broker.admin_addr, "reset-cursor", topic, "-s", "by-time", "--time", iso)
    assert got["positions"][0]["next"] == 42


async def test_reset_moves_attached_consumers_and_old_acks_do_not_move_the_new_cursor(
    wal_broker: BrokerProcess, topic: str
) -> None:
    async with Client(wal_broker.url) as client:
        producer = await client.producer(topic, "p")
        consumer = await client.consumer(topic, "live", name="c1", window=100)
        await producer.send_batch([b"m%d" % i for i in range(30)])
        async with asyncio.timeout(15):
            first = [await consumer.receive() for _ in range(30)]
        assert [m.offset for m in first] == list(range(30))
        for m in first[:20]:
            await m.ack()  # 0..19 acked; 20..29 in flight when the cursor moves

        got = await admin_json(wal_broker.admin_addr, "reset-cursor", topic, "-s", "live", "--to", "5")
        assert got["positions"][0] == {
            "topic": topic,
            "next": 5,
            "head": 30,
            "backlog": 25,
            "consumers": 1,
            "epoch": got["positions"][0]["epoch"],
        }
        # The consumer reconnects by itself and receives from offset 5 again.
        async with asyncio.timeout(15):
            again = await consumer.receive()
            while again.offset != 5:  # messages of the old stream are dropped by the client, never acked
                again = await consumer.receive()
        assert again.redelivered and again.payload == b"m5"
        for m in first[20:]:
            assert m.stale
            await m.ack()  # delivered before the reset: changes nothing
        await consumer.close()

        # Nothing from offset 5 on was acknowledged since the reset: a new consumer starts at 5.
        consumer = await client.consumer(topic, "live", name="c1", window=100)
        async with asyncio.timeout(15):
            resumed = await consumer.receive()
        assert resumed.offset == 5
        await consumer.close()
        await producer.close()


async def test_consumer_seek_by_offset_and_datetime(wal_broker: BrokerProcess, topic: str) -> None:
    await publish_at(wal_broker.url, topic, [T0 + 10 * i for i in range(50)])
    async with Client(wal_broker.url) as client:
        consumer = await client.consumer(topic, "seeker", initial_position="earliest")
        async with asyncio.timeout(15):
            assert (await consumer.receive()).offset == 0
        moves = await consumer.seek(datetime.fromtimestamp((T0 + 10 * 37) / 1000, tz=UTC))
        assert [m.next for m in moves] == [37]
        async with asyncio.timeout(15):
            got = await consumer.receive()
        assert got.offset == 37 and got.payload == b"t%d" % (T0 + 370)
        await got.ack()
        await consumer.seek(12)
        async with asyncio.timeout(15):
            assert (await consumer.receive()).offset == 12
        with pytest.raises(errors.InvalidArgument, match="past the head"):
            await consumer.seek(51)
        await consumer.close()


async def test_partitioned_reset_moves_every_partition_and_bad_input_changes_nothing(
    wal_broker: BrokerProcess, topic: str
) -> None:
    addr = wal_broker.admin_addr
    code = await admin_json(addr, "create", topic, "--partitions", "3")
    assert code["partitions"] == 3
    async with Client(wal_broker.url) as client:
        producer = await client.producer(topic, "pp", partitions=3)
        for i in range(30):
            await producer.send(b"x%d" % i, key=f"k{i}")
        await producer.close()
        heads = [(await client.offsets(f"{topic}-part-{i}")).next for i in range(3)]
        assert sum(heads) == 30 and min(heads) >= 1
        # One consumer name for both readers: the second takes the Exclusive subscription over at once
        # (another name would wait out the first's 10 s grace, however long the commands below take).
        consumer = await client.consumer(topic, "psub", name="reader", initial_position="earliest")
        async with asyncio.timeout(15):
            for _ in range(30):
                (await consumer.receive()).ack_nowait()
        await consumer.close()

    got = await admin_json(addr, "reset-cursor", topic, "-s", "psub", "--to", "earliest")
    assert [(p["topic"], p["next"], p["head"]) for p in got["positions"]] == [
        (f"{topic}-part-{i}", 0, heads[i]) for i in range(3)
    ]
    # An offset past one partition's head: refused before any partition moves.
    too_far = str(min(heads) + 1)
    err = await admin_fails(addr, "reset-cursor", topic, "-s", "psub", "--to", too_far)
    assert "past the head" in err and "INVALID_ARGUMENT" in err
    dry = await admin_json(addr, "reset-cursor", topic, "-s", "psub", "--to", "earliest", "--dry-run")
    assert [p["next"] for p in dry["positions"]] == [0, 0, 0]  # still where the first reset left them
    assert "NOT_FOUND" in await admin_fails(addr, "reset-cursor", topic, "-s", "nobody", "--to", "latest")
    assert "NOT_FOUND" in await admin_fails(addr, "reset-cursor", topic + "-nope", "-s", "psub", "--to", "0")
    await admin_fails(addr, "reset-cursor", topic, "-s", "psub", code=2)  # neither --to nor --time
    await admin_fails(addr, "reset-cursor", topic, "-s", "psub", "--to", "0", "--time", "-1m", code=2)
    await admin_fails(addr, "reset-cursor", topic, "-s", "psub", "--to", "soon", code=2)
    await admin_fails(addr, "reset-cursor", topic, "-s", "psub", "--time", "yesterday", code=2)
    async with Client(wal_broker.url) as client:
        consumer = await client.consumer(topic, "psub", name="reader")
        async with asyncio.timeout(15):
            offsets = sorted([(m.topic, m.offset) for m in [await consumer.receive() for _ in range(30)]])
        assert offsets == sorted((f"{topic}-part-{i}", o) for i in range(3) for o in range(heads[i]))
        await consumer.close()


async def test_a_non_reliable_topic_has_no_cursor_to_reset(wal_broker: BrokerProcess, topic: str) -> None:
    await admin_json(wal_broker.admin_addr, "create", topic, "--non-reliable")
    err = await admin_fails(wal_broker.admin_addr, "reset-cursor", topic, "-s", "s", "--to", "earliest")
    assert "FAILED_PRECONDITION" in err and "Reliable topics only" in err
