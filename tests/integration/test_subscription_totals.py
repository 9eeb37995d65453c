"""What the console's overview asks at any topic count (issue 42): `ListSubscriptionStats` with
`totals_only` (dispatch rates and the lagging count) against what the test did and against the full
listing it replaces, and `ListTopics` from the broker's name and owner indexes, on a real standalone
broker and a real 2-broker cluster; then etcd down during both calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from ister.client import Client
from ister.wire.gen import ister_v1_pb2 as pb
from ister.wire.gen import ister_v1_pb2_grpc as pb_grpc
from tests.etcd_server import EtcdServer, etcd_binary
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PACE = 20 / 0.05  # messages/s the pump sends at most (20 every 50 ms)


async def ask(addr: str, **fields: object) -> pb.ListSubscriptionStatsResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        answer: pb.ListSubscriptionStatsResponse = await pb_grpc.IsterAdminStub(
            channel
        ).ListSubscriptionStats(pb.ListSubscriptionStatsRequest(**fields), timeout=30)
        return answer


@contextlib.asynccontextmanager
async def traffic(url: str, flowing: str, stuck: str) -> AsyncIterator[asyncio.Event]:
    """A pump into `flowing` with a consumer acknowledging all; 5 records on `stuck` whose consumer
    acknowledges none (its subscription lags). Setting the event yielded stops the pump only."""
    stop = asyncio.Event()
    async with Client(url) as client:
        producer = await client.producer(flowing, "pump")
        reader = await client.consumer(flowing, "reader", type="exclusive", name="r1")
        once = await client.producer(stuck, "once")  # makes the topic
        lazy = await client.consumer(stuck, "lazy", type="exclusive", name="l1")
        await once.send_batch([b"z" * 10 for _ in range(5)])

        async def pump() -> None:
            while not stop.is_set():
                await producer.send_batch([b"y" * 50 for _ in range(20)])
                await asyncio.sleep(0.05)

        async def drain() -> None:
            async for m in reader:
                await m.ack()

        tasks = [asyncio.create_task(pump()), asyncio.create_task(drain())]
        try:
            yield stop
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await lazy.close()


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.1 * max(a, b)


async def totals_match_the_listing(addr: str) -> pb.SubscriptionTotals | None:
    """Totals and the full listing asked back to back until both show traffic and agree (a rate tick
    between the two calls moves both figures; the next try does not straddle one)."""
    t = (await ask(addr, totals_only=True)).totals
    listed = await ask(addr)
    rate = sum(e.msg_rate_out for e in listed.subscriptions)
    size = sum(e.byte_rate_out for e in listed.subscriptions)
    if t.msg_rate_out <= 0 or not _close(t.msg_rate_out, rate) or not _close(t.byte_rate_out, size):
        return None
    return t if t.subscriptions == len(listed.subscriptions) and t.lagging >= 1 else None


async def drained(addr: str) -> bool:
    """The pump stopped and `reader` caught up: only `lazy` lags, in the totals and the listing alike (while
    records flow, `reader` lags for a moment now and then, and two calls need not see the same moment)."""
    t = (await ask(addr, totals_only=True)).totals
    listed = await ask(addr)
    lagging = sum(1 for e in listed.subscriptions if e.backlog_messages > 0)
    return (t.subscriptions, t.lagging) == (2, 1) and lagging == 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("totals") / "data")
    b.start()
    yield b
    b.stop()


async def test_standalone_totals_are_the_listings_sums(broker: BrokerProcess) -> None:
    flowing, stuck = "/default/totals_flowing", "/default/totals_stuck"
    async with traffic(broker.url, flowing, stuck) as stop:
        t = await until(lambda: totals_match_the_listing(broker.admin_addr), "totals = listing", within=60)
        assert 0 < t.msg_rate_out <= PACE * 1.5  # the pump's pace at most
        assert t.byte_rate_out / t.msg_rate_out >= 50  # records as stored: payload and headers
        assert not (await ask(broker.admin_addr, totals_only=True)).subscriptions  # totals only
        stop.set()
        await until(lambda: drained(broker.admin_addr), "only `lazy` lagging (5 unacknowledged records)")
        other = (await ask(broker.admin_addr, totals_only=True, namespace="default")).totals
        assert (other.subscriptions, other.lagging) == (2, 1)

    async def quiet() -> bool:
        t = (await ask(broker.admin_addr, totals_only=True)).totals
        return t.msg_rate_out == 0 and t.byte_rate_out == 0

    await until(quiet, "dispatch rates back to 0 once traffic stopped", within=30)


async def test_an_unknown_namespace_is_refused(broker: BrokerProcess) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ask(broker.admin_addr, totals_only=True, namespace="no_such_space")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test alone: it is stopped while the cluster runs."""
    if etcd_binary() is None:
        pytest.skip("etcd is not installed: apt-get install etcd-server")
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    yield server
    server.stop()


async def topics(addr: str, **fields: object) -> pb.ListTopicsResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        answer: pb.ListTopicsResponse = await pb_grpc.IsterAdminStub(channel).ListTopics(
            pb.ListTopicsRequest(**fields), timeout=30
        )
        return answer


async def test_cluster_totals_and_topic_counts_then_etcd_down(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = Cluster(tmp_path, etcd.endpoint, 2, 2)
    try:
        await cluster.start()
        entry = cluster.brokers[0]
        flowing, stuck = "/default/ctotals_flowing", "/default/ctotals_stuck"
        async with traffic(entry.url, flowing, stuck) as stop:
            t = await until(lambda: totals_match_the_listing(entry.admin_addr), "totals = listing", within=60)
            assert 0 < t.msg_rate_out <= PACE * 1.5
            stop.set()
            await until(lambda: drained(entry.admin_addr), "only `lazy` lagging")
            # The cluster's totals are the brokers' own (each asked for its loaded topics only).
            parts = [(await ask(b.admin_addr, totals_only=True, local=True)).totals for b in cluster.brokers]
            assert sum(p.subscriptions for p in parts) == 2 and sum(p.lagging for p in parts) == 1
            assert not (await ask(entry.admin_addr, totals_only=True)).failed_brokers

            # The topic listing from the indexes: both topics, each with its owner, on any broker.
            async def both_owned(addr: str) -> pb.ListTopicsResponse | None:
                r = await topics(addr, limit=10)
                owned = all(t.HasField("broker_id") for t in r.topics)
                return r if r.total == 2 and owned and sum(r.per_broker.values()) == 2 else None

            ids = {cluster.broker_id(b) for b in cluster.brokers}
            for b in cluster.brokers:
                r = await until(lambda b=b: both_owned(b.admin_addr), "both topics owned")
                assert [t.name for t in r.topics] == [flowing, stuck] and r.unassigned == 0
                assert {t.broker_id for t in r.topics} <= ids and r.namespaces >= 1
                assert [t.name for t in (await topics(b.admin_addr, limit=1, offset=1)).topics] == [stuck]

            # etcd down: the broker list cannot be read, so a clear UNAVAILABLE, not totals of part of
            # the cluster shown as the whole.
            etcd.stop()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await ask(entry.admin_addr, totals_only=True)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
            assert "etcd" in (caught.value.details() or ""), caught.value.details()
            # Nor the topic list the broker's mirror still holds.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await topics(entry.admin_addr, limit=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    finally:
        await cluster.stop()
