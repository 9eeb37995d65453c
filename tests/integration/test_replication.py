"""Replicated reliable topics on real parts (issue 16): three broker processes on etcd, RF 3, min in-sync 2.

No durable tier: after a broker dies, its records are readable only because the other replicas hold them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from ister import errors
from ister.client import Client
from ister.core.record import decode_message
from ister.core.replication import ReplicaRecord
from ister.ids import TopicName
from ister.metadata import keys
from ister.wire.gen import ister_v1_pb2 as ister_pb
from ister.wire.gen import ister_v1_pb2_grpc as ister_pb_grpc
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.forkserver import run_ister
from tests.integration.replication_support import (
    RF_ENV,
    produce,
    read_all,
    replica_record,
    wal_contents,
)
from tests.integration.security_support import make_pki, secret_file, token

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=RF_ENV)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


async def publish(url: str, topic: str, prefix: str, count: int) -> dict[int, bytes]:
    """Acknowledged offsets -> payloads, sent in batches of 100."""
    acked: dict[int, bytes] = {}
    async with Client(url) as ister:
        pub = await ister.producer(topic)
        for start in range(0, count, 100):
            payloads = [f"{prefix}{i}".encode() for i in range(start, min(count, start + 100))]
            offsets = await pub.send_batch(payloads)
            acked.update(zip(offsets, payloads, strict=True))
        await pub.flush()
    return acked


async def test_an_acknowledged_record_survives_its_leaders_death(cluster: Cluster) -> None:
    topic = "/default/replicated_kill"
    entry = cluster.brokers[0]
    acked = await publish(entry.url, topic, "a", 1_000)
    assert sorted(acked) == list(range(1_000))
    record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
    assert len(record.replicas) == 3 and record.min_insync == 2
    leader = record.leader
    assert (await cluster.assignments())[topic] == leader

    # What an operator sees: the replica set, the in-sync set and each follower's lag, on the CLI and in
    # the leader's metrics.
    admin_addr = cluster.process_of(leader).admin_addr
    cli = ["admin", "topics", "describe", topic, "--admin-addr", admin_addr, "-o", "json"]
    done = await asyncio.to_thread(run_ister, cli, check=True, timeout=60)
    described = json.loads(done.stdout)
    assert sorted(described["replicas"]) == sorted(str(b) for b in record.replicas)
    assert sorted(described["in_sync_replicas"]) == sorted(str(b) for b in record.isr)
    assert described["min_insync_replicas"] == 2
    assert set(described["replica_lag"]) == {str(b) for b in record.replicas if b != leader}
    scraped = await asyncio.to_thread(scrape, cluster.process_of(leader).metrics_url)
    assert "ister_replica_lag_messages{" in scraped and "ister_under_min_isr_topics 0.0" in scraped

    # A follower's load report counts its copy (docs/architecture.md §13): with records arriving while it
    # reports (every second here), its follower totals show them; `brokers load` shows the same.
    follower = next(b for b in record.replicas if b != leader)
    async with Client(entry.url) as ister:
        pub = await ister.producer(topic)

        async def follower_load() -> dict[str, Any] | None:
            payloads = [f"l{len(acked) + i}".encode() for i in range(20)]
            acked.update(zip(await pub.send_batch(payloads), payloads, strict=True))
            report = await cluster.load_report(follower)
            busy = report and report.get("followed_topics", 0) >= 1 and report["follower_message_rate"] > 0
            return report if busy and report["follower_byte_rate"] > 0 else None

        loaded = await cluster.until(follower_load, "the follower's load report shows its copy", 30)
        await pub.flush()
    assert all(t["topic_name"] != topic for t in loaded["topics"])  # a copy, not a led topic
    cli = ["admin", "brokers", "load", "--admin-addr", admin_addr, "-o", "json"]
    done = await asyncio.to_thread(run_ister, cli, check=True, timeout=60)
    shown = {int(row["broker_id"]): row for row in json.loads(done.stdout)}  # ids are strings
    assert shown[follower]["followed_topics"] >= 1 and shown[leader]["topics"] >= 1
    assert sorted(acked) == list(range(len(acked)))

    # The followers hold everything acknowledged: kill the leader, and its disk with it.
    victim = cluster.process_of(leader)
    victim.kill9()
    shutil.rmtree(victim.data_dir / "wal", ignore_errors=True)
    started = time.monotonic()

    async def new_leader() -> int | None:
        now = (await cluster.assignments()).get(topic)
        rec = await replica_record(cluster, topic)
        return now if now not in (None, leader) and rec is not None and rec.leader == now else None

    await cluster.until(new_leader, "an in-sync follower leads", 60)
    survivor = next(b for b in cluster.brokers if b is not victim)
    more = await publish(survivor.url, topic, "b", 500)
    failover = time.monotonic() - started
    # Offsets continue densely after the last acknowledged one: no reservation gap.
    end = len(acked) + 500
    assert sorted(more) == list(range(len(acked), end)), sorted(more)[:3]
    got = await read_all(survivor.url, topic, end)
    assert got == {**acked, **more}
    print(f"failover to a follower and 500 more acknowledged: {failover:.2f} s")


async def test_publishes_fail_fast_below_min_insync(cluster: Cluster) -> None:
    topic = "/default/replicated_min_isr"
    entry = cluster.brokers[0]
    acked = await publish(entry.url, topic, "a", 100)
    record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
    followers = [b for b in record.replicas if b != record.leader]
    for f in followers:
        cluster.process_of(f).kill9()

    async def shrunk() -> bool:
        rec = await replica_record(cluster, topic)
        return rec is not None and len(rec.isr) == 2

    # One dead follower leaves; the other cannot (the set would fall below 2) and stalls commits.
    await cluster.until(shrunk, "the in-sync set shrinks to the minimum", 30)
    leader_url = cluster.process_of(record.leader).url
    async with Client(leader_url, retry_timeout=1.0) as ister:
        pub = await ister.producer(topic)
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match="stopped following"):
            await pub.send_batch([b"refused"])
        assert time.monotonic() - started < 10  # fails fast, not at the 30 s publish timeout
    got = await read_all(leader_url, topic, 1_000)
    assert got == acked  # nothing of the refused publish is visible


# Four rounds in the gate (about 6 s each): each case, the killed leader's WAL kept or deleted, twice; rounds
# beyond repeat them (ISTER_REPLICATION_ROUNDS=12 for a longer run).
ROUNDS = int(os.environ.get("ISTER_REPLICATION_ROUNDS", "4"))


async def test_kill_rounds_during_traffic_lose_nothing_acknowledged(cluster: Cluster) -> None:
    """A producer runs while the topic's leader is killed (SIGKILL) round after round, every other round
    with its data directory deleted before it returns: every acknowledged record is read back at its
    offset."""
    topic = "/default/replicated_rounds"
    urls = [b.url for b in cluster.brokers]
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()
    failovers: list[float] = []
    producer_task = asyncio.create_task(produce(urls, topic, acked, stop))
    try:
        await cluster.until(lambda: len(acked) >= 500, "traffic flows")
        for round_ in range(ROUNDS):
            record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
            leader = record.leader
            victim = cluster.process_of(leader)
            before = len(acked)
            victim.kill9()
            if round_ % 2 == 1:
                shutil.rmtree(victim.data_dir / "wal", ignore_errors=True)
            started = time.monotonic()
            await cluster.until(
                lambda b=before: len(acked) >= b + 200, f"round {round_}: traffic resumes", 60
            )
            failovers.append(time.monotonic() - started)
            victim.start()

            async def all_in_sync() -> bool:
                rec = await replica_record(cluster, topic)
                return rec is not None and len(rec.isr) == 3

            await cluster.until(all_in_sync, f"round {round_}: the restarted broker is in sync again", 60)
    finally:
        stop.set()
        await producer_task
    last = max(acked)
    got = await read_all(urls[0], topic, last + 1)
    missing = [o for o in acked if got.get(o) != acked[o]]
    assert not missing, f"{len(missing)} acknowledged offsets lost or changed, first {sorted(missing)[:5]}"
    print(
        f"{ROUNDS} rounds, {len(acked)} acknowledged, none lost; time to the next acknowledgement "
        f"after a kill: median {sorted(failovers)[len(failovers) // 2]:.2f} s, max {max(failovers):.2f} s"
    )


LIVENESS_ROUNDS = int(os.environ.get("ISTER_LIVENESS_ROUNDS", "3"))


async def test_a_follower_restarted_just_before_its_leader_dies_follows_the_next_leader(
    cluster: Cluster,
) -> None:
    """Issue 39's liveness defect: a follower restarted and counted in sync again, then its leader killed at
    once. It must follow the new leader (before the fix it could hang in its stream to the dead one, and
    the new leader, unable to drop it below min_insync_replicas 2, refused every publish). Each round
    writes resume within the failover bound and the set is whole again once the old leader returns."""
    topic = "/default/replicated_liveness"
    urls = [b.url for b in cluster.brokers]
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()
    producer_task = asyncio.create_task(produce(urls, topic, acked, stop))

    async def all_in_sync() -> bool:
        rec = await replica_record(cluster, topic)
        return rec is not None and len(rec.isr) == 3 and rec.leader >= 0

    try:
        await cluster.until(lambda: len(acked) >= 500, "traffic flows")
        for round_ in range(LIVENESS_ROUNDS):
            await cluster.until(all_in_sync, f"round {round_}: all in sync", 60)
            record = await replica_record(cluster, topic)
            assert record is not None
            follower = cluster.process_of(next(b for b in record.replicas if b != record.leader))
            follower.kill9()
            follower.start()
            await cluster.until(all_in_sync, f"round {round_}: the restarted follower in sync", 60)
            record = await replica_record(cluster, topic)
            assert record is not None
            leader = cluster.process_of(record.leader)
            before = len(acked)
            leader.kill9()
            await cluster.until(
                lambda b=before: len(acked) >= b + 200, f"round {round_}: writes resume after the kill", 30
            )
            leader.start()
    finally:
        stop.set()
        await producer_task
    got = await read_all(urls[0], topic, max(acked) + 1)
    missing = [o for o in acked if got.get(o) != acked[o]]
    assert not missing, f"{len(missing)} acknowledged offsets lost or changed, first {sorted(missing)[:5]}"


async def test_a_leader_paused_past_its_lease_acknowledges_nothing_after_its_epoch(cluster: Cluster) -> None:
    topic = "/default/replicated_paused"
    urls = [b.url for b in cluster.brokers]
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()
    producer_task = asyncio.create_task(produce(urls, topic, acked, stop))
    try:
        await cluster.until(lambda: len(acked) >= 500, "traffic flows")
        record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
        paused = cluster.process_of(record.leader)
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)
        try:

            async def replaced() -> bool:
                rec = await replica_record(cluster, topic)
                return rec is not None and rec.leader != record.leader and rec.epoch > record.epoch

            await cluster.until(replaced, "another replica leads", 60)
            before = len(acked)
            await cluster.until(lambda: len(acked) >= before + 200, "traffic resumes on the new leader", 60)
        finally:
            paused.proc.send_signal(signal.SIGCONT)
        before = len(acked)
        await cluster.until(lambda: len(acked) >= before + 500, "traffic continues after the resume", 60)
    finally:
        stop.set()
        await producer_task
    got = await read_all(urls[0], topic, max(acked) + 1)
    changed = [o for o in acked if got.get(o) != acked[o]]
    assert not changed, f"acknowledged offsets lost or bound to another payload: {sorted(changed)[:5]}"


async def test_an_old_leaders_uncommitted_suffix_is_cut_when_it_returns(cluster: Cluster) -> None:
    """The leader appends records its followers never get (both dead), then dies too. A follower leads and
    reuses those offsets for other records; the old leader returns with its disk, follows, and its copy is
    cut where it diverges: afterwards no offset holds two payloads on any replica."""
    topic = "/default/replicated_diverge"
    entry = cluster.brokers[0]
    acked = await publish(entry.url, topic, "a", 200)
    record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
    old = cluster.process_of(record.leader)
    followers = [cluster.process_of(b) for b in record.replicas if b != record.leader]
    for f in followers:
        f.kill9()
    async with Client(old.url, retry_timeout=0.5) as ister:
        pub = await ister.producer(topic)
        with pytest.raises(errors.IsterError):
            await pub.send_batch([b"never-acknowledged"] * 50)  # appended on the old leader only
    old.kill9()
    for f in followers:
        f.start()

    async def led_by_a_follower() -> bool:
        rec = await replica_record(cluster, topic)
        return rec is not None and rec.leader != record.leader and rec.epoch > record.epoch

    await cluster.until(led_by_a_follower, "a former follower leads", 60)
    more = await publish(followers[0].url, topic, "b", 100)
    assert min(more) == 200  # the offsets the old leader used for its unacknowledged records
    old.start()

    async def all_in_sync() -> bool:
        rec = await replica_record(cluster, topic)
        return rec is not None and len(rec.isr) == 3

    await cluster.until(all_in_sync, "the old leader follows and is in sync again", 60)
    assert "cutting the local copy at 200" in old.log()
    old.stop()
    copy = await wal_contents(old.data_dir, topic)
    expected = {**acked, **more}
    assert {o: copy[o] for o in expected} == expected
    assert b"never-acknowledged" not in copy.values()


async def test_a_move_is_a_leadership_transfer_to_an_in_sync_replica(cluster: Cluster) -> None:
    """Without a durable tier a single-copy topic holding records cannot move; a replicated one moves to an
    in-sync follower, which continues its own copy."""
    topic = "/default/replicated_move"
    entry = cluster.brokers[0]
    acked = await publish(entry.url, topic, "a", 300)
    record = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
    for move in range(2):
        before = await cluster.until(lambda: replica_record(cluster, topic), "a replica record")
        await cluster.unload(topic)

        async def moved(b: ReplicaRecord = before) -> ReplicaRecord | None:
            rec = await replica_record(cluster, topic)
            owner = (await cluster.assignments()).get(topic)
            if rec is None or rec.epoch <= b.epoch or owner != rec.leader:
                return None
            return rec

        after = await cluster.until(moved, f"move {move + 1}", 60)
        assert after.leader != before.leader and after.leader in before.isr
        acked.update(await publish(entry.url, topic, f"m{move}-", 100))
    assert sorted(acked) == list(range(500))  # dense across both transfers
    assert await read_all(entry.url, topic, 500) == acked
    assert record.replicas == after.replicas  # the same three copies, only the leader changed


async def test_a_dead_replica_is_replaced_by_a_new_follower_that_catches_up(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    env = {**RF_ENV, "ISTER_CLUSTER__REPLICA_REPLACE_AFTER_SECONDS": "2"}
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=env)
    try:
        await four.start(3)
        topic = "/default/replicated_replace"
        acked = await publish(four.brokers[0].url, topic, "a", 500)
        record = await four.until(lambda: replica_record(four, topic), "a replica record")
        await four.start_more()
        newcomer = four.broker_id(four.brokers[3])
        assert newcomer not in record.replicas
        dead = next(b for b in record.replicas if b != record.leader)
        four.process_of(dead).kill9()

        async def replaced() -> ReplicaRecord | None:
            rec = await replica_record(four, topic)
            done = rec is not None and dead not in rec.replicas and newcomer in rec.isr
            return rec if done else None

        after = await four.until(replaced, "the dead replica replaced and the new one in sync", 60)
        assert sorted(after.replicas) == sorted([*(b for b in record.replicas if b != dead), newcomer])
        assert sorted(after.isr) == sorted(after.replicas)
        acked.update(await publish(four.process_of(after.leader).url, topic, "b", 100))
        # The replaced broker comes back: it is no longer a replica, so its copy goes.
        returned = four.process_of(dead)
        returned.start()
        name = TopicName.parse(topic)
        copy_dir = returned.data_dir / "wal" / name.namespace / name.topic
        await four.until(lambda: not copy_dir.exists(), "the replaced broker drops its copy", 60)
        four.brokers[3].stop()
        copy = await wal_contents(four.brokers[3].data_dir, topic)
        assert {o: copy.get(o) for o in acked if o < 500} == {o: p for o, p in acked.items() if o < 500}
    finally:
        await four.stop()


async def test_a_dead_replica_is_replaced_while_its_topics_leader_keeps_dying(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """Issue 39: the replacement clock lives in metadata (`/ister/absent-brokers/`), so a dead replica is
    replaced on time although no leader of its topic lives as long as the wait: here the topic's leader is
    killed (and restarted) every 8 s, the wait is 12 s. Before, each new leader started its own clock and
    the replica was never replaced while the kills went on."""
    replace_after = 12.0
    env = {**RF_ENV, "ISTER_CLUSTER__REPLICA_REPLACE_AFTER_SECONDS": str(int(replace_after))}
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=env)
    try:
        await four.start()
        topic = "/default/replicated_replace_churn"
        acked = await publish(four.brokers[0].url, topic, "a", 300)
        record = await four.until(lambda: replica_record(four, topic), "a replica record")
        dead = next(b for b in record.replicas if b != record.leader)
        four.process_of(dead).kill9()
        died = time.monotonic()

        async def replaced() -> ReplicaRecord | None:
            rec = await replica_record(four, topic)
            done = rec is not None and dead not in rec.replicas and len(rec.isr) == 3 and rec.leader >= 0
            return rec if done else None

        kills = 0
        while (after := await replaced()) is None:
            assert time.monotonic() - died < replace_after + 60, f"not replaced; {kills} leader kills"
            rec = await replica_record(four, topic)
            if rec is not None and rec.leader >= 0 and rec.leader != dead:
                leader = four.process_of(rec.leader)
                leader.kill9()
                leader.start()
                kills += 1
            with contextlib.suppress(AssertionError):  # not replaced within 8 s: the next kill is due
                await four.until(replaced, "the replacement", 8)
        took = time.monotonic() - died
        print(f"replaced {took:.1f} s after the death, through {kills} kills of the topic's leader")
        assert kills >= 2  # no single leader lived through the whole wait
        acked.update(await publish(four.process_of(after.leader).url, topic, "b", 100))
        got = await read_all(four.process_of(after.leader).url, topic, max(acked) + 1)
        assert {o: got.get(o) for o in acked} == acked
    finally:
        await four.stop()


async def test_a_topic_whose_in_sync_replicas_are_all_gone_is_said_and_comes_back_with_one(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """Issue 39: when every in-sync replica's broker is gone the topic cannot fail over; the cluster leader
    says so in its log and in `ister_topics_without_live_isr`, `topics describe` says "no live in-sync
    replica", and the topic serves again (nothing acknowledged lost) once one of them returns."""
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=RF_ENV)
    try:
        await four.start(3)
        topic = "/default/replicated_stranded"
        acked = await publish(four.brokers[0].url, topic, "a", 200)
        record = await four.until(lambda: replica_record(four, topic), "a replica record")
        await four.start_more()
        spare = four.brokers[3]
        assert four.broker_id(spare) not in record.replicas
        for b in record.replicas:
            four.process_of(b).kill9()

        def described() -> dict[str, Any]:
            out = run_ister(
                ["admin", "topics", "describe", topic, "-o", "json", "--admin-addr", spare.admin_addr],
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            return dict(json.loads(out.stdout))

        await four.until(
            lambda: "ister_topics_without_live_isr 1.0" in scrape(spare.metrics_url), "the gauge says it", 30
        )
        info = described()
        assert info["replication_state"] == "no live in-sync replica"
        log_text = spare.log_path.read_text()
        assert f"{topic}: no live in-sync replica" in log_text
        # In-sync replicas return with their disks: the topic fails over to one and, with two of them
        # (min_insync_replicas), takes writes again.
        back = four.process_of(record.leader)
        back.start()
        four.process_of(next(b for b in record.replicas if b != record.leader)).start()
        await four.until(
            lambda: "ister_topics_without_live_isr 0.0" in scrape(spare.metrics_url), "the gauge clears", 30
        )
        acked.update(await publish(back.url, topic, "b", 100))
        got = await read_all(back.url, topic, max(acked) + 1)
        assert {o: got.get(o) for o in acked} == acked
        assert described()["replication_state"] != "no live in-sync replica"
    finally:
        await four.stop()


async def test_an_unclean_recovery_restarts_on_the_surviving_copy_and_says_what_is_gone(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """Issue 39: a follower frozen out of the in-sync set, then both in-sync replicas killed for good. The
    topic has no live in-sync replica; `topics recover` refuses without --accept-data-loss (saying what it
    would do), then restarts the topic on the frozen follower's copy: every acknowledged offset it does
    not hold lies in the range it reports as gone, and new offsets never reuse one handed out before."""
    env = {**RF_ENV, "ISTER_CLUSTER__REPLICA_REPLACE_AFTER_SECONDS": "2"}
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=env)
    try:
        await four.start(3)
        topic = "/default/replicated_unclean"
        acked = await publish(four.brokers[0].url, topic, "a", 300)
        record = await four.until(lambda: replica_record(four, topic), "a replica record")
        await four.start_more()
        spare = four.brokers[3]
        frozen_id = next(b for b in record.replicas if b != record.leader)
        frozen = four.process_of(frozen_id)
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        try:

            async def frozen_out() -> bool:
                rec = await replica_record(four, topic)
                return rec is not None and frozen_id not in rec.isr

            await four.until(frozen_out, "the frozen follower leaves the in-sync set", 30)
            acked.update(await publish(four.process_of(record.leader).url, topic, "b", 300))
            for b in record.replicas:
                if b != frozen_id:
                    four.process_of(b).kill9()
        finally:
            frozen.proc.send_signal(signal.SIGCONT)

        def recover(*extra: str) -> subprocess.CompletedProcess[str]:
            return run_ister(
                ["admin", "topics", "recover", topic, "--admin-addr", spare.admin_addr, *extra], timeout=90
            )

        def stranded() -> bool:
            out = run_ister(
                ["admin", "topics", "describe", topic, "-o", "json", "--admin-addr", spare.admin_addr],
                timeout=30,
            )
            return (
                out.returncode == 0
                and json.loads(out.stdout)["replication_state"] == "no live in-sync replica"
            )

        await four.until(stranded, "the topic is without a live in-sync replica", 30)
        refused = recover()
        assert refused.returncode != 0 and "accept-data-loss" in refused.stderr, refused.stderr
        assert f"restart it on broker {frozen_id}" in refused.stderr
        assert (await replica_record(four, topic)) is not None
        done = recover("--accept-data-loss", "-o", "json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["leader"] == str(frozen_id)
        kept, resume = report["kept_end"], report["resume_at"]
        assert kept <= resume and resume >= max(acked) + 1  # nothing handed out before is reused
        # The replacement (2 s) adds the spare as a follower; with it the topic takes writes again.
        more = await publish(frozen.url, topic, "c", 100)
        assert min(more) >= resume
        got = await read_all(frozen.url, topic, max(more) + 1)
        missing = sorted(o for o in acked if got.get(o) != acked[o])
        assert all(kept <= o < resume for o in missing), f"lost outside the reported range: {missing[:5]}"
        assert all(o < kept for o in acked if o not in missing)
        assert {o: got.get(o) for o in more} == more
        print(
            f"recovered on broker {frozen_id}: kept below {kept}, {len(missing)} acknowledged gone, "
            f"new from {resume}"
        )
    finally:
        await four.stop()


async def test_drain_moves_leaderships_and_replicas_away(tmp_path: Path, etcd_server: EtcdServer) -> None:
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=RF_ENV)
    try:
        await four.start(3)
        topic = "/default/replicated_drain"
        acked = await publish(four.brokers[0].url, topic, "a", 300)
        record = await four.until(lambda: replica_record(four, topic), "a replica record")
        await four.start_more()
        drained = record.leader  # it leads and holds a copy: both must move
        cli = ["admin", "brokers", "drain", str(drained), "--admin-addr", four.brokers[3].admin_addr]
        await asyncio.to_thread(run_ister, cli, check=True, timeout=60)

        seen: list[object] = []

        async def moved_away() -> ReplicaRecord | None:
            rec = await replica_record(four, topic)
            owner = (await four.assignments()).get(topic)
            assert four.store is not None
            failed = await four.store.get(keys.move_failure(topic))
            seen[:] = [rec, owner, failed.value if failed is not None else None]
            done = rec is not None and drained not in rec.replicas and owner == rec.leader
            return rec if done and sorted(rec.isr) == sorted(rec.replicas) else None

        def state() -> str:
            # This wait timed out twice in full-suite runs (sessions 9 and 13) and never alone: the brokers'
            # log lines about the drain and the topic go into the failure so that its cause is on record.
            lines = [
                f"broker {four.broker_id(b)}: {line}"
                for b in four.brokers
                for line in b.log_path.read_text(errors="replace").splitlines()
                if "replicated_drain" in line or "drain" in line or "ERROR" in line
            ]
            return (
                f"leadership and copy moved off the drained broker (record, owner, move failure: {seen}); "
                f"drained broker {drained}; their logs:\n" + "\n".join(lines[-60:])
            )

        after = await four.until(moved_away, state, 60)
        assert len(after.replicas) == 3

        async def idle_report() -> bool:
            report = await four.load_report(drained)
            return bool(report) and not report["topics"] and report.get("followed_topics") == 0

        # Its load report shows it: no led topic, no follower copy left.
        await four.until(idle_report, "the drained broker reports neither topics nor copies", 30)
        url = four.process_of(after.leader).url
        acked.update(await publish(url, topic, "b", 100))
        assert await read_all(url, topic, 400) == acked
    finally:
        await four.stop()


async def test_copies_go_to_different_zones(tmp_path: Path, etcd_server: EtcdServer) -> None:
    env = {**RF_ENV, "ISTER_CLUSTER__REPLICATION_FACTOR": "2", "ISTER_CLUSTER__MIN_INSYNC_REPLICAS": "1"}
    four = Cluster(tmp_path, etcd_server.endpoint, 4, 2, env=env)
    zone_of = {}
    for i, b in enumerate(four.brokers):
        b.extra = [*b.extra, "--zone", "east" if i < 2 else "west"]
    try:
        await four.start()
        for i, b in enumerate(four.brokers):
            zone_of[four.broker_id(b)] = "east" if i < 2 else "west"
        for t in range(6):
            topic = f"/default/replicated_zones_{t}"
            await publish(four.brokers[t % 4].url, topic, "z", 10)
            rec = await four.until(lambda t=topic: replica_record(four, t), "a replica record")
            assert len(rec.replicas) == 2
            assert {zone_of[b] for b in rec.replicas} == {"east", "west"}, rec
    finally:
        await four.stop()


async def test_replication_between_brokers_with_tls_and_authentication_on(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """Every port TLS, JWT authentication with default-deny RBAC: brokers replicate with the cluster's peer
    credentials; a client's token, even a superuser's, cannot open a replica stream."""
    pki = make_pki(tmp_path / "pki")
    secure = Cluster(
        tmp_path,
        etcd_server.endpoint,
        3,
        2,
        *("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
        *("--auth-jwt-secret-file", str(secret_file(tmp_path)), "--superuser", "app"),
        env={**RF_ENV, "ISTER_SECURITY__TLS__PEER_CA_FILE": str(pki.ca_file)},
    )
    try:
        await secure.start()
        topic = "/default/replicated_secure"
        jwt = token("app")
        urls = [f"https://127.0.0.1:{b.port}" for b in secure.brokers]
        acked: dict[int, bytes] = {}
        async with Client(urls, token=jwt, tls_ca=str(pki.ca_file)) as ister:
            pub = await ister.producer(topic)
            offsets = await pub.send_batch([f"s{i}".encode() for i in range(200)])
            acked.update((o, f"s{i}".encode()) for i, o in enumerate(offsets))
        record = await secure.until(lambda: replica_record(secure, topic), "a replica record")
        assert sorted(record.isr) == sorted(record.replicas) and len(record.replicas) == 3

        creds = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(pki.ca_file.read_bytes()), grpc.access_token_call_credentials(jwt)
        )
        leader = secure.process_of(record.leader)
        async with grpc.aio.secure_channel(f"127.0.0.1:{leader.port}", creds) as ch:
            call = ister_pb_grpc.IsterReplicaStub(ch).Replicate()
            await call.write(
                ister_pb.ReplicaUp(
                    open=ister_pb.ReplicaFetchRequest(topic=topic, follower=record.replicas[1])
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

        leader.kill9()

        async def new_leader() -> ReplicaRecord | None:
            rec = await replica_record(secure, topic)
            return rec if rec is not None and rec.leader != record.leader else None

        await secure.until(new_leader, "a follower leads", 60)
        got: dict[int, bytes] = {}

        async def read_back() -> bool:
            # A read stops at what the new leader shows now: until its in-sync set holds its epoch's start,
            # that may be less than everything (clients now find the new leader within a second).
            async with Client(urls, token=jwt, tls_ca=str(pki.ca_file)) as ister:
                async for batch in ister.read(topic, 0, 200):
                    got.update((o, decode_message(r).payload) for o, r in batch)
            return len(got) >= len(acked)

        await secure.until(read_back, "the acknowledged records readable on the new leader", 60)
        assert got == acked
    finally:
        await secure.stop()


async def test_followers_keep_only_what_the_durable_tier_lacks(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """With a durable tier a follower's copy drops the segments the tier holds, as the leader's WAL does;
    promoted, it reads them back from the tier."""
    tier = tmp_path / "objects"
    config = tmp_path / "ister.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 64 * 1024},
                "storage": {
                    "durable": {
                        "url": tier.as_uri(),
                        "export_interval_seconds": 0.3,
                        "segment_max_age_seconds": 0.5,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    }
                },
            }
        )
    )
    tiered = Cluster(tmp_path, etcd_server.endpoint, 3, 2, "--config-file", str(config), env=RF_ENV)
    try:
        await tiered.start()
        topic = "/default/replicated_tiered"
        acked = await publish(tiered.brokers[0].url, topic, "t" * 200, 3_000)  # ~700 KB: several segments
        record = await tiered.until(lambda: replica_record(tiered, topic), "a replica record")
        name = TopicName.parse(topic)
        follower = tiered.process_of(next(b for b in record.replicas if b != record.leader))
        copy = follower.data_dir / "wal" / name.namespace / name.topic

        def segment_files() -> int:
            return len(list(copy.glob("*.wal")))

        await tiered.until(lambda: segment_files() <= 2, "the follower drops exported segments", 60)
        tiered.process_of(record.leader).kill9()

        async def led_elsewhere() -> bool:
            rec = await replica_record(tiered, topic)
            return rec is not None and rec.leader != record.leader

        await tiered.until(led_elsewhere, "a follower leads", 60)
        survivor = next(b for b in tiered.brokers if b.proc is not None)

        async def everything_served() -> bool:
            # the new leader makes its tail visible once it is committed on its own in-sync set again
            return await read_all(survivor.url, topic, 3_000) == acked  # the early ones from the tier

        await tiered.until(everything_served, "every acknowledged record served by the new leader", 60)
    finally:
        await tiered.stop()
