"""Crash and restart: acknowledged messages survive kill -9, offsets continue, cursors resume."""

from __future__ import annotations

import asyncio
import contextlib

import danube
import pytest

from tests.integration.harness import BrokerProcess, client, consumer, producer, take

pytestmark = pytest.mark.integration
S = danube.SubType


async def test_kill9_keeps_every_acknowledged_message(fresh_broker: BrokerProcess, topic: str) -> None:
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    # A subscription that exists before the first message reads the topic from offset 0 after the crash.
    reader, _ = await consumer(c, topic, "r", "history", S.EXCLUSIVE)
    await reader.close()
    acked: list[bytes] = []
    enough = asyncio.Event()

    async def produce() -> None:
        i = 0
        while True:
            payload = f"m{i}".encode()
            await p.send(payload)
            acked.append(payload)
            if len(acked) >= 300:
                enough.set()
            i += 1

    task = asyncio.create_task(produce())
    await asyncio.wait_for(enough.wait(), 60)
    fresh_broker.kill9()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    fresh_broker.start()

    c2 = await client(fresh_broker.url)
    cons, q = await consumer(c2, topic, "r", "history", S.EXCLUSIVE)
    got = await take(q, len(acked), within=60, ack=cons)
    offsets = [m.msg_id.topic_offset for m in got]
    assert offsets == list(range(len(acked)))
    assert [m.payload for m in got] == acked
    # Anything written but not acknowledged before the crash may follow; new messages come after it.
    extra = []
    with contextlib.suppress(TimeoutError):
        while True:
            extra.append(await asyncio.wait_for(q.get(), 1.0))
            await cons.ack(extra[-1])
    p2 = await producer(c2, topic, "p2", reliable=True)
    await p2.send(b"after-crash")
    after = (await take(q, 1))[0]
    assert after.payload == b"after-crash"
    assert after.msg_id.topic_offset == len(acked) + len(extra)


async def test_graceful_restart_resumes_cursor(fresh_broker: BrokerProcess, topic: str) -> None:
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c1", "resume", S.EXCLUSIVE)
    for i in range(20):
        await p.send(f"m{i}".encode())
    await take(q, 10, ack=cons)  # each ack is applied before its unary call is answered
    await cons.close()
    assert fresh_broker.terminate() == 0
    fresh_broker.start()
    # The producer object from before the restart keeps working (its id is restored from metadata).
    await p.send(b"m20")
    c2 = await client(fresh_broker.url)
    _cons2, q2 = await consumer(c2, topic, "c1", "resume", S.EXCLUSIVE)
    rest = await take(q2, 11, ack=_cons2)
    assert [m.payload for m in rest] == [f"m{i}".encode() for i in range(10, 21)]
    assert [m.msg_id.topic_offset for m in rest] == list(range(10, 21))


async def test_same_consumer_object_continues_across_restart(fresh_broker: BrokerProcess, topic: str) -> None:
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c1", "live", S.EXCLUSIVE)
    for i in range(5):
        await p.send(f"before{i}".encode())
    await take(q, 5, ack=cons)  # each ack is applied before its call is answered: none would come back
    assert fresh_broker.terminate() == 0
    fresh_broker.start()
    for i in range(5):
        await p.send(f"after{i}".encode())
    # Neither the producer nor the consumer object is re-created: the client reconnects by itself.
    got = await take(q, 5, within=30, ack=cons)
    assert [m.payload for m in got] == [f"after{i}".encode() for i in range(5)]
    assert [m.msg_id.topic_offset for m in got] == list(range(5, 10))
