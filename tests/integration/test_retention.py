"""Retention with real broker processes (issue 37 items 1 and 2, docs/retention.md): a namespace's limits set
from the CLI, a topic published to without pause, its durable objects and WAL files shrinking to the live
tail, the start offset kept across a restart, a subscription behind retention continuing from the start
offset with its loss counted, leftovers of an interrupted pass swept, and size retention without a tier."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import urllib.request
from pathlib import Path

import grpc
import pytest

from ister.client import Client
from ister.wire.gen import ister_v1_pb2 as ipb
from ister.wire.gen import ister_v1_pb2_grpc as ipb_grpc
from tests.integration.forkserver import run_ister
from tests.integration.harness import BrokerProcess
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = {
    "ISTER_STORAGE__RETENTION__CHECK_INTERVAL_SECONDS": "0.3",
    "ISTER_STORAGE__DURABLE__EXPORT_INTERVAL_SECONDS": "0.2",
    "ISTER_STORAGE__DURABLE__SEGMENT_MAX_AGE_SECONDS": "0.3",
    "ISTER_WAL__SEGMENT_MAX_BYTES": "16384",
}


def cli(*args: str) -> str:
    done = run_ister(list(args), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def counter(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def start_offset(broker: BrokerProcess, topic: str) -> int:
    async with grpc.aio.insecure_channel(broker.admin_addr) as channel:
        r = await ipb_grpc.IsterAdminStub(channel).GetRetention(
            ipb.GetRetentionRequest(topic=topic), timeout=10
        )
        return int(r.start_offset)


def object_ranges(data_dir: Path, ns: str, topic: str) -> list[tuple[int, int]]:
    directory = data_dir / "objects" / ns / topic
    out = []
    for p in directory.glob("data-*.dnb1") if directory.is_dir() else []:
        _, a, b = p.name[: -len(".dnb1")].split("-")
        out.append((int(a), int(b)))
    return sorted(out)


def wal_firsts(data_dir: Path, ns: str, topic: str) -> list[int]:
    directory = data_dir / "wal" / ns / topic
    return sorted(int(p.name.split(".")[0]) for p in directory.glob("*.wal"))


async def publish_until(client: Client, topic: str, stop: asyncio.Event) -> int:
    producer = await client.producer(topic, max_batch_messages=200)
    sent = 0
    while not stop.is_set():
        await producer.send_batch([b"r-%d" % (sent + i) + b"." * 200 for i in range(200)])
        sent += 200
        await asyncio.sleep(0.02)
    return sent


async def test_time_retention_shrinks_to_the_live_tail_and_keeps_the_start(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env=FAST)
    broker.start()
    ns, name = "ret", "busy"
    topic = f"/{ns}/{name}"
    try:
        cli("admin", "namespaces", "create", ns, "--admin-addr", broker.admin_addr)
        async with Client(broker.url) as client:
            await client.producer(topic)  # creates it (reliable)
            # a subscription at offset 0 that will fall behind
            slow = await client.consumer(topic, "slow", name="slow-c")
            await slow.close()
            stop = asyncio.Event()
            publisher = asyncio.create_task(publish_until(client, topic, stop))
            await until(
                lambda: len(object_ranges(broker.data_dir, ns, name)) >= 3, "three objects exported", 60
            )
            out = cli(
                "admin", "namespaces", "set-retention", ns, "--time", "2s", "--admin-addr", broker.admin_addr
            )
            assert "retention time: 2s (namespace)" in out, out
            first = await until(lambda: start_offset(broker, topic), "the start offset moved", 60)

            async def shrunk() -> int:
                start = await start_offset(broker, topic)
                objects = object_ranges(broker.data_dir, ns, name)
                firsts = wal_firsts(broker.data_dir, ns, name)
                below = [r for r in objects if r[1] < start]
                wal_below = [f for f, g in itertools.pairwise(firsts) if g <= start]
                return start if start > first and not below and not wal_below else 0

            start = await until(shrunk, "objects and WAL files below a later start offset deleted", 60)
            stop.set()
            sent = await publisher
            assert start < sent
            span = await client.offsets(topic)
            assert span.earliest >= start and span.next == sent
            got = [b async for b in client.read(topic, 0, start + 5)]
            assert got and got[0][0][0] >= start  # a read below the start begins at it
            # the subscription that fell behind continues from the start offset, its loss counted
            again = await client.consumer(topic, "slow", name="slow-c")
            batch = await again.receive_batch(10, 10.0)
            assert batch and batch[0].offset >= start
            await again.close()
            assert counter(broker.metrics_url, "ister_retention_skipped_messages_total") >= start
        # a restart keeps the start offset (metadata), and readers still start there
        broker.stop()
        broker.start()
        assert await start_offset(broker, topic) >= start
        async with Client(broker.url) as client:
            assert (await client.offsets(topic)).earliest >= start
    finally:
        broker.stop()


async def test_an_interrupted_pass_leaves_nothing_after_the_sweep(tmp_path: Path) -> None:
    """A kill -9 between moving the start offset and deleting the files leaves objects nobody lists; the
    broker that loads the topic again deletes them (and never anything at or past the start offset)."""
    broker = BrokerProcess(tmp_path / "data", env=FAST)
    broker.start()
    ns, name = "default", "swept"
    topic = f"/{ns}/{name}"
    try:
        async with Client(broker.url) as client:
            producer = await client.producer(topic, max_batch_messages=100)
            for _ in range(30):
                await producer.send_batch([b"x" * 200] * 100)
            await until(lambda: len(object_ranges(broker.data_dir, ns, name)) >= 3, "objects exported", 60)
            cli("admin", "topics", "set-retention", topic, "--time", "1s", "--admin-addr", broker.admin_addr)
            start = await until(lambda: start_offset(broker, topic), "the start offset moved", 60)
        # what a pass killed after its metadata step leaves: an object (and a copy) below the start offset
        directory = broker.data_dir / "objects" / ns / name
        orphan = directory / f"data-0-{start - 1}.dnb1"
        orphan.write_bytes(b"left behind")
        (directory / f"data-0-{start - 1}.parquet").write_bytes(b"left behind")
        broker.kill9()
        broker.start()
        async with Client(broker.url) as client:
            await client.producer(topic)  # loads the topic: its first pass sweeps
            copy = directory / f"data-0-{start - 1}.parquet"
            # the sweep deletes the object, then its copy: wait for both (one check after the first raced)
            await until(lambda: not orphan.exists() and not copy.exists(), "both swept", 30)
            assert await start_offset(broker, topic) >= start
            span = await client.offsets(topic)  # nothing at the head was touched
            assert span.next == 3000 and span.earliest >= start
    finally:
        broker.stop()


async def test_size_retention_without_a_durable_tier(tmp_path: Path) -> None:
    env = {**FAST, "ISTER_STORAGE__DURABLE__URL": "none", "ISTER_WAL__SEGMENT_MAX_BYTES": "8192"}
    broker = BrokerProcess(tmp_path / "data", env=env)
    broker.start()
    topic = "/default/sized"
    try:
        async with Client(broker.url) as client:
            producer = await client.producer(topic, max_batch_messages=50)
            out = cli(
                "admin",
                "topics",
                "set-retention",
                topic,
                "--size",
                "32KiB",
                "-o",
                "json",
                "--admin-addr",
                broker.admin_addr,
            )
            assert '"retention_size_bytes": "32768"' in out and '"size_from": "topic"' in out, out
            for _ in range(40):
                await producer.send_batch([b"s" * 300] * 50)

            def size_of(path: Path) -> int:
                try:
                    return path.stat().st_size
                except FileNotFoundError:  # retention deleted it meanwhile
                    return 0

            def bounded() -> bool:
                files = list((broker.data_dir / "wal" / "default" / "sized").glob("*.wal"))
                # a segment closes after the batch passing 8 KiB (~16 KiB each): a few beyond the limit
                return 0 < sum(size_of(p) for p in files) <= 32 * 1024 + 64 * 1024  # of ~600 KiB written

            def state() -> str:  # what a timeout shows: the files left and the broker's retention lines
                files = sorted((broker.data_dir / "wal" / "default" / "sized").glob("*.wal"))
                listing = ", ".join(f"{p.name} {size_of(p)}" for p in files)
                lines = [ln for ln in broker.log().splitlines() if "retention" in ln or "sized" in ln]
                return f"the WAL shrunk to about 32 KiB; files: {listing}; log: {lines[-15:]}"

            await until(bounded, state, 60)
            start = await start_offset(broker, topic)
            assert start > 0
            span = await client.offsets(topic)
            assert span.earliest >= start and span.next == 2000
            # clearing the topic's own limits goes back to the namespace's (7 days, unlimited size)
            out = cli("admin", "topics", "set-retention", topic, "--clear", "--admin-addr", broker.admin_addr)
            assert "unlimited (default)" in out and "7d (default)" in out, out
    finally:
        with contextlib.suppress(Exception):
            broker.stop()


def test_bad_retention_input_is_refused_and_changes_nothing(shared_broker: BrokerProcess) -> None:
    addr = ["--admin-addr", shared_broker.admin_addr]
    for args in (["--time", "7 days"], ["--size", "lots"], []):
        done = run_ister(["admin", "namespaces", "set-retention", "default", *args, *addr], timeout=60)
        assert done.returncode == 1 and done.stderr.startswith("error:"), done
    done = run_ister(["admin", "topics", "set-retention", "/default/nope", "--time", "1d", *addr], timeout=60)
    assert done.returncode == 1 and "does not exist" in done.stderr, done
    assert "7d (default)" in cli("admin", "namespaces", "retention", "default", *addr)


async def fill_until_refused(producer: object, limit: int = 400) -> Exception:
    for _ in range(limit):
        try:
            await producer.send_batch([b"q" * 300] * 50)  # type: ignore[attr-defined]
        except Exception as exc:  # the quota's refusal
            return exc
        await asyncio.sleep(0.01)
    raise AssertionError("publishes were never refused")


async def drain(consumer: object, head: int) -> None:
    seen = -1
    while seen < head - 1:
        batch = await consumer.receive_batch(500, 5.0)  # type: ignore[attr-defined]
        assert batch, f"consumed up to {seen} of {head}"
        await consumer.ack_batch(batch)  # type: ignore[attr-defined]
        seen = batch[-1].offset


async def test_backlog_quota_refuses_holds_and_lets_go(tmp_path: Path) -> None:
    env = {**FAST, "ISTER_STORAGE__RETENTION__PRODUCER_HOLD_SECONDS": "3"}
    broker = BrokerProcess(tmp_path / "data", env=env)
    broker.start()
    topic = "/quota/q"
    addr = ["--admin-addr", broker.admin_addr]
    try:
        cli("admin", "namespaces", "create", "quota", *addr)
        out = cli("admin", "namespaces", "set-backlog-quota", "quota", "--size", "64KiB", *addr)
        assert "64KiB, producer_error" in out, out
        async with Client(broker.url) as client:
            producer = await client.producer(topic, max_batch_messages=50)
            laggard = await client.consumer(topic, "laggard", name="lag-c", window=10_000)
            refused = await fill_until_refused(producer)
            assert "RESOURCE_EXHAUSTED" in type(refused).__name__.upper() or "backlog quota" in str(refused)
            assert "'laggard'" in str(refused), refused
            head = (await client.offsets(topic)).next
            # refused only once the backlog was past the quota: its bytes are stored bytes (300 of payload
            # and ~40 of record envelope and frame per message here)
            assert head * 400 >= 64 * 1024
            await drain(laggard, head)
            await until(lambda: _accepted(producer), "publishes accepted again once the backlog is gone", 30)

            # producer_hold: a publish waits for room (the subscription catching up lets it through) ...
            cli("admin", "namespaces", "set-backlog-quota", "quota", "--policy", "producer_hold", *addr)
            await fill_until_refused(producer)  # held 3 s, then refused
            head = (await client.offsets(topic)).next
            held = asyncio.create_task(producer.send_batch([b"held"]))
            await asyncio.sleep(0.5)
            assert not held.done()  # waiting, not refused
            await drain(laggard, head)
            assert len(await asyncio.wait_for(held, 30)) == 1
            # ... and the quota off lets everything through at once
            cli("admin", "namespaces", "set-backlog-quota", "quota", "--size", "0", *addr)
            for _ in range(20):
                await producer.send_batch([b"q" * 300] * 50)
    finally:
        broker.stop()


async def _accepted(producer: object) -> bool:
    try:
        await producer.send_batch([b"ok"])  # type: ignore[attr-defined]
    except Exception:
        return False
    return True


async def test_message_ttl_and_consumer_eviction_move_slow_subscriptions_on(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env=FAST)
    broker.start()
    addr = ["--admin-addr", broker.admin_addr]
    try:
        cli("admin", "namespaces", "create", "ttl", *addr)
        cli("admin", "namespaces", "create", "evict", *addr)
        async with Client(broker.url) as client:
            # TTL: an idle subscription's old messages are acknowledged for it; newer ones stay
            producer = await client.producer("/ttl/t", max_batch_messages=100)
            idle = await client.consumer("/ttl/t", "idle", name="idle-c")
            await idle.close()
            await producer.send_batch([b"old"] * 300)
            await asyncio.sleep(2.5)  # the first 300 grow older than the TTL set below (a publish-time gap)
            await producer.send_batch([b"new"] * 200)
            before = counter(broker.metrics_url, "ister_message_ttl_expired_total")
            out = cli("admin", "namespaces", "set-message-ttl", "ttl", "2s", *addr)
            assert "message TTL:    2s" in out, out
            await until(
                lambda: counter(broker.metrics_url, "ister_message_ttl_expired_total") >= before + 300,
                "the idle subscription's 300 old messages expired",
                30,
            )
            await producer.send_batch([b"fresh"] * 10)
            idle = await client.consumer("/ttl/t", "idle", name="idle-c")
            batch = await idle.receive_batch(500, 10.0)
            assert batch and batch[0].offset >= 300 and batch[0].payload in (b"new", b"fresh")
            await idle.close()

            # consumer_eviction: past the quota the slowest subscription is moved on, publishes continue
            before = counter(broker.metrics_url, "ister_backlog_quota_evicted_messages_total")
            cli(
                "admin",
                "namespaces",
                "set-backlog-quota",
                "evict",
                "--size",
                "32KiB",
                "--policy",
                "consumer_eviction",
                *addr,
            )
            evicting = await client.producer("/evict/e", max_batch_messages=100)
            slow = await client.consumer("/evict/e", "slow", name="slow-c")
            await slow.close()
            for _ in range(20):
                await evicting.send_batch([b"e" * 300] * 100)  # never refused
            await until(
                lambda: counter(broker.metrics_url, "ister_backlog_quota_evicted_messages_total") > before,
                "the slow subscription moved on",
                30,
            )
            slow = await client.consumer("/evict/e", "slow", name="slow-c")
            batch = await slow.receive_batch(10, 10.0)
            assert batch and batch[0].offset > 0  # its oldest messages went
            await slow.close()
    finally:
        broker.stop()
