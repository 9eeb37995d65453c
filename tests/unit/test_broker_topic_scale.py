"""Many topics on one broker (issue 14 item 2): the topic limit, bounded threads and file descriptors, and
no per-topic background work for quiet topics. BrokerService in-process, counts asserted, never times."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ister.broker.admin_ops import AdminOps
from ister.broker.service import BrokerService
from ister.config import load_config
from ister.core.record import StoredMessage
from ister.errors import ResourceExhausted
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.storage.objects import list_descriptors
from ister.wire.status import status_for
from tests.support import until

WAIT = 15.0  # a bound for a failure report, not a timing assertion


def _msg(payload: bytes) -> StoredMessage:
    return StoredMessage(payload=payload, publish_time=1, producer_id=1, producer_name="p")


def fds_under(root: Path) -> int:
    prefix = os.path.realpath(root)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                count += 1
        except OSError:
            continue
    return count


@pytest.fixture
async def make_broker(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[BrokerService, EmbeddedStore]] = []
    store = EmbeddedStore.in_memory()

    async def make(**overrides: Any) -> BrokerService:
        broker = BrokerService(load_config(overrides=overrides, environ={}), store, tmp_path)
        await broker.start()
        made.append((broker, store))
        return broker

    yield make
    for broker, _ in made:
        await broker.close()
    await store.close()


async def publish_one(broker: BrokerService, topic: str) -> None:
    pid = await broker.create_producer(topic, "p", reliable=True, access_mode=0)
    await broker.send(await broker.producer(pid, topic), _msg(b"x"))


async def test_topics_beyond_the_limit_are_refused_before_any_metadata_is_written(
    make_broker: Callable[..., Any],
) -> None:
    broker = await make_broker(**{"limits.max_topics_per_broker": 3})
    for i in range(3):
        await publish_one(broker, f"/default/t{i}")
    before = await broker.store.list("/")
    with pytest.raises(ResourceExhausted, match="max_topics_per_broker is 3") as info:
        await broker.create_producer("/default/t3", "p", reliable=True, access_mode=0)
    assert status_for(info.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(ResourceExhausted):  # the admin API too (3 partitions at once)
        await AdminOps(broker).create_topic("/default/parted", reliable=True, partitions=3)
    assert await broker.store.list("/") == before  # nothing written, no WAL directory either
    assert sorted(p.name for p in (broker.data_dir / "wal" / "default").iterdir()) == ["t0", "t1", "t2"]
    await publish_one(broker, "/default/t1")  # topics already here keep working
    await broker.seal("/default/t0", "test")  # one fewer loaded: room for one more
    await publish_one(broker, "/default/t3")
    with pytest.raises(ResourceExhausted):  # loading t0 again would exceed it as well
        await broker.get_topic(TopicName.parse("/default/t0"))


async def test_loading_existing_topics_beyond_the_limit_is_refused(make_broker: Callable[..., Any]) -> None:
    first = await make_broker()
    for i in range(3):
        await publish_one(first, f"/default/t{i}")
    await first.close()
    again = await make_broker(**{"limits.max_topics_per_broker": 2})
    for i in range(2):
        assert (await again.get_topic(TopicName.parse(f"/default/t{i}"))).wal is not None
    with pytest.raises(ResourceExhausted):
        await again.get_topic(TopicName.parse("/default/t2"))
    assert not again.is_loaded("/default/t2")
    assert await again.store.get(keys.namespace_topic("/default/t2")) is not None  # still there


async def test_two_thousand_topics_cost_no_thread_and_no_file_each(
    make_broker: Callable[..., Any], tmp_path: Path
) -> None:
    threads_before = threading.active_count()
    broker = await make_broker(
        **{"wal.max_open_segments": 64, "wal.idle_close_seconds": 3600, "storage.durable.url": "none"}
    )
    wal_root = tmp_path / "wal"
    most_threads = 0
    for start in range(0, 2000, 250):
        await asyncio.gather(*(publish_one(broker, f"/default/t{i}") for i in range(start, start + 250)))
        most_threads = max(most_threads, threading.active_count())
        # at most max_open_segments segment files open for writing (the least recently written are
        # closed right after their turn), plus the one lock on <data_dir>/wal
        await until(lambda: fds_under(wal_root) <= 64 + 1, "the open segment files to be capped", WAIT)
        assert broker.writers.stats()["open_files"] <= 64
    assert len(broker.topics) == 2000
    assert most_threads <= 64
    assert most_threads - threads_before <= broker.writers.threads + min(32, (os.cpu_count() or 1) + 4)
    for i in (0, 999, 1999):  # closed files are opened again on demand
        await publish_one(broker, f"/default/t{i}")
        topic = broker.topics[f"/default/t{i}"]
        assert topic.wal is not None and topic.wal.committed_offset == 2
        assert [o for o, _ in await topic.wal.reader(0).read(timeout=1)] == [0, 1]


async def test_idle_topics_hold_no_segment_file_open(make_broker: Callable[..., Any], tmp_path: Path) -> None:
    broker = await make_broker(**{"wal.idle_close_seconds": 0.3, "storage.durable.url": "none"})
    wal_root = tmp_path / "wal"
    await asyncio.gather(*(publish_one(broker, f"/default/t{i}") for i in range(300)))
    # idle: every segment file closed, one descriptor left for all 300 WALs (the lock root)
    await until(lambda: fds_under(wal_root) == 1, "idle segment files to be closed", WAIT)
    assert broker.writers.stats()["open_files"] == 0
    await publish_one(broker, "/default/t7")
    topic = broker.topics["/default/t7"]
    assert topic.wal is not None and topic.wal.committed_offset == 2  # its file opened again to write


async def test_quiet_exported_topics_get_no_export_passes(
    make_broker: Callable[..., Any], tmp_path: Path
) -> None:
    broker = await make_broker(
        **{
            "storage.durable.url": (tmp_path / "objects").as_uri(),
            "storage.durable.export_interval_seconds": 0.05,
            "storage.durable.segment_max_age_seconds": 0.2,
        }
    )
    names = [f"/default/q{i}" for i in range(20)]
    for name in names:
        await publish_one(broker, name)

    async def exported() -> bool:
        found = [await list_descriptors(broker.store, TopicName.parse(n)) for n in names]
        return all(d and d[-1].end_offset == 0 for d in found)

    # each topic's record rotates out of its idle segment, then exports
    await until(exported, "the records exported", 20, poll=0.05)
    exports = broker.exports
    ticks = exports.ticks
    await until(lambda: exports.ticks >= ticks + 2, "two walks", WAIT)  # the last passes settle
    ticks, passes = exports.ticks, exports.passes
    await until(lambda: exports.ticks >= ticks + 10, "ten walks over the quiet topics", WAIT)
    assert exports.passes == passes  # nothing to do for any of them: no pass, no I/O
    # one object each: the heap keeper counts them with the loaded topics as long-lived growth
    assert exports.exported == len(names)
    assert broker.long_lived_growth == 2 * len(names)
    await publish_one(broker, names[0])  # written again: that topic (alone) gets passes again
    await until(lambda: exports.passes > passes, "a pass for the written topic", WAIT)
