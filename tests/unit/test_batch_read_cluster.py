"""Offsets and Read in cluster mode, in-process: two brokers with their ClusterNodes on one in-memory
metadata store (as in test_admin_cluster), each serving the client API on a port of its own, sharing a
`file://` durable tier. A read follows its topic when it moves to the other broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ister.broker.service import BrokerService
from ister.client import Client
from ister.cluster.node import ClusterNode
from ister.core.record import decode_message
from ister.ids import TopicName
from ister.metadata.embedded import EmbeddedStore
from ister.wire.gen import ister_v1_pb2 as pb
from tests.support import free_port, until
from tests.unit.isolation import run_module_in_child, skip_if_sharing, start_client_server
from tests.unit.test_admin_cluster import close_cluster, start_member


@pytest.fixture(autouse=True)
def _own_process(request: pytest.FixtureRequest) -> None:
    skip_if_sharing(request)


def test_in_child_process() -> None:
    run_module_in_child(__file__)


class Member:
    def __init__(self, broker: BrokerService, cluster: ClusterNode, server: Any, url: str) -> None:
        self.broker = broker
        self.cluster = cluster
        self.server = server
        self.url = url


@pytest.fixture
async def members(tmp_path: Path) -> AsyncIterator[list[Member]]:
    store = EmbeddedStore.in_memory()
    objects = tmp_path / "objects"
    objects.mkdir()
    out: list[Member] = []
    try:
        for i in range(2):
            port = free_port()
            addr = f"127.0.0.1:{port}"
            durable = {"storage.durable.url": objects.as_uri()}
            broker, cluster = await start_member(
                store, tmp_path / f"b{i}", addr, f"127.0.0.1:{free_port()}", **durable
            )
            server = await start_client_server(broker, addr)
            out.append(Member(broker, cluster, server, f"http://127.0.0.1:{port}"))
        await until(lambda: out[0].cluster.leader() is not None, "a leader")
        yield out
    finally:
        for m in out:
            await m.server.stop(0)
            await m.broker.close()
            await close_cluster(m.cluster, m.broker)
        await store.close()


def owner(members: list[Member], topic: str) -> Member | None:
    return next((m for m in members if topic in m.broker.topics), None)


async def test_read_follows_the_topic_to_its_new_owner(
    members: list[Member], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "/default/moving"
    async with Client(members[0].url, backoff_base=0.05) as client:
        producer = await client.producer(topic, "p")
        payloads = [b"c%04d" % i for i in range(300)]
        offsets = await producer.send_batch(payloads)
        await producer.close()
        first = owner(members, topic)
        assert first is not None
        other = next(m for m in members if m is not first)
        span = await client.offsets(topic)
        assert (span.earliest, span.next) == (0, 300)
        assert span.durable_url is not None and span.durable_url.startswith("file://")
        # A broker that does not own the topic sends the client away.
        stub = client.stub(other.url)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Offsets(pb.OffsetsRequest(topic=topic))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Read(pb.ReadRequest(topic=topic, start=0, end=300)):
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        # Hold the owner's read after its first batch until the topic has moved.
        calls: list[tuple[int, int]] = []
        moved = asyncio.Event()
        for m in members:
            original = m.broker.read_range

            def gated(original: Any = original, who: int = m.cluster.broker_id) -> Any:
                async def read_range(
                    name: str, start: int, end: int, max_records: int, max_bytes: int
                ) -> AsyncIterator[list[tuple[int, bytes]]]:
                    calls.append((who, start))
                    batches = original(name, start, end, max_records, max_bytes)
                    async for batch in batches:
                        yield batch
                        if len(calls) == 1:
                            await moved.wait()
                    await batches.aclose()

                return read_range

            monkeypatch.setattr(m.broker, "read_range", gated())
        got: list[tuple[int, bytes]] = []
        reader = client.read(topic, 0, 300, max_records=10)
        got += await anext(reader)
        await first.broker.request_unload(TopicName.parse(topic))
        await until(lambda: owner(members, topic) is other, "the topic on the other broker")
        moved.set()
        async with asyncio.timeout(30):
            async for batch in reader:
                got += batch
        assert [o for o, _ in got] == offsets
        assert [decode_message(r).payload for _, r in got] == payloads
        ids = (first.cluster.broker_id, other.cluster.broker_id)
        assert calls[0] == (ids[0], 0) and calls[-1] == (ids[1], 10)
        # The new owner reads the history from the objects the old one exported when it sealed.
        loaded = other.broker.topics[topic]
        assert loaded.wal is not None and loaded.wal.first_offset == 300
        span = await client.offsets(topic)
        assert (span.earliest, span.next) == (0, 300)
