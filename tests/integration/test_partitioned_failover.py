"""Failover subscriptions on a partitioned topic with the official client (broker/partition_groups.py):
partitions spread over the consumers, each delivered to one of them, moved gracefully when one joins or
goes, nothing lost."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import danube
import grpc
import pytest

from ister.client import Client, Consumer
from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.integration.harness import ISTER, BrokerProcess, client, consumer, producer, take
from tests.support import until

pytestmark = pytest.mark.integration
PARTITIONS = 6


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    config = tmp_path / "ister.yaml"
    config.write_text("dispatch:\n  rebalance_delay_seconds: 0.3\n  max_handoff_seconds: 2.0\n")
    b = BrokerProcess(tmp_path / "data", "--config-file", str(config))
    b.start()
    try:
        yield b
    finally:
        b.stop()


class Collector:
    """Receives a consumer's messages in the background and acks each: which partitions it got."""

    def __init__(self, name: str, cons: danube.Consumer, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        self.name = name
        self.cons = cons
        self.partitions: dict[str, list[bytes]] = {}
        self.task = asyncio.create_task(self._run(queue))

    async def _run(self, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        while True:
            m = await queue.get()
            self.partitions.setdefault(m.msg_id.topic_name, []).append(bytes(m.payload))
            await self.cons.ack(m)

    def since(self, mark: dict[str, int]) -> set[str]:
        """Partitions that delivered here after `mark` (counts per partition taken earlier)."""
        return {p for p, got in self.partitions.items() if len(got) > mark.get(p, 0)}

    def counts(self) -> dict[str, int]:
        return {p: len(got) for p, got in self.partitions.items()}

    def received(self) -> list[bytes]:
        return [m for got in self.partitions.values() for m in got]


async def send_round(p: danube.Producer, label: str, n: int) -> list[bytes]:
    sent = []
    for i in range(n):
        payload = f"{label}-{i}".encode()
        await p.send(payload, None)
        sent.append(payload)
    return sent


async def test_partitions_spread_over_failover_consumers_and_follow_them(broker: BrokerProcess) -> None:
    topic = "/default/orders"
    pc = await client(broker.url)
    prod = await producer(pc, topic, "p", reliable=True, partitions=PARTITIONS)
    clients, collectors = [], []
    for name in ("a", "b", "c"):
        c = await client(broker.url)
        clients.append(c)
        cons, queue = await consumer(c, topic, name, "group", danube.SubType.FAILOVER)
        collectors.append(Collector(name, cons, queue))
    sent: list[bytes] = []
    everyone = lambda: sorted(m for col in collectors for m in col.received())  # noqa: E731

    # Three consumers: two partitions each, every partition delivered to exactly one of them.
    async def spread() -> bool:
        mark = [col.counts() for col in collectors]
        sent.extend(await send_round(prod, f"r{len(sent)}", 4 * PARTITIONS))
        await until(lambda: len(everyone()) == len(sent), "the round delivered", within=20)
        got = [col.since(m) for col, m in zip(collectors, mark, strict=True)]
        return all(len(g) == 2 for g in got) and len(set().union(*got)) == PARTITIONS

    await until(spread, "partitions spread two per consumer", within=30)
    owners = {p: col.name for col in collectors for p in col.since({})}
    # The admin CLI shows the same map.
    shown = await asyncio.to_thread(
        subprocess.run,
        [*ISTER, "admin", "topics", "subscriptions", topic, "--admin-addr", broker.admin_addr, "-o", "json",
         "--partition-map"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    listed = json.loads(shown.stdout)
    assert listed["subscriptions"] == ["group"]
    assert {f"{topic}-part-{r['partition']}": r["consumer"] for r in listed["partitions"]} == owners

    # One consumer goes (its client closes): its partitions move to the others at once, nothing is lost.
    gone = collectors.pop()
    await gone.cons.close()
    gone.task.cancel()
    mark = [col.counts() for col in collectors]
    before = len(everyone()) + len(gone.received())
    round_sent = await send_round(prod, "after", 6 * PARTITIONS)
    sent.extend(round_sent)

    def all_in() -> bool:
        have = set(everyone()) | set(gone.received())
        return all(m in have for m in sent)

    await until(all_in, "every message delivered after the consumer left", within=30)
    moved_to = [col.since(m) for col, m in zip(collectors, mark, strict=True)]
    assert len(set().union(*moved_to)) == PARTITIONS and all(len(g) == 3 for g in moved_to)
    # The survivors kept their own partitions (sticky): only the departed one's moved.
    for col, got in zip(collectors, moved_to, strict=True):
        assert {p for p, o in owners.items() if o == col.name} <= got
    assert before <= len(everyone()) + len(gone.received())
    for col in collectors:
        col.task.cancel()
    for c in [pc, *clients]:
        with_close = getattr(c, "close", None)
        if with_close is not None:
            await with_close()


async def test_a_join_hands_partitions_off_gracefully(broker: BrokerProcess) -> None:
    """Consumer a holds delivered, unacknowledged messages when b joins: the partitions moving to b pause
    until the handoff time (2 s here) and their unacknowledged messages then go to b; the partitions a
    keeps never pause."""
    topic = "/default/handoff"
    pc = await client(broker.url)
    prod = await producer(pc, topic, "p", reliable=True, partitions=PARTITIONS)
    ca = await client(broker.url)
    a_cons, a_queue = await consumer(ca, topic, "a", "group", danube.SubType.FAILOVER)
    held = []
    for i in range(PARTITIONS):  # one message per partition (round-robin), none acknowledged
        await prod.send(f"held-{i}".encode(), None)
    while len(held) < PARTITIONS:
        held.append(await asyncio.wait_for(a_queue.get(), 15))
    cb = await client(broker.url)
    b_cons, b_queue = await consumer(cb, topic, "b", "group", danube.SubType.FAILOVER)
    joined = asyncio.get_running_loop().time()
    b_got: list[tuple[float, str, bytes]] = []

    async def collect_b() -> None:
        while True:
            m = await b_queue.get()
            b_got.append((asyncio.get_running_loop().time() - joined, m.msg_id.topic_name, bytes(m.payload)))
            await b_cons.ack(m)

    b_task = asyncio.create_task(collect_b())
    # b receives the unacknowledged messages of the partitions it takes, after the handoff time.
    await until(
        lambda: len({p for _, p, _ in b_got}) == PARTITIONS // 2, "b given three partitions", within=20
    )
    moved = {p for _, p, _ in b_got}
    first_at = min(t for t, _, _ in b_got)
    assert first_at >= 2.0 - 0.3, f"b got a moved partition's message {first_at:.2f} s after it joined"
    assert sorted(x for _, _, x in b_got) == sorted(
        bytes(m.payload) for m in held if m.msg_id.topic_name in moved
    )
    # Meanwhile a kept its other partitions and they kept flowing: a message sent there now reaches a at once.
    mark = asyncio.get_running_loop().time()
    for i in range(PARTITIONS):
        await prod.send(f"after-{i}".encode(), None)
    a_after = []
    while len(a_after) < PARTITIONS // 2:
        m = await asyncio.wait_for(a_queue.get(), 15)
        if bytes(m.payload).startswith(b"after-"):
            a_after.append(m)
        await a_cons.ack(m)
    assert {m.msg_id.topic_name for m in a_after}.isdisjoint(moved)
    assert asyncio.get_running_loop().time() - mark < 2.0
    await until(lambda: sum(x.startswith(b"after-") for _, _, x in b_got) == PARTITIONS // 2, "b's share")

    def handoffs_counted() -> bool:
        text = urllib.request.urlopen(broker.metrics_url, timeout=5).read().decode()
        values = {
            line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("ister_")
        }
        return (
            values.get("ister_partition_handoffs_total", 0) >= PARTITIONS // 2
            and values.get("ister_partition_handoff_redelivered_total", 0) >= PARTITIONS // 2
            and values.get('ister_partition_handoff_seconds_bucket{le="1.0"}', -1) == 0
        )

    await until(lambda: asyncio.to_thread(handoffs_counted), "the handoffs in the metrics")
    b_task.cancel()
    await a_cons.close()
    await b_cons.close()


async def test_ister_client_partitioned_consumers_share_the_partitions(broker: BrokerProcess) -> None:
    topic = "/default/ister-parts"
    async with Client(broker.url) as ic:
        prod = await ic.producer(topic, partitions=4)
        first = await ic.consumer(topic, "grp", name="one", type="partitioned")
        second = await ic.consumer(topic, "grp", name="two", type="partitioned")
        seen: dict[str, set[str]] = {"one": set(), "two": set()}

        async def drain(name: str, cons: Consumer) -> None:
            async for m in cons:
                seen[name].add(m.topic)
                await m.ack()

        tasks = [asyncio.create_task(drain("one", first)), asyncio.create_task(drain("two", second))]

        async def settled() -> bool:
            seen["one"].clear()
            seen["two"].clear()
            for _ in range(8):
                await prod.send(b"x")  # round-robin over the four partitions
            await until(lambda: len(seen["one"] | seen["two"]) == 4, "a round delivered", within=10)
            return len(seen["one"]) == 2 and len(seen["two"]) == 2 and not (seen["one"] & seen["two"])

        await until(settled, "two partitions each", within=30)
        for t in tasks:
            t.cancel()


async def test_the_handoff_time_is_a_subscription_setting(broker: BrokerProcess) -> None:
    """`set-dispatch-config --max-handoff` on the partitioned base name: this subscription's moving
    partitions wait 0.5 s for the old consumer, not the broker's 2 s."""
    topic = "/default/quick"
    pc = await client(broker.url)
    prod = await producer(pc, topic, "p", reliable=True, partitions=2)
    async with grpc.aio.insecure_channel(broker.admin_addr) as channel:
        topics = apb_grpc.TopicAdminStub(channel)
        config = apb.SubscriptionDispatchConfig(max_handoff_seconds=0.5)
        request = apb.SetSubscriptionDispatchConfigRequest(
            topic=topic, subscription="g", dispatch_config=config
        )
        assert (await topics.SetSubscriptionDispatchConfig(request)).success
    ca = await client(broker.url)
    a_cons, a_queue = await consumer(ca, topic, "a", "g", danube.SubType.FAILOVER)
    for i in range(2):
        await prod.send(f"held-{i}".encode(), None)
    for _ in range(2):
        await asyncio.wait_for(a_queue.get(), 15)  # delivered to a, never acknowledged
    cb = await client(broker.url)
    b_cons, b_queue = await consumer(cb, topic, "b", "g", danube.SubType.FAILOVER)
    joined = asyncio.get_running_loop().time()
    m = await asyncio.wait_for(b_queue.get(), 15)
    waited = asyncio.get_running_loop().time() - joined
    assert bytes(m.payload).startswith(b"held-")
    assert 0.5 - 0.2 <= waited < 2.0, f"the moving partition switched after {waited:.2f} s"
    await a_cons.close()
    await b_cons.close()


async def test_a_departed_consumers_messages_count_as_redelivered(broker: BrokerProcess) -> None:
    """A consumer that goes while holding unacknowledged messages: its partitions move at once and the
    handoff reports the messages its stream handed back when it ended as redelivered (log and metric)."""
    topic = "/default/departed"
    pc = await client(broker.url)
    prod = await producer(pc, topic, "p", reliable=True, partitions=PARTITIONS)
    ca, cb = await client(broker.url), await client(broker.url)
    a_cons, a_queue = await consumer(ca, topic, "a", "group", danube.SubType.FAILOVER)
    b_cons, b_queue = await consumer(cb, topic, "b", "group", danube.SubType.FAILOVER)

    async def settled() -> bool:
        async with grpc.aio.insecure_channel(broker.admin_addr) as channel:
            reply = await ipb_grpc.IsterAdminStub(channel).ListPartitionAssignments(
                ipb.ListPartitionAssignmentsRequest(topic=topic)
            )
        rows = list(reply.assignments)
        owners = sorted(r.consumer for r in rows)
        return not any(r.handing_off_to for r in rows) and owners == ["a"] * 3 + ["b"] * 3

    await until(settled, "three partitions each", within=20)
    for i in range(PARTITIONS):  # one message per partition, none acknowledged
        await prod.send(f"held-{i}".encode(), None)
    a_held = await take(a_queue, PARTITIONS // 2)
    await take(b_queue, PARTITIONS // 2)
    await a_cons.close()  # a goes with three messages unacknowledged
    again = await take(b_queue, PARTITIONS // 2)
    assert sorted(bytes(m.payload) for m in again) == sorted(bytes(m.payload) for m in a_held)

    def counted() -> bool:
        text = urllib.request.urlopen(broker.metrics_url, timeout=5).read().decode()
        values = {
            line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("ister_")
        }
        return (
            values.get("ister_partition_handoffs_total") == PARTITIONS  # b's join moved three before
            and values.get("ister_partition_handoff_redelivered_total") == PARTITIONS // 2
        )

    await until(lambda: asyncio.to_thread(counted), "the departed consumer's messages counted as redelivered")
    # Each handoff is logged just after it is counted (the exporter's thread may scrape in between).
    logged = r"handed off from a to b after [\d.]+ s, 1 redelivered"
    await until(
        lambda: len(re.findall(logged, broker.log_path.read_text(errors="replace"))) == 3,
        lambda: f"three handoffs from a to b logged, each with 1 redelivered:\n{broker.log()}",
    )
    await b_cons.close()
