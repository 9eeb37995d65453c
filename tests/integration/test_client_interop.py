"""ister.client and the official danube-client on the same topics of a real broker.

(This module imports `danube`; it must not import the `ister.wire` Danube protobuf modules, which clash with
danube-client's registrations. `ister.client` imports only the ister.v1 ones.)
"""

from __future__ import annotations

import asyncio

import danube
import pytest

from ister.client import Client, Consumer, Message
from ister.client.routing import fnv1a_64
from tests.integration.harness import BrokerProcess, client, consumer, producer, take

pytestmark = pytest.mark.integration


async def take_ister(c: Consumer, n: int, within: float = 30.0) -> list[Message]:
    out: list[Message] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(out) < n:
        if loop.time() > deadline:
            raise AssertionError(f"received {len(out)} of {n}")
        batch = await c.receive_batch(n - len(out), 1.0)
        await c.ack_batch(batch)
        out += batch
    return out


async def test_danube_producer_ister_consumer(shared_broker: BrokerProcess, topic: str) -> None:
    dc = await client(shared_broker.url)
    dp = await producer(dc, topic, "danube-p", reliable=True)
    async with Client(shared_broker.url) as ic:
        cons = await ic.consumer(topic, "mixed", type="exclusive")
        for i in range(50):
            await dp.send(f"d{i}".encode(), {"i": str(i)})
        got = await take_ister(cons, 50)
        assert [m.payload for m in got] == [f"d{i}".encode() for i in range(50)]
        assert [m.offset for m in got] == list(range(50))
        assert got[7].attributes == {"i": "7"}
        assert got[0].producer_name == "danube-p"


async def test_ister_producer_danube_consumer(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as ic:
        ip = await ic.producer(topic, "ister-p")
        dc = await client(shared_broker.url)
        dcons, q = await consumer(dc, topic, "dc", "mixed", danube.SubType.EXCLUSIVE)
        offsets = await ip.send_batch([b"i%d" % i for i in range(50)], attributes={"from": "ister"}, key="k")
        got = await take(q, 50, ack=dcons)
        assert [m.payload for m in got] == [b"i%d" % i for i in range(50)]
        assert [m.msg_id.topic_offset for m in got] == offsets
        assert got[0].attributes["from"] == "ister"
        assert got[0].producer_name == "ister-p"
        await dcons.close()


async def test_both_producers_one_topic_one_offset_sequence(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as ic:
        ip = await ic.producer(topic, "ister-p")
        dc = await client(shared_broker.url)
        dp = await producer(dc, topic, "danube-p", reliable=True)
        cons = await ic.consumer(topic, "both")
        for i in range(20):
            await dp.send(b"d%d" % i)
            await ip.send(b"i%d" % i)
        got = await take_ister(cons, 40)
        assert [m.offset for m in got] == list(range(40))
        assert {m.producer_name for m in got} == {"ister-p", "danube-p"}


async def test_key_routing_matches_danube_on_partitions(shared_broker: BrokerProcess, topic: str) -> None:
    async with Client(shared_broker.url) as ic:
        ip = await ic.producer(topic, partitions=3)
        dc = await client(shared_broker.url)
        dp = await producer(dc, topic, "danube-keyed", reliable=True, partitions=3)
        cons = await ic.consumer(topic, "keys", type="shared")
        keys = [f"customer-{i}" for i in range(12)]
        for k in keys:
            await ip.send(b"ister", key=k)
            await dp.send_with_key(b"danube", None, k)
        got = await take_ister(cons, 24)
        where: dict[str, set[str]] = {}
        for m in got:
            assert m.key is not None
            where.setdefault(m.key, set()).add(m.topic)
        for k in keys:
            assert where[k] == {f"{topic}-part-{fnv1a_64(k) % 3}"}  # both clients chose the same partition
