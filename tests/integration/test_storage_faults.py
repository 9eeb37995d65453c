"""Storage faults under a real broker process (issue 13, items 6-8).

A damaged last WAL segment never makes the broker hand out acknowledged offsets again; a damaged frame in a
closed segment is served from the durable tier or skipped (a Read that starts in it answers DATA_LOSS) while
everything else keeps flowing; a full disk answers RESOURCE_EXHAUSTED and recovers by itself when space
returns. Each is logged once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ister import errors
from ister.client import Client, Consumer
from ister.core.frames import HEADER_SIZE, scan_frames
from ister.core.record import decode_message
from tests.integration import harness
from tests.integration.harness import BrokerProcess, broker_metric
from tests.support import small_tmpfs, until

pytestmark = pytest.mark.integration
# The broker answers DATA_LOSS; ister.client raises errors.DataLoss for it.
DATA_LOSS = errors.DataLoss

NO_TIER = {"ISTER_STORAGE__DURABLE__URL": "none", "ISTER_WAL__SEGMENT_MAX_BYTES": "8192"}
FAST_TIER = {
    "ISTER_WAL__SEGMENT_MAX_BYTES": "8192",
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__LOCAL_RETENTION_SECONDS": "3600",  # keep the WAL files: we damage one
}


def wal_files(broker: BrokerProcess, topic: str) -> list[Path]:
    ns, name = topic.strip("/").split("/")
    return sorted((broker.data_dir / "wal" / ns / name).glob("*.wal"))


def frames(path: Path) -> list[tuple[int, int]]:
    """(offset, byte position) of each frame of a WAL file."""
    return [(o, pos) for o, _, pos in scan_frames(path.read_bytes(), expect_offset=int(path.stem)).frames]


def log_lines(broker: BrokerProcess, text: str) -> list[str]:
    return [line for line in broker.log_path.read_text(errors="replace").splitlines() if text in line]


async def subscribe_at_start(client: Client, topic: str) -> None:
    """Create the topic and the subscription "history" at offset 0 (no consumer stays attached)."""
    producer = await client.producer(topic, "creator")
    consumer = await client.consumer(topic, "history", name="h")
    await consumer.close()
    await producer.close()


async def publish(client: Client, topic: str, n: int, tag: str = "m") -> list[int]:
    producer = await client.producer(topic, f"p-{tag}")
    offsets: list[int] = []
    for at in range(0, n, 100):
        offsets += await producer.send_batch([f"{tag}{i}".encode() for i in range(at, min(n, at + 100))])
    await producer.close()
    return offsets


async def receive(consumer: Consumer, until_offset: int, within: float = 30.0) -> list[tuple[int, bytes]]:
    """Receive and ack until a message with offset >= until_offset - 1 arrived; (offset, payload) in order."""
    got: list[tuple[int, bytes]] = []
    async with asyncio.timeout(within):
        while not got or got[-1][0] < until_offset - 1:
            batch = await consumer.receive_batch(5000, 1.0)
            await consumer.ack_batch(batch)
            got += [(m.offset, m.payload) for m in batch]
    return got


async def test_damaged_last_segment_never_reuses_acknowledged_offsets(tmp_path: Path, topic: str) -> None:
    broker = BrokerProcess(tmp_path / "data", env=NO_TIER)
    broker.start()
    try:
        async with Client(broker.url, connect_timeout=5) as client:
            await subscribe_at_start(client, topic)
            assert await publish(client, topic, 2000) == list(range(2000))
        assert broker.terminate() == 0  # a clean stop
        last = wal_files(broker, topic)[-1]
        lost_from, pos = frames(last)[len(frames(last)) // 2]
        os.truncate(last, pos + HEADER_SIZE + 5)  # a lost write: the last segment ends mid-frame
        broker.start()
        async with Client(broker.url, connect_timeout=5) as client:
            after = await publish(client, topic, 50, tag="after")
            assert after == list(range(2000, 2050))  # never lost_from.. again
            consumer = await client.consumer(topic, "history", name="h")
            got = await receive(consumer, 2050)
            assert [o for o, _ in got] == list(range(lost_from)) + list(range(2000, 2050))
            assert [p for _, p in got] == [b"m%d" % i for i in range(lost_from)] + [
                b"after%d" % i for i in range(50)
            ]
            with pytest.raises(DATA_LOSS, match=f"offsets {lost_from}..1999 .* lost or damaged"):
                async with asyncio.timeout(30):
                    _ = [b async for b in client.read(topic, lost_from, 2050)]
            read = [r async for b in client.read(topic, 0, 2050) for r in b]
            assert [o for o, _ in read] == [o for o, _ in got]
        assert len(log_lines(broker, f"offsets {lost_from}..1999 are lost")) == 1
    finally:
        broker.stop()


async def test_damaged_closed_segment_is_read_from_the_durable_tier(tmp_path: Path, topic: str) -> None:
    broker = BrokerProcess(tmp_path / "data", env=FAST_TIER)
    broker.start()
    try:
        async with Client(broker.url, connect_timeout=5) as client:
            await subscribe_at_start(client, topic)
            await publish(client, topic, 3000)
            ns, name = topic.strip("/").split("/")
            objects = broker.data_dir / "objects" / ns / name
            closed = wal_files(broker, topic)[:-1]
            assert len(closed) >= 5
            await until(
                lambda: len(list(objects.glob("*.dnb1"))) >= len(closed),
                "closed segments exported",
                within=30,
            )
        assert broker.terminate() == 0
        victim = wal_files(broker, topic)[len(closed) // 2]
        bad, pos = frames(victim)[7]
        data = bytearray(victim.read_bytes())
        data[pos + HEADER_SIZE + 2] ^= 0x20  # a flipped payload byte
        victim.write_bytes(bytes(data))
        broker.start()
        async with Client(broker.url, connect_timeout=5) as client:
            consumer = await client.consumer(topic, "history", name="h")
            got = await receive(consumer, 3000)
            assert got == [(i, b"m%d" % i) for i in range(3000)]  # the damaged one came from the tier
            read = [r async for b in client.read(topic, bad, bad + 1) for r in b]
            assert [(o, decode_message(r).payload) for o, r in read] == [(bad, b"m%d" % bad)]
        assert len(log_lines(broker, f"offsets {bad}..{bad} are damaged")) == 1
        assert len(log_lines(broker, "reading them from the durable tier")) == 1
    finally:
        broker.stop()


async def test_flipped_header_without_a_copy_loads_skips_and_reports(tmp_path: Path, topic: str) -> None:
    broker = BrokerProcess(tmp_path / "data", env=NO_TIER)
    broker.start()
    try:
        async with Client(broker.url, connect_timeout=5) as client:
            await subscribe_at_start(client, topic)
            await publish(client, topic, 3000)
        assert broker.terminate() == 0
        files = wal_files(broker, topic)
        victim, after_victim = files[len(files) // 2], files[len(files) // 2 + 1]
        bad, pos = frames(victim)[4]
        data = bytearray(victim.read_bytes())
        data[pos + 3] ^= 0x01  # the offset field of a frame header: the file can be trusted only before it
        victim.write_bytes(bytes(data))
        end = int(after_victim.stem)
        broker.start()
        async with Client(broker.url, connect_timeout=5) as client:
            assert await publish(client, topic, 10, tag="after") == list(range(3000, 3010))  # topic loads
            consumer = await client.consumer(topic, "history", name="h")
            got = await receive(consumer, 3010)
            assert [o for o, _ in got] == [i for i in range(3010) if not bad <= i < end]
            with pytest.raises(DATA_LOSS, match="lost or damaged"):
                async with asyncio.timeout(30):
                    _ = [b async for b in client.read(topic, bad + 1, bad + 2)]
        assert len(log_lines(broker, victim.name)) == 1  # logged once, at load
    finally:
        broker.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs for the broker's data directory."""
    with small_tmpfs(tmp_path, "24m") as mount:
        yield mount


async def test_full_disk_answers_resource_exhausted_and_recovers_without_restart(
    small_disk: Path, topic: str
) -> None:
    # No headroom: the WAL writer itself meets ENOSPC (a disk filled by another program between two
    # measurements); refusing before that is test_disk_full.py.
    env = {"ISTER_STORAGE__DURABLE__URL": "none", "ISTER_STORAGE__MIN_FREE_BYTES": "0"}
    broker = BrokerProcess(small_disk / "data", env=env)
    broker.log_path = small_disk.parent / "broker.log"  # the log must not fill the disk under test
    broker.start()
    try:
        async with Client(broker.url, connect_timeout=5, retry_timeout=1.0) as client:
            producer = await client.producer(topic, "filler")
            other = await client.producer(topic, "other")
            dclient = await harness.client(broker.url)
            dproducer = await harness.producer(dclient, topic, "danube", reliable=True)
            acked = [(await producer.send(b"first"), b"first")]
            free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
            ballast = small_disk / "ballast"
            ballast.write_bytes(b"\0" * max(0, free - 2 * 1024 * 1024))
            big = os.urandom(128 * 1024)
            with pytest.raises(errors.ResourceExhausted) as info:
                for i in range(100):
                    acked.append((await producer.send(big + b"%d" % i), big + b"%d" % i))
            assert info.value.retriable and "disk full" in str(info.value)
            with pytest.raises(errors.ResourceExhausted):  # every producer of the topic
                await other.send(big + b"refused")
            with pytest.raises(grpc.aio.AioRpcError) as rpc:  # Danube's SendMessage (one attempt)
                await dproducer._producers[0].send(big + b"refused")
            assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "disk full" in (rpc.value.details() or "")
            counted = broker_metric(broker.metrics_url, "ister_publishes_refused_total", reason="disk_full")
            assert counted is not None and counted >= 2
            ballast.unlink()  # space returns: no restart
            acked.append((await producer.send(b"after-1"), b"after-1"))
            acked.append((await other.send(b"after-2"), b"after-2"))
            await dproducer.send(b"after-danube")
            acked.append((len(acked), b"after-danube"))
            await dproducer.close()
            new = await client.producer(topic, "new")
            acked.append((await new.send(b"after-3"), b"after-3"))
            assert [o for o, _ in acked] == list(range(len(acked)))  # dense: refused sends used no offset
            read = [r async for b in client.read(topic, 0, len(acked)) for r in b]
            assert [(o, decode_message(r).payload) for o, r in read] == acked
        assert len(log_lines(broker, "appends are refused")) == 1  # once per episode
        assert len(log_lines(broker, "disk space is available again")) == 1
    finally:
        broker.stop()
