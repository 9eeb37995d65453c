"""ister.client producers when their topic's owner dies (kill -9) or freezes (SIGSTOP): they never hang. On
a cluster (real etcd, two real brokers) a running producer continues on the new owner within a bound, and a
running consumer follows it there; against a broker that never comes back, sends fail with a clear error
within the client's retry budget."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ister import errors
from ister.client import Client
from ister.core.record import decode_message
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.harness import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LEASE_TTL = 2  # the test cluster's lease: the dead owner's topics are reassigned about this long after
RESUME_BOUND = 15.0  # kill -9 → the running producer's first ack from the new owner
SENDERS = 8


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 2, LEASE_TTL)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


@pytest.mark.parametrize("fault", ["kill9", "pause"])
async def test_running_producer_continues_on_the_new_owner(cluster: Cluster, fault: str) -> None:
    """The owner is killed (connections refused) or paused (SIGSTOP: new connections are accepted by the
    kernel and never answered, the open ones go silent)."""
    topic = f"/default/client_failover_{fault}"
    async with Client(cluster.brokers[0].url) as setup:
        first = await setup.producer(topic)
        await first.send(b"created")
    owner = (await cluster.until(cluster.assignments, "the topic assigned"))[topic]
    leader = await cluster.leader()  # when the owner leads too, a new leader is elected first (slower)
    victim = cluster.process_of(owner)
    survivor = next(b for b in cluster.brokers if b is not victim)

    # Seeds in the worst order: the broker that will die first.
    async with Client([victim.url, survivor.url], connect_timeout=3.0) as client:
        producer = await client.producer(topic, "runner", linger_ms=1)
        consumer = await client.consumer(topic, "all", name="reader", window=5000)
        acked: list[tuple[float, int, bytes]] = []  # (when, offset, payload)
        received: set[bytes] = set()
        counter = iter(range(10**9))
        stop = asyncio.Event()

        async def receiver() -> None:
            while True:
                batch = await consumer.receive_batch(5000, 0.5)
                await consumer.ack_batch(batch)
                received.update(m.payload for m in batch)

        async def sender(i: int) -> None:
            while not stop.is_set():
                payload = b"s%d-%d" % (i, next(counter))
                offset = await producer.send(payload)
                acked.append((time.monotonic(), offset, payload))

        receiving = asyncio.create_task(receiver())
        tasks = [asyncio.create_task(sender(i)) for i in range(SENDERS)]
        try:
            await cluster.until(lambda: len(acked) >= 500 or any(t.done() for t in tasks), "acks before")
            assert not any(t.done() for t in tasks)
            if fault == "kill9":
                victim.kill9()
            else:
                assert victim.proc is not None
                victim.proc.send_signal(signal.SIGSTOP)
            killed_at = time.monotonic()
            # The dead owner assigned no offset at or above its reservation; the new owner starts there.
            record = await cluster.owner_record(topic)
            assert record is not None and record.broker_id == owner
            boundary = record.reserved_until

            def from_new_owner() -> list[tuple[float, int, bytes]]:
                return [a for a in acked if a[1] >= boundary]

            await cluster.until(
                lambda: len(from_new_owner()) >= 500 or any(t.done() for t in tasks),
                "acks from the new owner",
                within=RESUME_BOUND + 30,
            )
            for t in tasks:
                if t.done():
                    t.result()  # a sender that failed: surface its error
            resumed = from_new_owner()[0][0] - killed_at
            role = "owner and leader" if leader == owner else "owner"
            print(f"first ack from the new owner {resumed:.2f} s after the {fault} of the {role}")
            assert resumed < RESUME_BOUND
        except BaseException:
            receiving.cancel()  # a closed consumer's receive_batch returns at once: it would spin for ever
            raise
        finally:
            if fault == "pause" and victim.proc is not None:
                victim.proc.send_signal(signal.SIGCONT)  # fenced: its lease and epoch are gone
            stop.set()
            done, _ = await asyncio.wait(tasks, timeout=60)
            assert len(done) == len(tasks), "senders did not finish"
        for t in tasks:
            t.result()
        assert (await cluster.assignments())[topic] != owner
        # Everything after the kill went to the new owner (acks of the old one came before it died).
        assert all(offset < boundary for when, offset, _ in acked if when < killed_at)

        # Every message the new owner acknowledged is stored under the offset it was acknowledged with.
        late = {offset: payload for _, offset, payload in from_new_owner()}
        read: dict[int, bytes] = {}
        async for batch in client.read(topic, min(late), max(late) + 1):
            read.update((o, decode_message(r).payload) for o, r in batch)
        assert {o: read.get(o) for o in late} == late

        # The consumer found the new owner too: it receives everything the new owner acknowledged.
        try:
            await cluster.until(
                lambda: set(late.values()) <= received or receiving.done(),
                "the consumer received what the new owner acknowledged",
                within=30,
            )
            assert set(late.values()) <= received, receiving.result()
        finally:
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiving


async def test_producer_of_a_dead_broker_fails_within_its_deadline(fresh_broker: BrokerProcess) -> None:
    topic = "/default/dead_broker"
    retry_timeout = 2.0
    connect_timeout = 1.0
    bound = retry_timeout + connect_timeout + 5.0  # the budget, one last attempt, and slack
    client = Client(fresh_broker.url, connect_timeout=connect_timeout, retry_timeout=retry_timeout)
    async with client:
        producer = await client.producer(topic, linger_ms=1)
        assert await producer.send(b"before") == 0
        fresh_broker.kill9()
        loop = asyncio.get_running_loop()
        started = loop.time()
        pending = [producer.send_nowait(b"after-%d" % i) for i in range(100)]
        with pytest.raises(errors.Unavailable, match=topic) as info:
            async with asyncio.timeout(bound):
                await asyncio.gather(*pending)
        elapsed = loop.time() - started
        print(f"pending sends failed {elapsed:.2f} s after the kill: {info.value}")
        assert retry_timeout <= elapsed < bound
        for fut in pending:
            with contextlib.suppress(errors.Unavailable):
                await fut
            assert fut.exception() is not None  # every one failed; none hangs or is dropped silently

        # A new send tries again, and fails the same way within the budget.
        started = loop.time()
        with pytest.raises(errors.Unavailable, match=topic):
            async with asyncio.timeout(bound):
                await producer.send(b"later")
        assert loop.time() - started < bound

        # A new producer on the dead broker fails as clearly within the budget.
        started = loop.time()
        with pytest.raises(errors.Unavailable, match=topic):
            async with asyncio.timeout(bound):
                await client.producer(topic)
        assert loop.time() - started < bound
