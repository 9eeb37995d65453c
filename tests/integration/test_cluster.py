"""Cluster mode with real processes: 3 brokers on a real etcd, the official danube-client as the client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.etcd_server import EtcdServer
from tests.integration.cluster import WAIT, Cluster, lookup
from tests.integration.forkserver import run_ister
from tests.integration.harness import client, consumer, producer

pytestmark = pytest.mark.timeout(240)

FAILOVER_BOUND = 10.0  # the bound from kill -9 to the topic served elsewhere


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 3)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def shared_tier_cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    """Three brokers sharing a file:// durable tier (one machine): reliable topics may move."""
    tier = f"file://{tmp_path / 'objects'}"
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--durable-url", tier)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def assigned(cluster: Cluster, topics: list[str]) -> dict[str, int] | None:
    found = await cluster.assignments()
    return found if all(t in found for t in topics) else None


async def produce_until_accepted(url: str, topic: str, payload: bytes, bound: float) -> float:
    """Seconds until a fresh producer (through `url`) gets `payload` accepted on `topic`."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < bound:
        try:
            c = await client(url)
            p = await producer(c, topic, f"p-{time.monotonic_ns()}", reliable=True)
            await p.send(payload, {})
            return time.monotonic() - start
        except Exception as exc:  # the official client raises its own and grpc errors
            last = exc
            await asyncio.sleep(0.05)
    raise AssertionError(f"{topic} not accepting produce within {bound} s: {last}")


async def test_topics_spread_and_every_broker_answers_lookups(cluster: Cluster) -> None:
    urls = {cluster.broker_id(b): b.url for b in cluster.brokers}
    c = await client(cluster.brokers[0].url)
    topics = [f"/default/spread{i}" for i in range(6)]
    for t in topics:
        p = await producer(c, t, "p", reliable=True)
        await p.send(b"hello", {})
    owners = await cluster.until(lambda: assigned(cluster, topics), "all topics assigned")
    assert sorted(Counter(owners[t] for t in topics).values()) == [2, 2, 2]
    for t in topics:
        for b in cluster.brokers:
            kind, url = await lookup(b.url, t)
            if cluster.broker_id(b) == owners[t]:
                assert (kind, url) == ("connect", b.url)
            else:
                assert (kind, url) == ("redirect", urls[owners[t]])
        record = await cluster.owner_record(t)
        assert record is not None and record.broker_id == owners[t] and record.epoch == 1
    # Consuming through a broker that does not own the topic follows the redirect.
    t = topics[0]
    entry = next(b for b in cluster.brokers if cluster.broker_id(b) != owners[t])
    c2 = await client(entry.url)
    cons, queue = await consumer(c2, t, "c", "s")
    p = await producer(c2, t, "p2", reliable=True)
    await p.send(b"after-subscribe", {})
    msg = await asyncio.wait_for(queue.get(), WAIT)
    assert msg.payload == b"after-subscribe"
    await cons.ack(msg)
    await cons.close()


async def test_kill9_of_a_broker_moves_its_topics(cluster: Cluster) -> None:
    c = await client(cluster.brokers[0].url)
    topics = [f"/default/fo{i}" for i in range(6)]
    for t in topics:
        p = await producer(c, t, "p", reliable=True)
        await p.send(b"before", {})
    owners = await cluster.until(lambda: assigned(cluster, topics), "all topics assigned")
    leader = await cluster.leader()
    victim_id = next(b for b in set(owners.values()) if b != leader)
    victim = cluster.process_of(victim_id)
    moved = [t for t in topics if owners[t] == victim_id]
    before = {t: await cluster.owner_record(t) for t in moved}
    survivor = next(b for b in cluster.brokers if b is not victim)

    victim.kill9()
    for t in moved:
        elapsed = await produce_until_accepted(survivor.url, t, b"after", FAILOVER_BOUND)
        assert elapsed < FAILOVER_BOUND
    after = await cluster.assignments()
    live = await cluster.live()
    assert victim_id not in live
    for t in moved:
        old, new = before[t], await cluster.owner_record(t)
        assert old is not None and new is not None
        assert after[t] in live and after[t] != victim_id and new.broker_id == after[t]
        assert new.epoch == old.epoch + 1
        # The new owner starts past everything the dead owner could have written: no offset reused.
        assert new.loaded_epoch == new.epoch and new.reserved_until > old.reserved_until
    assert all(owner != victim_id for owner in after.values())


async def test_leader_kill_elects_a_new_leader_and_assignment_continues(cluster: Cluster) -> None:
    old = await cluster.until(cluster.leader, "a leader")
    cluster.process_of(old).kill9()

    async def new_leader() -> int | None:
        current = await cluster.leader()
        return current if current not in (None, old) else None

    start = time.monotonic()
    await cluster.until(new_leader, "a new leader", within=FAILOVER_BOUND)
    assert time.monotonic() - start < FAILOVER_BOUND
    survivor = next(b for b in cluster.brokers if b.proc is not None)
    await produce_until_accepted(survivor.url, "/default/after_leader_change", b"x", FAILOVER_BOUND)
    owners = await cluster.assignments()
    assert owners["/default/after_leader_change"] in await cluster.live()


async def topic_off_the_leader(cluster: Cluster, base: str) -> tuple[str, int, int]:
    """Create 3 topics (one per broker by round-robin); return one off the leader, its owner, the leader."""
    c = await client(cluster.brokers[0].url)
    topics = [f"{base}{i}" for i in range(3)]
    for t in topics:
        await producer(c, t, "setup", reliable=True)
    owners = await cluster.until(lambda: assigned(cluster, topics), "assigned")
    leader = await cluster.until(cluster.leader, "a leader")
    topic = next(t for t in topics if owners[t] != leader)
    return topic, owners[topic], leader


async def test_danube_client_keeps_working_across_a_leader_change(cluster: Cluster) -> None:
    topic, owner, leader = await topic_off_the_leader(cluster, "/default/leader_change_clients")
    c = await client(cluster.brokers[0].url)
    p = await producer(c, topic, "p", reliable=True)
    entry = cluster.process_of(owner)
    c2 = await client(entry.url)
    cons, queue = await consumer(c2, topic, "c", "s")
    cluster.process_of(leader).kill9()
    received: list[bytes] = []
    for i in range(20):
        await p.send(f"m{i}".encode(), {})
        msg = await asyncio.wait_for(queue.get(), WAIT)
        received.append(msg.payload)
        await cons.ack(msg)
    assert received == [f"m{i}".encode() for i in range(20)]
    await cons.close()


async def test_stale_owner_is_fenced_after_a_pause(cluster: Cluster) -> None:
    """SIGSTOP the owner past its lease: the topic moves; once resumed the old owner appends nothing."""
    topic, owner, _ = await topic_off_the_leader(cluster, "/default/paused_owner")
    victim = cluster.process_of(owner)
    old_client = await client(victim.url)
    old_producer = await producer(old_client, topic, "old", reliable=True)
    old_consumer, old_queue = await consumer(old_client, topic, "old-c", "s-old")
    await old_producer.send(b"before-pause", {})
    first = await asyncio.wait_for(old_queue.get(), WAIT)
    assert first.payload == b"before-pause"
    await old_consumer.ack(first)
    old = await cluster.owner_record(topic)
    assert victim.proc is not None
    os.kill(victim.proc.pid, signal.SIGSTOP)
    try:

        async def moved() -> bool:
            rec = await cluster.owner_record(topic)
            return rec is not None and old is not None and rec.epoch > old.epoch

        await cluster.until(moved, "the topic reassigned while its owner is paused")
        new_owner = (await cluster.assignments())[topic]
        assert new_owner != owner
        entry = cluster.process_of(new_owner)
        c2 = await client(entry.url)
        cons, queue = await consumer(c2, topic, "c", "s")
    finally:
        os.kill(victim.proc.pid, signal.SIGCONT)
    # Whatever the paused broker's producer manages to send now must land on the new owner.
    sent: list[bytes] = []
    for i in range(5):
        payload = f"after-resume-{i}".encode()
        try:
            await old_producer.send(payload, {})
            sent.append(payload)
        except Exception:
            pass
    assert sent, "the official client should re-route its sends to the new owner"
    got: list[bytes] = []
    while len(got) < len(sent):
        msg = await asyncio.wait_for(queue.get(), WAIT)
        got.append(msg.payload)
        await cons.ack(msg)
    assert got == sent
    # The consumer that was attached to the paused broker gets CLOSE from its health check once that broker
    # has unloaded the topic, subscribes again through a lookup and receives the same messages.
    old_got: list[bytes] = []
    while len(old_got) < len(sent):
        msg = await asyncio.wait_for(old_queue.get(), WAIT)
        old_got.append(msg.payload)
        await old_consumer.ack(msg)
    assert old_got == sent
    await old_consumer.close()
    record = await cluster.owner_record(topic)
    assert record is not None and record.broker_id == new_owner
    assert "revoked" in victim.log()
    await cons.close()


async def test_same_broker_restart_keeps_its_topics_and_messages(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, lease_ttl=15)
    try:
        await cluster.start()
        topic = "/default/restart_keeps"
        c = await client(cluster.brokers[0].url)
        owners_wait = producer(c, topic, "p", reliable=True)
        p = await owners_wait
        owner = (await cluster.until(lambda: assigned(cluster, [topic]), "assigned"))[topic]
        proc = cluster.process_of(owner)
        entry_client = await client(proc.url)
        cons, _ = await consumer(entry_client, topic, "c", "s")
        await cons.close()
        for i in range(5):
            await p.send(f"m{i}".encode(), {})
        before = await cluster.owner_record(topic)
        proc.kill9()
        proc.start()  # same data dir, same address, within the lease TTL
        c2 = await client(proc.url)
        cons2, queue = await consumer(c2, topic, "c", "s")
        got = []
        for _ in range(5):
            msg = await asyncio.wait_for(queue.get(), WAIT)
            got.append((msg.msg_id.topic_offset, msg.payload))
            await cons2.ack(msg)
        assert got == [(i, f"m{i}".encode()) for i in range(5)]
        after = await cluster.owner_record(topic)
        assert before is not None and after is not None
        assert (after.broker_id, after.epoch) == (before.broker_id, before.epoch)
        await cons2.close()
    finally:
        await cluster.stop()


async def test_brokers_recover_from_an_etcd_restart(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    cluster = Cluster(tmp_path, etcd.endpoint, 3)
    try:
        await cluster.start()
        c = await client(cluster.brokers[0].url)
        p = await producer(c, "/default/etcd_restart", "p", reliable=True)
        await p.send(b"before", {})
        admin = cluster.brokers[0].admin_addr
        policy = ["admin", "namespaces", "policies", "default", "-o", "json", "--admin-addr", admin]
        before = json.loads(await cli(policy))
        etcd.stop()
        # A replication setting written while etcd is down fails with the cause, and changes nothing.
        setting = ["namespaces", "set-replication", "default", "--replication-factor", "2"]
        refused = await asyncio.to_thread(run_ister, ["admin", *setting, "--admin-addr", admin], timeout=60)
        assert refused.returncode != 0
        # The broker's answer names etcd (the CLI used to call it "cannot reach the admin API").
        assert "etcd" in refused.stderr and "UNAVAILABLE" in refused.stderr, refused.stderr
        etcd.start()
        # Leases survive an etcd restart; brokers keep their registrations, assignments and leadership.
        await cluster.until(cluster.all_registered, "brokers registered after the etcd restart")
        await cluster.until(cluster.leader, "a leader after the etcd restart")
        survivor = cluster.brokers[1]
        await produce_until_accepted(survivor.url, "/default/etcd_restart", b"after", WAIT)
        await produce_until_accepted(survivor.url, "/default/created_after_etcd_restart", b"new", WAIT)
        owners = await cluster.assignments()
        assert set(owners) >= {"/default/etcd_restart", "/default/created_after_etcd_restart"}
        assert set(owners.values()) <= set(await cluster.live())
        assert json.loads(await cli(policy)) == before
    finally:
        await cluster.stop()
        etcd.stop()


async def cli(args: list[str]) -> str:
    done = await asyncio.to_thread(run_ister, args, timeout=60, check=True)
    return done.stdout


async def test_moving_a_reliable_topic_twice_keeps_offsets_dense_and_clients_working(
    shared_tier_cluster: Cluster,
) -> None:
    """Seed 000 steps 1-5 between brokers: seal, sealed state, next owner at last + 1, cursors continue."""
    cluster = shared_tier_cluster
    topic = "/default/moved_twice"
    c = await client(cluster.brokers[0].url)
    p = await producer(c, topic, "p", reliable=True)
    owners = [(await cluster.until(lambda: assigned(cluster, [topic]), "assigned"))[topic]]
    cons, queue = await consumer(c, topic, "c", "s")
    acked: list[bytes] = []
    received: dict[bytes, int] = {}

    async def produce(count: int) -> None:
        for i in range(count):
            payload = f"m{len(acked) + i}-{time.monotonic_ns()}".encode()
            await p.send(payload, {})
            acked.append(payload)

    async def drain(expected: int) -> None:
        while len(received) < expected:
            msg = await asyncio.wait_for(queue.get(), WAIT)
            received.setdefault(msg.payload, msg.msg_id.topic_offset)
            await cons.ack(msg)

    await produce(30)
    await drain(30)
    for move in range(2):
        before = await cluster.owner_record(topic)
        await cluster.unload(topic)

        async def moved(before: object = before) -> int | None:
            found = (await cluster.assignments()).get(topic)
            return found if found is not None and found != owners[-1] else None

        owners.append(await cluster.until(moved, f"move {move + 1} done"))
        await produce(30)
        await drain(len(acked))
        after = await cluster.owner_record(topic)
        assert before is not None and after is not None and after.epoch == before.epoch + 1
    assert len(set(owners)) >= 2 and owners[1] != owners[0] and owners[2] != owners[1]
    # Every acknowledged message was consumed, and the topic's offsets are 0..N-1 with no gap.
    assert set(acked) <= set(received)
    assert sorted(received.values()) == list(range(len(received)))
    assert await cluster.sealed_state(topic) is None  # consumed by the loading owner
    await cons.close()


async def test_every_broker_reports_its_load(cluster: Cluster) -> None:
    topic = "/default/reported"
    c = await client(cluster.brokers[0].url)
    p = await producer(c, topic, "p", reliable=True)
    owner = (await cluster.until(lambda: assigned(cluster, [topic]), "assigned"))[topic]
    cons, _ = await consumer(c, topic, "c", "s")

    async def busy_report() -> dict[str, object] | None:
        await p.send(b"x" * 100, {})
        report = await cluster.load_report(owner)
        if not report:
            return None
        entry = next((t for t in report["topics"] if t["topic_name"] == topic), None)
        return entry if entry and entry["message_rate"] > 0 else None

    entry = await cluster.until(busy_report, "a load report with the topic's message rate")
    assert entry["producer_count"] == 1 and entry["subscription_count"] == 1
    assert entry["byte_rate"] >= (entry["message_rate"] - 1) * 100  # 100-byte payloads; rates rounded
    for b in cluster.brokers:
        report = await cluster.load_report(cluster.broker_id(b))
        assert report["broker_id"] == cluster.broker_id(b)
        usage = {r["resource"] for r in report["resources_usage"]}
        assert {"CPU", "Memory"} <= usage
    await cons.close()
