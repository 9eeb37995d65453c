"""Issue 13: acknowledged messages survive moves, failovers and object-store faults in cluster mode.

Real parts throughout: etcd, SeaweedFS (S3), `ister broker --mode cluster` processes, danube-client
producers and consumers, and the `ister admin` command line. Each case follows the same story: a consumer
subscribes first and starts receiving only after the event; 500 messages are acknowledged before the event
and 500 after it; the consumer must get every acknowledged message that still exists anywhere.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import danube
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ister.storage.objects import list_descriptors
from tests.etcd_server import EtcdServer
from tests.integration.cluster import WAIT, Cluster
from tests.integration.forkserver import run_ister
from tests.integration.harness import client, producer
from tests.seaweed_server import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
N = 500  # messages acknowledged before the event, and again after it


def tier_config(path: Path, s3: SeaweedServer, *, export_tail: bool) -> Path:
    """A durable tier on `s3`. export_tail=False: nothing rotates by age, so the tail of a topic with few
    messages stays unexported on its owner (the case a failover must not lose)."""
    path.write_text(
        yaml.safe_dump(
            {
                "wal": {"segment_max_bytes": 16 * 1024},
                "storage": {
                    "durable": {
                        "url": f"{s3.url}/{uuid.uuid4().hex[:8]}",
                        "options": s3.options(),
                        "export_interval_seconds": 0.3,
                        "segment_max_age_seconds": 0.5 if export_tail else 3600,
                        "local_retention_bytes": 0,
                        "local_retention_seconds": 0,
                    }
                },
            }
        )
    )
    return path


def admin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`ister admin ARGS` against the first broker, as an operator runs it."""
    return run_ister(["admin", *args, "--admin-addr", cluster.brokers[0].admin_addr], timeout=120)


def admin_unload(cluster: Cluster, topic: str) -> subprocess.CompletedProcess[str]:
    return admin(cluster, "topics", "unload", topic)


def skipped_metric(url: str, topic: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ister_offsets_skipped_total" and s.labels.get("topic") == topic:
                return float(s.value)
    return 0.0


async def send(p: danube.Producer, prefix: str, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        payload = f"{prefix}{i}".encode()
        await p.send(payload, {})
        out.append(payload)
    return out


async def subscribe(url: str, topic: str) -> danube.Consumer:
    """A consumer that subscribes now and receives later (its subscription's cursor starts here)."""
    c = await client(url)
    b = c.new_consumer().with_topic(topic).with_consumer_name("app").with_subscription("app-sub")
    cons = b.with_subscription_type(danube.SubType.EXCLUSIVE).build()
    await cons.subscribe()
    return cons


async def receive_all(url: str, topic: str, want: set[bytes], within: float = 60.0) -> dict[bytes, int]:
    """The application restarted after the event (as danube-client users must): a new consumer of the same
    subscription receives and acks until it has `want`, or fails naming how many it got."""
    cons = await subscribe(url, topic)
    queue = await cons.receive()
    got: dict[bytes, int] = {}
    deadline = time.monotonic() + within
    while not want <= set(got):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(want - set(got))
            raise AssertionError(f"received {len(got)} messages, {len(missing)} missing: {missing[:5]}")
        try:
            msg = await asyncio.wait_for(queue.get(), remaining)
        except TimeoutError:
            continue
        got.setdefault(msg.payload, msg.msg_id.topic_offset)
        await cons.ack(msg)
    return got


async def before_the_event(cluster: Cluster, topic: str) -> tuple[danube.Producer, list[bytes], int]:
    """Start the cluster, subscribe the application first, then acknowledge N messages: (producer, the
    acknowledged payloads, the topic's owner)."""
    await cluster.start()
    url = cluster.brokers[0].url
    p = await producer(await client(url), topic, "p", reliable=True)
    await subscribe(url, topic)
    acked = await send(p, "a", N)
    owner = await owner_of(cluster, topic)
    assert owner is not None
    return p, acked, owner


async def owner_of(cluster: Cluster, topic: str) -> int | None:
    return (await cluster.assignments()).get(topic)


@pytest.fixture
def store_down_s3(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A SeaweedFS of this test alone: it is stopped and started again."""
    s3 = SeaweedServer(tmp_path / "s3-own")
    s3.start()
    yield s3
    s3.stop()


async def test_no_durable_tier_refuses_the_move_and_keeps_serving(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2)
    try:
        topic = "/default/notier"
        url = cluster.brokers[0].url
        p, acked, owner = await before_the_event(cluster, topic)

        result = admin_unload(cluster, topic)
        assert result.returncode != 0
        assert "no durable tier" in result.stderr and "stays on this broker" in result.stderr, result.stderr
        assert await owner_of(cluster, topic) == owner  # still served where it was
        log = cluster.process_of(owner).log()
        assert "cluster mode without a durable tier" in log  # said once, plainly, at start
        report = await cluster.load_report(owner)
        assert report["durable_tier"] is False

        acked += await send(p, "b", N)
        got = await receive_all(url, topic, set(acked))
        assert sorted(got.values()) == list(range(2 * N))
    finally:
        await cluster.stop()


async def test_store_down_during_unload_keeps_the_topic_then_moves_it(
    tmp_path: Path, etcd_server: EtcdServer, store_down_s3: SeaweedServer
) -> None:
    s3 = store_down_s3
    config = tier_config(tmp_path / "ister.yml", s3, export_tail=False)
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--config-file", str(config))
    try:
        topic = "/default/storedown"
        url = cluster.brokers[0].url
        p, acked, owner = await before_the_event(cluster, topic)

        s3.stop()
        started = time.monotonic()
        result = admin_unload(cluster, topic)
        refused_after = time.monotonic() - started
        assert result.returncode != 0
        assert "exporting its last records to the durable tier failed" in result.stderr, result.stderr
        assert await owner_of(cluster, topic) == owner
        acked += await send(p, "b", N)  # the same producer goes on: the topic never left

        s3.start()
        result = admin_unload(cluster, topic)
        assert result.returncode == 0, result.stderr
        new_owner = await cluster.until(
            lambda: _moved(cluster, topic, owner), "the topic on its new owner", WAIT
        )
        assert new_owner != owner
        got = await receive_all(url, topic, set(acked))
        assert sorted(got.values()) == list(range(2 * N))
        print(f"store down: refused after {refused_after:.1f} s; moved after the store returned")
    finally:
        await cluster.stop()


async def _moved(cluster: Cluster, topic: str, old: int | None) -> int | None:
    now = await owner_of(cluster, topic)
    return now if now is not None and now != old else None


async def test_s3_from_environment_only_moves_everything(
    tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer
) -> None:
    env = {
        "ISTER_STORAGE__DURABLE__URL": f"{seaweed.url}/{uuid.uuid4().hex[:8]}",
        "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "3600",
        "AWS_ENDPOINT": seaweed.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
    }
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, env=env)
    try:
        topic = "/default/envs3"
        url = cluster.brokers[0].url
        _, acked, owner = await before_the_event(cluster, topic)
        result = admin_unload(cluster, topic)
        assert result.returncode == 0, result.stderr
        await cluster.until(lambda: _moved(cluster, topic, owner), "the topic on its new owner", WAIT)
        p2 = await producer(await client(url), topic, "p2", reliable=True)
        acked += await send(p2, "b", N)
        got = await receive_all(url, topic, set(acked))
        assert sorted(got.values()) == list(range(2 * N))
    finally:
        await cluster.stop()


async def test_owner_killed_and_restarted_gives_back_its_tail(
    tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer
) -> None:
    config = tier_config(tmp_path / "ister.yml", seaweed, export_tail=False)
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--config-file", str(config))
    try:
        topic = "/default/killed"
        _, acked, owner = await before_the_event(cluster, topic)
        dead = cluster.process_of(owner)
        dead.kill9()
        killed = time.monotonic()
        survivor = next(b for b in cluster.brokers if b is not dead)
        await cluster.until(lambda: _moved(cluster, topic, owner), "failover to the survivor", WAIT)
        p2 = await producer(await client(survivor.url), topic, "p2", reliable=True)
        acked += await send(p2, "b", N)
        served_again = time.monotonic() - killed

        dead.start()  # on its intact disk: it must give back the records only it has
        returned = time.monotonic()
        assert cluster.store is not None
        await cluster.until(
            lambda: _covered(cluster, topic, 0, N - 1), "the returned broker's tail in the tier", WAIT
        )
        given_back = time.monotonic() - returned
        await cluster.until(
            lambda: not list((dead.data_dir / "wal-stale").rglob("*.wal")), "stale WAL deleted"
        )
        got = await receive_all(survivor.url, topic, set(acked))
        assert len(got) == 2 * N
        assert sorted(got.values())[:N] == list(range(N))
        print(
            f"killed owner: served again after {served_again:.1f} s, "
            f"tail given back {given_back:.1f} s after its return"
        )
    finally:
        await cluster.stop()


async def _covered(cluster: Cluster, topic: str, first: int, last: int) -> bool:
    assert cluster.store is not None
    at = first
    for d in await list_descriptors(cluster.store, topic):
        if d.start_offset <= at <= d.end_offset:
            at = d.end_offset + 1
    return at > last


async def test_owner_killed_with_its_disk_skips_only_what_is_gone(
    tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer
) -> None:
    config = tier_config(tmp_path / "ister.yml", seaweed, export_tail=False)
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--config-file", str(config))
    try:
        await cluster.start()
        topic = "/default/diskgone"
        url0 = cluster.brokers[0].url
        c = await client(url0)
        p = await producer(c, topic, "p", reliable=True)
        await subscribe(url0, topic)
        # ~100-byte records: 16 KiB segments close every ~150 messages and are exported; the last is not.
        acked = [await _send_one(p, f"a{i:0100d}".encode()) for i in range(N)]
        assert cluster.store is not None
        await cluster.until(lambda: _covered(cluster, topic, 0, 199), "closed segments exported", WAIT)
        owner = await owner_of(cluster, topic)
        assert owner is not None
        dead = cluster.process_of(owner)
        dead.kill9()
        shutil.rmtree(dead.data_dir)
        # What the tier holds once the owner is dead (its exporter may have run until the kill).
        exported = {
            o
            for d in await list_descriptors(cluster.store, topic)
            for o in range(d.start_offset, d.end_offset + 1)
        }
        assert 0 < len(exported) < N
        survivor = next(b for b in cluster.brokers if b is not dead)
        await cluster.until(lambda: _moved(cluster, topic, owner), "failover to the survivor", WAIT)
        p2 = await producer(await client(survivor.url), topic, "p2", reliable=True)
        after = await send(p2, "b", N)
        want = {acked[o] for o in exported} | set(after)
        got = await receive_all(survivor.url, topic, want)
        assert set(got) == want  # exactly what still exists, and what came after
        skipped = skipped_metric(survivor.metrics_url, topic)
        assert skipped >= N - len(exported)  # the lost tail is counted (with the unused reservation)
        print(
            f"disk gone: {len(exported)} exported received, {N - len(exported)} lost, {skipped:.0f} skipped"
        )
    finally:
        await cluster.stop()


async def _send_one(p: danube.Producer, payload: bytes) -> bytes:
    await p.send(payload, {})
    return payload


async def test_owner_paused_past_its_lease_gives_back_its_tail(
    tmp_path: Path, etcd_server: EtcdServer, seaweed: SeaweedServer
) -> None:
    config = tier_config(tmp_path / "ister.yml", seaweed, export_tail=False)
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2, 2, "--config-file", str(config))
    try:
        topic = "/default/paused"
        _, acked, owner = await before_the_event(cluster, topic)
        paused = cluster.process_of(owner)
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)
        try:
            await cluster.until(lambda: _moved(cluster, topic, owner), "failover away from the paused", WAIT)
            survivor = next(b for b in cluster.brokers if b is not paused)
            p2 = await producer(await client(survivor.url), topic, "p2", reliable=True)
            acked += await send(p2, "b", N)
        finally:
            paused.proc.send_signal(signal.SIGCONT)
        await cluster.until(
            lambda: _covered(cluster, topic, 0, N - 1), "the paused broker's tail in the tier", WAIT
        )
        got = await receive_all(survivor.url, topic, set(acked))
        assert len(got) == 2 * N and sorted(got.values())[:N] == list(range(N))
    finally:
        await cluster.stop()


async def test_drain_without_a_tier_moves_what_it_can_and_reports_the_rest(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 2)
    try:
        await cluster.start()
        url = cluster.brokers[0].url
        c = await client(url)
        reliable = await producer(c, "/default/drain_reliable", "p", reliable=True)
        acked = await send(reliable, "r", 50)
        await producer(c, "/default/drain_plain", "q")
        assignments = await cluster.assignments()
        owner = assignments["/default/drain_reliable"]
        # Put the plain topic on the same broker, so the drain has one topic it can move and one it cannot.
        if assignments["/default/drain_plain"] != owner:
            assert admin_unload(cluster, "/default/drain_plain").returncode == 0

            async def together() -> bool:
                return (await cluster.assignments()).get("/default/drain_plain") == owner

            await cluster.until(together, "both topics on one broker")
        assert admin(cluster, "brokers", "drain", str(owner)).returncode == 0

        async def plain_moved() -> bool:
            return (await cluster.assignments()).get("/default/drain_plain") not in (None, owner)

        await cluster.until(plain_moved, "the non-reliable topic drained away")
        leader = await cluster.leader()
        assert leader is not None
        await cluster.until(
            lambda: "cannot move /default/drain_reliable" in cluster.process_of(leader).log(),
            "the drain reporting the topic it cannot move",
        )
        assert (await cluster.assignments())["/default/drain_reliable"] == owner  # kept, data and all
        await subscribe(url, "/default/drain_reliable")
        later = await send(reliable, "s", 50)  # still served: producers go on
        got = await receive_all(url, "/default/drain_reliable", set(later))
        assert sorted(got.values()) == list(range(50, 100))
        assert len(acked) == 50
    finally:
        await cluster.stop()
