"""Disk full is an answer (issue 37, item 7): a real broker whose data directory is on a small tmpfs refuses
publishes with RESOURCE_EXHAUSTED "data disk has less than X free" before the disk is full, on the Ister
batch API and on Danube's SendMessage, keeps serving reads and consumes, and takes publishes again once an
operator frees space. (A disk that fills anyway, under the WAL writer: test_storage_faults.py.)"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ister import errors
from ister.client import Client
from ister.core.record import decode_message
from ister.limits import MiB
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.integration import harness
from tests.integration.harness import BrokerProcess, broker_metric
from tests.support import small_tmpfs, until

pytestmark = pytest.mark.integration

HEADROOM = 16 * MiB
ENV = {
    "ISTER_STORAGE__DURABLE__URL": "none",  # nothing but the WAL and the metadata on the disk under test
    "ISTER_STORAGE__MIN_FREE_BYTES": str(HEADROOM),
    "ISTER_STORAGE__MIN_FREE_RATIO": "1",  # the bytes alone
    "ISTER_WAL__SEGMENT_MAX_BYTES": str(4 * MiB),
}
REFUSED = "data disk has less than 16.0 MiB free"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs for the broker's data directory (unmounted afterwards; skipped without root)."""
    with small_tmpfs(tmp_path, "64m") as mount:
        yield mount


@pytest.fixture
def broker(disk: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(disk / "data", env=ENV)
    b.log_path = disk.parent / "broker.log"  # the log must not fill the disk under test
    b.start()
    try:
        yield b
    finally:
        b.stop()


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave: int) -> Path:
    """An operator's (or another program's) file that leaves about `leave` bytes free."""
    filler = disk / "filler"
    chunk = b"\0" * MiB
    with open(filler, "wb", buffering=0) as f:
        todo = free(disk) - leave
        while todo > 0:
            try:
                f.write(chunk[: min(todo, MiB)])
            except OSError as exc:  # the broker wrote meanwhile: the disk is as full as asked, or fuller
                if exc.errno != errno.ENOSPC:
                    raise
                break
            todo -= MiB
    return filler


def refusing(broker: BrokerProcess) -> bool:
    return broker_metric(broker.metrics_url, "ister_data_disk_refusing") == 1


def refused(broker: BrokerProcess) -> float:
    return broker_metric(broker.metrics_url, "ister_publishes_refused_total", reason="disk_full") or 0.0


def log_lines(broker: BrokerProcess, text: str) -> list[str]:
    return [line for line in broker.log_path.read_text(errors="replace").splitlines() if text in line]


async def stored(client: Client, topic: str, end: int) -> list[tuple[int, bytes]]:
    return [(o, decode_message(r).payload) async for batch in client.read(topic, 0, end) for o, r in batch]


async def test_both_apis_are_refused_below_the_headroom_reads_go_on_and_publishes_return(
    broker: BrokerProcess, disk: Path, topic: str
) -> None:
    dclient = await harness.client(broker.url)
    async with Client(broker.url, connect_timeout=5, retry_timeout=1.0) as client:
        producer = await client.producer(topic, "ister-p")
        iconsumer = await client.consumer(topic, "isub", name="ic")
        dproducer = await harness.producer(dclient, topic, "danube-p", reliable=True)
        dconsumer, dqueue = await harness.consumer(dclient, topic, "dc", "dsub")
        payloads = [b"before-%d" % i for i in range(100)]
        expected = list(zip(await producer.send_batch(payloads), payloads, strict=True))
        for i in range(3):
            await dproducer.send(b"danube-%d" % i)
            expected.append((len(expected), b"danube-%d" % i))
        assert [o for o, _ in expected] == list(range(103))
        assert broker_metric(broker.metrics_url, "ister_data_disk_headroom_bytes") == HEADROOM
        assert not refusing(broker)

        filler = fill(disk, leave=HEADROOM - 4 * MiB)
        await until(lambda: refusing(broker), "the broker refuses publishes below the headroom")
        gauge = broker_metric(broker.metrics_url, "ister_data_disk_free_bytes")
        assert gauge is not None and 0 < gauge < HEADROOM

        # The Ister batch API: RESOURCE_EXHAUSTED (retriable) with the reason, after the client's retries.
        with pytest.raises(errors.ResourceExhausted, match=REFUSED) as info:
            await producer.send_batch([b"refused"])
        assert info.value.retriable
        # Danube's SendMessage: the same status and message (the official client's one-shot send) ...
        with pytest.raises(grpc.aio.AioRpcError) as rpc:
            await dproducer._producers[0].send(b"refused")
        assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert REFUSED in (rpc.value.details() or "")
        # ... and its Producer.send retries RESOURCE_EXHAUSTED (back-pressure): it waits, nothing crashes.
        before = refused(broker)
        waiting = asyncio.ensure_future(dproducer.send(b"sent-while-full"))
        await until(lambda: refused(broker) >= before + 2, "the official client retrying")
        assert not waiting.done()

        # Reads and consumes go on: everything acknowledged before is there, acks are taken.
        got: list[tuple[int, bytes]] = []
        async with asyncio.timeout(30):
            while len(got) < len(expected):
                batch = await iconsumer.receive_batch(1000, 1.0)
                await iconsumer.ack_batch(batch)
                got += [(m.offset, m.payload) for m in batch]
        assert got == expected
        messages = await harness.take(dqueue, len(expected), ack=dconsumer)
        assert [(m.msg_id.topic_offset, m.payload) for m in messages] == expected
        assert await stored(client, topic, 1000) == expected

        filler.unlink()  # an operator frees space: no restart
        await until(lambda: not refusing(broker), "publishes accepted again")
        async with asyncio.timeout(30):
            await waiting  # the official client's retry lands
        expected.append((len(expected), b"sent-while-full"))
        offsets = await producer.send_batch([b"after"])
        expected.append((offsets[0], b"after"))
        assert [o for o, _ in expected] == list(range(len(expected)))  # dense: refused sends used no offset
        assert await stored(client, topic, 1000) == expected
        await iconsumer.close()
    await dproducer.close()
    await dconsumer.close()
    assert refused(broker) >= before + 2
    assert len(log_lines(broker, REFUSED)) == 1  # once per episode
    assert len(log_lines(broker, "publishes are accepted")) == 1
    assert not log_lines(broker, "Traceback")


async def test_publishing_until_refused_stops_before_the_disk_is_full(
    broker: BrokerProcess, disk: Path, topic: str
) -> None:
    """No filler: a fast publisher fills the disk itself and is refused by the headroom (not by ENOSPC),
    the budget between two measurements keeps it from going below; deleting another topic frees space."""
    junk = topic + "_junk"
    big = os.urandom(64 * 1024)
    async with Client(broker.url, connect_timeout=5, retry_timeout=1.0) as client:
        filler = await client.producer(junk, "junk")
        for _ in range(16):  # 16 MiB in another topic, for the operator to delete later
            await filler.send_batch([big] * 16)
        await filler.close()
        producer = await client.producer(topic, "fast")
        acked: list[tuple[int, bytes]] = []
        with pytest.raises(errors.ResourceExhausted, match=REFUSED):
            for i in range(1000):
                payloads = [big + b"%d-%d" % (i, j) for j in range(16)]
                offsets = await producer.send_batch(payloads)
                acked += zip(offsets, payloads, strict=True)
        assert free(disk) > HEADROOM // 2  # refused well before full
        assert 24 * MiB < len(acked) * len(big) < 48 * MiB  # the disk less the junk topic and the headroom
        assert await stored(client, topic, len(acked) + 10) == acked

        async with grpc.aio.insecure_channel(broker.admin_addr) as channel:
            await apb_grpc.TopicAdminStub(channel).DeleteTopic(apb.TopicRequest(name=junk), timeout=30)
        await until(lambda: not refusing(broker), "publishes accepted once the junk topic is gone")
        offsets = await producer.send_batch([b"after"])
        assert offsets == [len(acked)]
    assert not log_lines(broker, "disk full")  # the WAL never met ENOSPC
