"""ister.client against a real broker process: volume, metadata round trip, subscription types, partitions,
ack ranges with gaps, nacks and the blocking facade."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from ister import errors
from ister.client import Client, Consumer, Message
from ister.client.blocking import BlockingClient
from ister.client.routing import fnv1a_64
from tests.integration.harness import BrokerProcess

pytestmark = pytest.mark.integration


async def take(consumer: Consumer, n: int, within: float = 30.0, ack: bool = True) -> list[Message]:
    """Receive exactly n messages (acking them when asked) or fail after `within` seconds."""
    out: list[Message] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(out) < n:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"received {len(out)} of {n} messages within {within} s")
        batch = await consumer.receive_batch(n - len(out), min(remaining, 1.0))
        if ack:
            await consumer.ack_batch(batch)
        out.extend(batch)
    return out


async def test_100k_published_and_consumed_with_acks(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "bulk")  # creates the topic
        consumer = await client.consumer(topic, "all", window=5000)  # a new subscription starts at the end
        payloads = [b"m%06d" % i for i in range(100_000)]
        offsets = []
        for i in range(0, len(payloads), 25_000):
            offsets += await producer.send_batch(payloads[i : i + 25_000])
        assert offsets == list(range(100_000))
        got = await take(consumer, 100_000, within=90)
        assert [m.offset for m in got] == offsets
        assert [m.payload for m in got] == payloads
        assert not any(m.redelivered for m in got)


async def test_metadata_round_trip(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, "meta-producer")
        consumer = await client.consumer(topic, "s", type="exclusive", name="c1")
        o1 = await producer.send(b"one", attributes={"k": "v", "ü": "ß"}, key="order-1")
        fut = producer.send_nowait(b"two")
        o2 = await fut
        assert (o1, o2) == (0, 1)
        first, second = await take(consumer, 2)
        assert (first.offset, first.topic, first.payload) == (0, topic, b"one")
        assert first.attributes == {"k": "v", "ü": "ß"}
        assert first.key == "order-1" and second.key is None
        assert first.producer_name == "meta-producer"
        assert first.publish_time > 1_600_000_000_000


async def test_shared_subscription_splits(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic)
        c1 = await client.consumer(topic, "shared", type="shared", name="a")
        c2 = await client.consumer(topic, "shared", type="shared", name="b")
        await producer.send_batch([b"%d" % i for i in range(2000)])
        got: list[Message] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(got) < 2000 and loop.time() < deadline:
            for c in (c1, c2):
                batch = await c.receive_batch(500, 0.1)
                await c.ack_batch(batch)
                got += batch
        assert sorted(m.offset for m in got) == list(range(2000))
        by_consumer = Counter(m._sub.consumer_name for m in got)
        assert set(by_consumer) == {"a", "b"}


async def test_partitioned_topic(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, partitions=4, max_batch_messages=500)
        parts = [f"{topic}-part-{i}" for i in range(4)]
        assert producer.partitions == parts
        consumer = await client.consumer(topic, "all", type="shared", window=5000)
        assert consumer.partitions == parts
        again = await client.producer(topic)  # found by lookup
        assert again.partitions == parts
        await producer.send_batch([b"u%d" % i for i in range(4000)])  # 8 batches, round-robin
        keys = [f"key-{i}" for i in range(20)]
        for k in keys:
            await producer.send(k.encode(), key=k)
        got = await take(consumer, 4020)
        unkeyed = Counter(m.topic for m in got if m.key is None)
        assert unkeyed == dict.fromkeys(parts, 1000)
        for m in got:
            if m.key is not None:
                assert m.topic == parts[fnv1a_64(m.key) % 4]
                assert m.payload == m.key.encode()


async def test_ack_gaps_redelivered_after_reconnect(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic)
        consumer = await client.consumer(topic, "gaps", name="same")
        await producer.send_batch([b"%d" % i for i in range(100)])
        got = await take(consumer, 100, ack=False)
        await consumer.ack_batch([m for m in got if m.offset % 2 == 0])
        await consumer.close()  # sends the pending ack ranges, ends the stream
        consumer = await client.consumer(topic, "gaps", name="same")
        await producer.send(b"sentinel")
        seen: list[Message] = []
        while not any(m.payload == b"sentinel" for m in seen):
            seen += await take(consumer, 1)
        redelivered = [m.offset for m in seen if m.payload != b"sentinel"]
        assert sorted(redelivered) == list(range(1, 100, 2))  # the odd ones, and none of the acked ones


async def test_close_right_after_acks_redelivers_none_of_them(
    shared_broker: BrokerProcess, topic: str
) -> None:
    """close() half-closes the stream once the acks are written and waits for the broker to end it: every
    ack is applied first, so the next consumer gets only the unacknowledged messages again. (A cancelled
    stream lost the Ack frames the broker had not read yet: here 5,000 ranges, two frames, right before
    close(); their messages were redelivered.)"""
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic)
        for rnd in range(3):
            consumer = await client.consumer(topic, "leave", name="same", window=10_000)
            await producer.send_batch([b"r%d-%d" % (rnd, i) for i in range(10_000)])
            got = await take(consumer, 10_000, ack=False)
            assert all(m.payload.startswith(b"r%d-" % rnd) for m in got)
            for m in got[1::2]:
                m.ack_nowait()  # every other message: 5,000 ranges
            await consumer.close()
            consumer = await client.consumer(topic, "leave", name="same", window=10_000)
            await producer.send(b"sentinel")
            seen: list[Message] = []
            while not any(m.payload == b"sentinel" for m in seen):
                seen += await take(consumer, 1)
            redelivered = sorted(m.offset for m in seen if m.payload != b"sentinel")
            assert redelivered == sorted(m.offset for m in got[0::2]), f"round {rnd}: {len(redelivered)}"
            await consumer.ack_batch(seen)
            await consumer.close()


async def test_nack_redelivers(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic)
        consumer = await client.consumer(topic, "nack")
        await producer.send(b"again")
        first = await consumer.receive(timeout=10)
        await first.nack(delay_ms=0, reason="try later")
        second = await consumer.receive(timeout=10)
        assert (second.offset, second.payload, second.redelivered) == (first.offset, b"again", True)
        await second.ack()


async def test_non_reliable_topic(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as client:
        producer = await client.producer(topic, reliable=False)
        consumer = await client.consumer(topic, "live")
        await producer.send_batch([b"x"] * 10)
        assert len(await take(consumer, 10)) == 10
        with pytest.raises(errors.FailedPrecondition):
            await client.producer(topic, "other", reliable=True)


def test_blocking_client(shared_broker: BrokerProcess, topic: str) -> None:
    with BlockingClient(shared_broker.url) as client:
        with client.producer(topic) as producer:
            consumer = client.consumer(topic, "blocking")
            assert producer.send(b"first") == 0
            assert producer.send_batch([b"%d" % i for i in range(999)]) == list(range(1, 1000))
        seen = []
        for msg in consumer:
            seen.append(msg.offset)
            consumer.ack(msg)
            if len(seen) == 1000:
                break
        assert seen == list(range(1000))
        with pytest.raises(errors.Timeout):
            consumer.receive(timeout=0.2)
