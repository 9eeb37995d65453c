"""Non-reliable topics: at-most-once, nothing stored, a bounded per-consumer buffer, acks ignored."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import danube
import grpc
import pytest
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from ister.limits import NON_RELIABLE_CONSUMER_BUFFER
from tests.integration.harness import (
    BrokerProcess,
    client,
    consumer,
    nothing_within,
    producer,
    subscription_metric,
)

pytestmark = pytest.mark.integration
S = danube.SubType
DROPPED = "ister_nonreliable_dropped_total"
# HTTP/2's default stream window (BDP probing off): what the transport may hold beyond the broker's buffer.
HTTP2_WINDOW = 65_535


async def _sync(p: danube.Producer, q: asyncio.Queue, within: float = 10.0) -> list[bytes]:  # type: ignore[type-arg]
    """Publish probes until one arrives (the receive stream is attached); returns everything received."""
    deadline = time.monotonic() + within
    i = 0
    while True:
        await p.send(f"probe-{i}".encode())
        i += 1
        try:
            first = await asyncio.wait_for(q.get(), 0.1)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no probe arrived within {within} s") from None
    got = [first.payload]
    # Probes already on their way arrive in order right behind the first one.
    while True:
        try:
            got.append((await asyncio.wait_for(q.get(), 0.3)).payload)
        except TimeoutError:
            return got


def _wal_dirs(broker: BrokerProcess, topic: str) -> list[str]:
    ns, name = topic.strip("/").split("/")
    root = broker.data_dir / "wal" / ns
    return [p.name for p in root.iterdir() if p.name.startswith(name)] if root.exists() else []


async def test_message_without_attached_consumer_is_lost(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1")
    await p.send(b"lost-no-subscription")  # no subscription exists yet
    cons, q = await consumer(c, topic, "c1", "nr", S.EXCLUSIVE)
    got = await _sync(p, q)
    assert all(m.startswith(b"probe-") for m in got), got
    await cons.close()

    await p.send(b"lost-while-detached")  # the subscription exists, its only consumer is gone
    cons2, q2 = await consumer(c, topic, "c1", "nr", S.EXCLUSIVE)
    got = await _sync(p, q2)
    assert all(m.startswith(b"probe-") for m in got), got
    await p.send(b"live")
    assert (await asyncio.wait_for(q2.get(), 10)).payload == b"live"
    assert await nothing_within(q2, 0.3)
    await cons2.close()
    # Nothing is stored for a non-reliable topic.
    assert _wal_dirs(shared_broker, topic) == []
    dropped = await asyncio.to_thread(subscription_metric, shared_broker.metrics_url, DROPPED, topic, "nr")
    assert dropped is not None and dropped >= 1


async def test_nothing_stored_across_restart(fresh_broker: BrokerProcess, topic: str) -> None:
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p1")
    cons, q = await consumer(c, topic, "c1", "nr", S.EXCLUSIVE)
    await _sync(p, q)
    await cons.close()
    for i in range(5):
        await p.send(f"gone-{i}".encode())
    assert fresh_broker.terminate() == 0
    fresh_broker.start()
    c2 = await client(fresh_broker.url)
    p2 = await producer(c2, topic, "p1")
    cons2, q2 = await consumer(c2, topic, "c1", "nr", S.EXCLUSIVE)
    got = await _sync(p2, q2)
    assert all(m.startswith(b"probe-") for m in got), got
    assert _wal_dirs(fresh_broker, topic) == []
    await cons2.close()


async def test_slow_consumer_buffer_drops_and_never_blocks_producer(
    shared_broker: BrokerProcess, topic: str
) -> None:
    """A consumer that stops reading: its bounded buffer fills, the rest is dropped, sends stay fast."""
    size = 4096
    n = NON_RELIABLE_CONSUMER_BUFFER + 500
    # BDP probing off keeps the transport's own buffering at one HTTP/2 window, so the bound below is tight.
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{shared_broker.port}", options=[("grpc.http2.bdp_probe", 0)]
    ) as ch:
        prod = pb_grpc.ProducerServiceStub(ch)
        cons = pb_grpc.ConsumerServiceStub(ch)
        pid = (
            await prod.CreateProducer(pb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic))
        ).producer_id
        cid = (
            await cons.Subscribe(
                pb.ConsumerRequest(request_id=1, topic_name=topic, consumer_name="slow", subscription="slow")
            )
        ).consumer_id
        call = cons.ReceiveMessages(pb.ReceiveRequest(request_id=1, consumer_id=cid))
        first, go = asyncio.Event(), asyncio.Event()
        received = 0

        async def reader() -> None:
            nonlocal received
            async for _ in call:
                received += 1
                first.set()
                await go.wait()  # read one message, then stall like a stuck consumer

        reader_task = asyncio.create_task(reader())
        sent = 0
        worst = 0.0

        async def send(payload: bytes) -> None:
            nonlocal sent, worst
            t = time.monotonic()
            await asyncio.wait_for(
                prod.SendMessage(
                    pb.StreamMessage(
                        request_id=sent, msg_id=pb.MsgID(producer_id=pid, topic_name=topic), payload=payload
                    )
                ),
                5.0,
            )
            worst = max(worst, time.monotonic() - t)
            sent += 1

        deadline = time.monotonic() + 10
        while not first.is_set():
            assert time.monotonic() < deadline, "the receive stream never attached"
            await send(b"probe")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(first.wait(), 0.1)
        payload = b"x" * size
        t0 = time.monotonic()
        for _ in range(n):
            await send(payload)
        elapsed = time.monotonic() - t0
        assert worst < 1.0, f"a send took {worst:.2f} s: the producer was held up by the slow consumer"
        assert elapsed < 30

        go.set()  # now drain: everything the buffer (and transport) held arrives, nothing more
        url = shared_broker.metrics_url
        deadline = time.monotonic() + 15
        while True:
            dropped = await asyncio.to_thread(subscription_metric, url, DROPPED, topic, "slow") or 0.0
            if received + dropped == sent:
                break
            assert time.monotonic() < deadline, f"sent {sent}, received {received}, dropped {dropped}"
            await asyncio.sleep(0.1)
        slack = math.ceil(2 * HTTP2_WINDOW / size) + 2  # both transport ends, plus one message in hand
        assert received <= NON_RELIABLE_CONSUMER_BUFFER + slack, (received, dropped)
        assert dropped >= n - NON_RELIABLE_CONSUMER_BUFFER - slack
        # The stream is still usable after the overflow.
        assert not reader_task.done()
        before = received
        await send(b"after")
        deadline = time.monotonic() + 10
        while received == before:
            assert time.monotonic() < deadline, "the consumer got nothing after the overflow"
            await asyncio.sleep(0.05)
        call.cancel()
        reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader_task


async def test_ack_and_nack_accepted_and_ignored(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1")
    cons, q = await consumer(c, topic, "c1", "acks", S.SHARED)
    await _sync(p, q)
    await p.send(b"one")
    m = await asyncio.wait_for(q.get(), 10)
    assert m.payload == b"one"
    await cons.nack(m, 0, "no thanks")  # the official client raises on a non-OK status
    await cons.ack(m)
    assert await nothing_within(q, 1.0), "a nacked non-reliable message was redelivered"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{shared_broker.port}") as ch:
        stub = pb_grpc.ConsumerServiceStub(ch)
        for offset in (m.msg_id.topic_offset, 10**9):  # delivered, and never delivered
            ack = pb.AckRequest(
                request_id=1, msg_id=pb.MsgID(topic_name=topic, topic_offset=offset), subscription_name="acks"
            )
            await stub.Ack(ack)
            nack = pb.NackRequest(
                request_id=1,
                msg_id=pb.MsgID(topic_name=topic, topic_offset=offset),
                subscription_name="acks",
                delay_ms=0,
                reason="x",
            )
            await stub.Nack(nack)
    await p.send(b"two")
    assert (await asyncio.wait_for(q.get(), 10)).payload == b"two"
    await cons.close()
