"""Gray failures on real broker processes (issue 39, item 4): a disk that is slow or returns EIO under one
broker of a 3-broker cluster (RF 3, min in-sync 2, `replica_max_lag_seconds` 2), made by the preload
library of tests/integration/diskfault.py while a producer runs.

What Kafka promises for the same shapes, and what is checked here: a slow or failing follower leaves the
in-sync set within its lag time and producers go on without it (it rejoins once healthy); a leader whose
disk fails steps down and an in-sync replica takes over; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ister.core.replication import ReplicaRecord
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.diskfault import DiskFault, build_library
from tests.integration.replication_support import RF_ENV, produce, read_all, replica_record

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    built = build_library(tmp_path_factory.mktemp("diskfault"))
    if built is None:
        pytest.skip("no C compiler (gcc) to build the disk-fault library")
    yield built


@pytest.fixture
async def faulty(
    tmp_path: Path, etcd_server: EtcdServer, library: Path
) -> AsyncIterator[tuple[Cluster, list[DiskFault]]]:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=RF_ENV)
    faults = []
    for i, b in enumerate(cluster.brokers):
        fault = DiskFault(library, tmp_path / f"disk{i}.ctl", b.data_dir)
        b.env = {**b.env, **fault.env()}
        faults.append(fault)
    try:
        await cluster.start()
        yield cluster, faults
    finally:
        await cluster.stop()


class Acks:
    """A producer's acknowledgements, and how to stop it."""

    def __init__(self) -> None:
        self.acked: dict[int, bytes] = {}
        self.stop = asyncio.Event()


async def check_history(cluster: Cluster, url: str, topic: str, acked: dict[int, bytes]) -> None:
    got = await read_all(url, topic, max(acked) + 1)
    missing = [o for o in acked if got.get(o) != acked[o]]
    assert not missing, f"{len(missing)} acknowledged offsets lost or changed, first {sorted(missing)[:5]}"


@pytest.mark.parametrize("fault", ["slow", "eio"])
async def test_a_follower_with_a_bad_disk_leaves_the_in_sync_set_and_producers_go_on(
    faulty: tuple[Cluster, list[DiskFault]], fault: str
) -> None:
    cluster, faults = faulty
    topic = f"/default/gray_follower_{fault}"
    urls = [b.url for b in cluster.brokers]
    acks = Acks()
    producer = asyncio.create_task(produce(urls, topic, acks.acked, acks.stop))
    try:
        await cluster.until(lambda: len(acks.acked) >= 500, "traffic flows")
        record = await replica_record(cluster, topic)
        assert record is not None
        victim = next(b for b in record.replicas if b != record.leader)
        disk = faults[cluster.brokers.index(cluster.process_of(victim))]
        disk.slow(5_000) if fault == "slow" else disk.fail()
        started = time.monotonic()

        async def left() -> ReplicaRecord | None:
            rec = await replica_record(cluster, topic)
            return rec if rec is not None and victim not in rec.isr else None

        await cluster.until(left, "the follower with the bad disk leaves the in-sync set", 30)
        left_after = time.monotonic() - started
        before = len(acks.acked)
        await cluster.until(lambda: len(acks.acked) >= before + 500, "producers go on without it", 30)
        disk.heal()

        async def back() -> bool:
            rec = await replica_record(cluster, topic)
            return rec is not None and victim in rec.isr

        await cluster.until(back, "it rejoins once its disk is healthy", 60)
    finally:
        acks.stop.set()
        await producer
    await check_history(cluster, urls[0], topic, acks.acked)
    print(
        f"{fault} follower disk: out of the in-sync set after {left_after:.1f} s; "
        f"{len(acks.acked)} acknowledged"
    )


async def test_a_leader_whose_disk_fails_steps_down_and_an_in_sync_replica_takes_over(
    faulty: tuple[Cluster, list[DiskFault]],
) -> None:
    cluster, faults = faulty
    topic = "/default/gray_leader_eio"
    urls = [b.url for b in cluster.brokers]
    acks = Acks()
    producer = asyncio.create_task(produce(urls, topic, acks.acked, acks.stop))
    try:
        await cluster.until(lambda: len(acks.acked) >= 500, "traffic flows")
        record = await replica_record(cluster, topic)
        assert record is not None
        failing = record.leader
        faults[cluster.brokers.index(cluster.process_of(failing))].fail()
        started = time.monotonic()

        async def taken_over() -> ReplicaRecord | None:
            rec = await replica_record(cluster, topic)
            return rec if rec is not None and rec.leader not in (failing, -1) else None

        after = await cluster.until(taken_over, "an in-sync replica leads", 30)
        assert failing not in after.isr
        before = len(acks.acked)
        await cluster.until(lambda: len(acks.acked) >= before + 500, "writes resume", 30)
        took = time.monotonic() - started
        assert cluster.process_of(failing).proc is not None
        assert cluster.process_of(failing).proc.poll() is None  # it stepped down, it did not die
    finally:
        acks.stop.set()
        await producer
    await check_history(cluster, cluster.process_of(after.leader).url, topic, acks.acked)
    print(f"leader disk EIO: writes resumed {took:.1f} s later on broker {after.leader}")
