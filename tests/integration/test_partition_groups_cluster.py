"""Cluster mode: a partitioned topic's Failover subscription (official client and Ister client consumers
together) is assigned as one group over the partitions of every broker (broker/partition_share.py). With
per-broker groups, two brokers serving two partitions each and three consumers gave the same two consumers
one partition on each broker and the third none."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import danube
import grpc
import pytest

from ister.client import Client, Consumer
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import client, consumer, producer
from tests.integration.partition_scenario import choose_keys
from tests.support import until

pytestmark = pytest.mark.integration
PARTITIONS = 4
ENV = {"ISTER_DISPATCH__REBALANCE_DELAY_SECONDS": "0.3", "ISTER_DISPATCH__MAX_HANDOFF_SECONDS": "1.0"}


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    tier = f"file://{tmp_path / 'objects'}"  # a shared durable tier: reliable partitions may move
    c = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--durable-url", tier, env=ENV)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


class Collector:
    """Receives and acks an official-client consumer's messages in the background: which partition each
    came from."""

    def __init__(self, name: str, cons: danube.Consumer, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        self.name = name
        self.cons = cons
        self.got: list[str] = []
        self.task = asyncio.create_task(self._run(queue))

    async def _run(self, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        while True:
            m = await queue.get()
            self.got.append(m.msg_id.topic_name)
            await self.cons.ack(m)

    async def close(self) -> None:
        self.task.cancel()
        await self.cons.close()


class IsterCollector:
    """The same for an Ister-client consumer (subscription type `partitioned`)."""

    def __init__(self, name: str, ic: Client, cons: Consumer) -> None:
        self.name = name
        self.ic = ic
        self.cons = cons
        self.got: list[str] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for m in self.cons:
            self.got.append(m.topic)
            await m.ack()

    async def close(self) -> None:
        self.task.cancel()
        await self.cons.close()
        await self.ic.close()


async def test_partitions_on_two_brokers_are_spread_as_one_group(cluster: Cluster) -> None:
    topic = "/default/cluster_parts"
    url = cluster.brokers[0].url
    pc = await client(url)
    prod = await producer(pc, topic, "p", reliable=True, partitions=PARTITIONS)
    parts = [f"{topic}-part-{i}" for i in range(PARTITIONS)]

    async def owners() -> dict[str, int] | None:
        found = {t: b for t, b in (await cluster.assignments()).items() if t in parts}
        return found if len(found) == PARTITIONS else None

    placed = await cluster.until(owners, "every partition assigned")
    if len(set(placed.values())) < 2:  # the test is about partitions on two brokers: move one
        await cluster.unload(parts[1])
        placed = await cluster.until(
            lambda: _spread_over_two(cluster, parts), "the partitions on both brokers", within=30
        )
    assert len(set(placed.values())) == 2, placed

    collectors: list[Collector | IsterCollector] = []
    for name in ("a", "b"):
        cons, queue = await consumer(await client(url), topic, name, "group", danube.SubType.FAILOVER)
        collectors.append(Collector(name, cons, queue))
    ic = Client(url)
    collectors.append(
        IsterCollector("c", ic, await ic.consumer(topic, "group", name="c", type="partitioned"))
    )

    async def round_owners() -> dict[str, set[str]]:
        """Send two messages to every partition (round-robin); who received each partition's."""
        marks = [len(c.got) for c in collectors]
        for i in range(2 * PARTITIONS):
            await prod.send(f"m{i}".encode(), None)
        await cluster.until(
            lambda: sum(len(c.got) - m for c, m in zip(collectors, marks, strict=True)) >= 2 * PARTITIONS,
            "a round delivered",
        )
        return {c.name: set(c.got[m:]) for c, m in zip(collectors, marks, strict=True)}

    last: dict[str, object] = {}

    async def spread(expected: dict[int, int]) -> bool:
        got = await round_owners()
        last["got"] = got
        counts = sorted((len(v) for v in got.values() if v), reverse=True)
        every = set().union(*got.values())
        overlap = sum(len(v) for v in got.values()) != len(every)
        return not overlap and every == set(parts) and counts == sorted(expected.values(), reverse=True)

    # Three consumers over four partitions on two brokers: 2, 1, 1 (per broker it would be 2, 2, 0).
    await until(
        lambda: spread({0: 2, 1: 1, 2: 1}), lambda: f"a 2/1/1 spread over a, b, c; last round {last}", 30
    )
    # Every broker shows the whole map, partitions served elsewhere included.
    for b in cluster.brokers:
        async with grpc.aio.insecure_channel(b.admin_addr) as channel:
            reply = await ipb_grpc.IsterAdminStub(channel).ListPartitionAssignments(
                ipb.ListPartitionAssignmentsRequest(topic=topic)
            )
        shown = {r.partition: r.consumer for r in reply.assignments if r.subscription == "group"}
        assert sorted(shown) == list(range(PARTITIONS)) and sorted(set(shown.values())) == ["a", "b", "c"]

    # The coordinator's gauge counts the whole group: 2 and 1.
    def gauge(url: str) -> tuple[float, float]:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        values = {
            line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("ister_")
        }
        bound = 'ister_partitions_per_consumer{{bound="{}"}}'
        return values.get(bound.format("max"), -1.0), values.get(bound.format("min"), -1.0)

    await until(
        lambda: asyncio.to_thread(lambda: any(gauge(b.metrics_url) == (2, 1) for b in cluster.brokers)),
        "a broker's partitions-per-consumer gauge at 2 and 1",
    )

    # Partition 0 moves to the other broker, which becomes the group's coordinator: the consumers follow
    # it there and the group is spread again.
    first_owner = placed[parts[0]]
    await cluster.unload(parts[0])
    await cluster.until(
        lambda: _owner_other_than(cluster, parts[0], first_owner), "partition 0 on the other broker"
    )
    await until(
        lambda: spread({0: 2, 1: 1, 2: 1}), lambda: f"a 2/1/1 spread again after the move; last {last}", 30
    )

    # c goes: its partition moves, the others stay where they are (sticky); 2 and 2.
    before = await round_owners()
    await collectors.pop().close()
    await until(lambda: spread({0: 2, 1: 2}), lambda: f"a 2/2 spread over a, b; last {last}", 30)
    after = await round_owners()
    for name in ("a", "b"):
        assert before[name] <= after[name], (before, after)
    for c in collectors:
        await c.close()


async def _spread_over_two(cluster: Cluster, parts: list[str]) -> dict[str, int] | None:
    found = {t: b for t, b in (await cluster.assignments()).items() if t in parts}
    return found if len(found) == len(parts) and len(set(found.values())) == 2 else None


async def _owner_other_than(cluster: Cluster, topic: str, broker: int) -> bool:
    owner = (await cluster.assignments()).get(topic)
    return owner is not None and owner != broker


async def test_the_group_recovers_when_the_coordinators_broker_dies(cluster: Cluster) -> None:
    """SIGKILL of the broker serving partition 0: its partitions go to the survivor, the group's map key goes
    with the dead broker's lease, the survivor coordinates from scratch and the consumers (reconnected
    there) are spread again."""
    topic = "/default/cluster_crash"
    parts = [f"{topic}-part-{i}" for i in range(PARTITIONS)]
    urls = [b.url for b in cluster.brokers]
    ic = Client(urls)
    prod = await ic.producer(topic, partitions=PARTITIONS)
    keyed = choose_keys(PARTITIONS, PARTITIONS)  # one key per partition
    placed = await cluster.until(lambda: _spread_over_two(cluster, parts), "the partitions on both brokers")
    coordinator = cluster.process_of(placed[parts[0]])
    survivor = next(b for b in cluster.brokers if b is not coordinator)
    # Ister-client consumers: they keep reconnecting their partitions until the survivor serves them. The
    # official client 0.5.0 stops a partition's consumer when its retries and one re-subscribe fail, which
    # they do while the dead broker's partitions wait for its lease to expire.
    collectors: list[Collector | IsterCollector] = []
    for name in ("a", "b", "c"):
        cc = Client(survivor.url)
        collectors.append(
            IsterCollector(name, cc, await cc.consumer(topic, "group", name=name, type="partitioned"))
        )
    last: dict[str, object] = {}

    async def spread_211() -> bool:
        marks = [len(c.got) for c in collectors]
        await prod.send_each([(b"x", None, key) for key in keyed] * 2)
        await until(
            lambda: sum(len(c.got) - m for c, m in zip(collectors, marks, strict=True)) >= 2 * PARTITIONS,
            "a round delivered",
            30,
        )
        got = {c.name: set(c.got[m:]) for c, m in zip(collectors, marks, strict=True)}
        last["got"] = got
        counts = sorted((len(v) for v in got.values()), reverse=True)
        return set().union(*got.values()) == set(parts) and counts == [2, 1, 1]

    await until(spread_211, lambda: f"a 2/1/1 spread; last round {last}", 30)
    coordinator.kill9()
    await cluster.until(
        lambda: _all_on(cluster, parts, cluster.broker_id(survivor)), "every partition on the survivor", 30
    )
    await until(spread_211, lambda: f"a 2/1/1 spread after the crash; last round {last}", 60)
    for c in collectors:
        await c.close()
    await ic.close()


async def _all_on(cluster: Cluster, parts: list[str], broker: int) -> bool:
    found = await cluster.assignments()
    return all(found.get(t) == broker for t in parts)
