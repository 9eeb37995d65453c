"""BrokerService in-process (embedded metadata in memory, WAL on tmp_path): rules that need no network."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ister.broker import topic as topic_module
from ister.broker.service import CONSUMER_REAP_INTERVAL_SECONDS, PRODUCER_IDLE_SECONDS, BrokerService
from ister.clock import VirtualClock
from ister.config import load_config
from ister.core.dispatch import SubType
from ister.core.record import StoredMessage
from ister.errors import FailedPrecondition, InvalidArgument, NotFound, Timeout
from ister.ids import TopicName
from ister.metadata import keys
from ister.metadata.embedded import EmbeddedStore
from ister.storage.wal.writer import WalWriter
from tests.support import until


@pytest.fixture
async def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = EmbeddedStore.in_memory()
    service = BrokerService(load_config(environ={}), store, tmp_path)
    await service.start()
    yield service
    await service.close()
    await store.close()


def _msg(payload: bytes) -> StoredMessage:
    return StoredMessage(payload=payload, publish_time=1, producer_id=1, producer_name="p")


async def test_idle_consumers_are_forgotten(broker: BrokerService) -> None:
    await broker.create_producer("/default/t", "p", reliable=True, access_mode=0)
    cid = await broker.subscribe("/default/t", "s", "c", SubType.SHARED, [])
    assert await broker.store.get(keys.consumer_index(cid)) is not None
    assert await broker.reap_consumers(time.monotonic() - 60) == 0  # seen just now: kept
    assert await broker.reap_consumers(time.monotonic() + 1) == 1
    assert cid not in broker.consumers
    assert await broker.store.get(keys.consumer_index(cid)) is None
    again = await broker.subscribe("/default/t", "s", "c", SubType.SHARED, [])
    assert again != cid


async def test_the_reaper_forgets_idle_sessions_on_the_brokers_clock(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path, clock=clock)
    await broker.start()
    try:
        pid = await broker.create_producer("/default/reaped", "p", reliable=True, access_mode=0)
        cid = await broker.subscribe("/default/reaped", "s", "c", SubType.SHARED, [])
        await clock.advance(PRODUCER_IDLE_SECONDS - CONSUMER_REAP_INTERVAL_SECONDS)  # idle, not long enough
        assert cid in broker.consumers and pid in broker.producers
        assert broker.consumer_alive(cid)  # a health check: idle from now on
        await clock.advance(2 * CONSUMER_REAP_INTERVAL_SECONDS)  # the producer is past its idle time
        await until(lambda: pid not in broker.producers, "the idle producer forgotten")
        assert cid in broker.consumers
        await clock.advance(PRODUCER_IDLE_SECONDS)
        await until(lambda: cid not in broker.consumers, "the idle consumer forgotten")
    finally:
        await broker.close()
        await store.close()


async def test_attached_consumers_are_never_reaped(broker: BrokerService) -> None:
    await broker.create_producer("/default/t2", "p", reliable=True, access_mode=0)
    cid = await broker.subscribe("/default/t2", "s", "c", SubType.EXCLUSIVE, [])
    ref, stream = await broker.open_stream(cid)
    assert await broker.reap_consumers(time.monotonic() + 1) == 0
    broker.close_stream(ref, stream)
    assert await broker.reap_consumers(time.monotonic() + 1) == 1


async def test_new_subscription_starts_at_latest_and_records_it(broker: BrokerService) -> None:
    pid = await broker.create_producer("/default/t3", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/t3")
    for i in range(3):
        await broker.send(session, _msg(b"%d" % i))
    await broker.subscribe("/default/t3", "late", "c", SubType.EXCLUSIVE, [])
    record = await broker.store.get(keys.subscription("/default/t3", "late"))
    assert record is not None and record.value["start_offset"] == 3


async def test_strategy_and_partition_conflicts(broker: BrokerService) -> None:
    await broker.create_producer("/default/plain", "p", reliable=False, access_mode=0)
    with pytest.raises(FailedPrecondition, match="NonReliable"):
        await broker.create_producer("/default/plain", "q", reliable=True, access_mode=0)
    with pytest.raises(FailedPrecondition, match="plain topic"):
        await broker.create_producer("/default/plain-part-0", "p", reliable=False, access_mode=0)
    await broker.create_producer("/default/parted-part-1", "p", reliable=False, access_mode=0)
    await broker.create_producer("/default/parted-part-0", "p", reliable=False, access_mode=0)
    with pytest.raises(FailedPrecondition, match="partitioned"):
        await broker.create_producer("/default/parted", "p", reliable=False, access_mode=0)
    from ister.ids import TopicName

    assert await broker.partitions(TopicName.parse("/default/parted")) == [
        "/default/parted-part-0",
        "/default/parted-part-1",
    ]
    assert await broker.partitions(TopicName.parse("/default/plain")) == ["/default/plain"]


async def test_bad_names_and_unknowns(broker: BrokerService) -> None:
    with pytest.raises(InvalidArgument):
        await broker.create_producer("/default/t", "bad/name", reliable=True, access_mode=0)
    with pytest.raises(NotFound, match="namespace"):
        await broker.create_producer("/missing/t", "p", reliable=True, access_mode=0)
    with pytest.raises(NotFound):
        await broker.subscribe("/default/none", "s", "c", SubType.SHARED, [])
    with pytest.raises(NotFound):
        await broker.producer(12345, "/default/none")
    with pytest.raises(NotFound):
        await broker.open_stream(12345)


async def test_a_topic_fenced_while_it_seals_ends_closed(tmp_path: Path) -> None:
    """A lease lost during a seal unloads the topic under it: the seal still finishes without a transition
    the lifecycle table does not have, and the topic is forgotten."""
    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    try:
        name = TopicName.parse("/default/sealing")
        topic = await broker.get_topic(name, create_as="NonReliable")
        original = topic.release

        async def release_while_fenced() -> None:
            await broker.unload(name.full, "lease lost")  # what the cluster does when the lease goes
            await original()

        topic.release = release_while_fenced  # type: ignore[method-assign]
        await broker.seal(name.full, "unload")
        assert topic.lifecycle.state.value == "closed" and not broker.is_loaded(name.full)
    finally:
        await broker.close()
        await store.close()


async def test_a_load_that_fails_after_the_wal_opened_closes_it(tmp_path: Path) -> None:
    """The store fails while a reliable topic loads, after its WAL was opened: the WAL is closed again (one
    WAL per directory per process), so the next attempt loads the topic with every record."""
    from ister.errors import MetadataError

    store = EmbeddedStore.in_memory()
    broker = BrokerService(load_config(environ={}), store, tmp_path)
    await broker.start()
    try:
        name = TopicName.parse("/default/flaky")
        topic = await broker.get_topic(name, create_as="Reliable")
        await topic.publish(StoredMessage(payload=b"kept", publish_time=1, producer_id=1, producer_name="p"))
        await broker.unload(name.full, "test")
        original = store.list
        failures = [1]

        async def failing_list(prefix: str, *args: object, **kwargs: object) -> object:
            if failures and "/producers" in prefix:
                failures.pop()
                raise MetadataError("the store is down")
            return await original(prefix, *args, **kwargs)  # type: ignore[arg-type]

        store.list = failing_list  # type: ignore[method-assign]
        with pytest.raises(MetadataError):
            await broker.get_topic(name)
        again = await broker.get_topic(name)
        assert again.wal is not None and again.wal.committed_offset == 1
    finally:
        await broker.close()
        await store.close()


async def test_a_publish_the_disk_does_not_make_durable_in_time_fails_and_the_topic_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_module, "PUBLISH_TIMEOUT_SECONDS", 1.0)  # read when the topic is loaded
    store = EmbeddedStore.in_memory()
    service = BrokerService(load_config(environ={}), store, tmp_path)
    await service.start()
    disk_back = threading.Event()
    try:
        pid = await service.create_producer("/default/hung", "p", reliable=True, access_mode=0)
        session = await service.producer(pid, "/default/hung")
        assert await service.send(session, _msg(b"before")) == 0
        real_sync = WalWriter._fdatasync

        def hung_sync(self: WalWriter) -> None:  # a disk that stops answering (simulated), then comes back
            disk_back.wait(30)
            real_sync(self)

        monkeypatch.setattr(WalWriter, "_fdatasync", hung_sync)
        with pytest.raises(Timeout, match=r"did not make the message durable within 1 s"):
            await service.send(session, _msg(b"slow"))
        disk_back.set()
        # The topic goes on, and the message that timed out was written after all (at offset 1): the
        # client was told it failed and may send it again, a duplicate but nothing lost.
        assert await service.send(session, _msg(b"after")) == 2
        topic = service.topics["/default/hung"]
        assert topic.wal is not None and topic.wal.committed_offset == 3
    finally:
        disk_back.set()
        await service.close()
        await store.close()


async def test_a_cursor_past_what_a_new_leader_shows_yet_is_kept(broker: BrokerService) -> None:
    """A replicated topic's new leader shows nothing (visible cap) until its epoch's start commits, but
    holds every record a consumer acknowledged: a subscription opened meanwhile resumes at its cursor, not
    at the visible end (a chaos run saw cursors go back to 0 and everything delivered again)."""
    pid = await broker.create_producer("/default/t4", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/t4")
    for i in range(5):
        await broker.send(session, _msg(b"%d" % i))
    await broker.store.put(keys.subscription_cursor("/default/t4", "s"), 3)  # consumed 0..3
    wal = broker.topics["/default/t4"].wal
    assert wal is not None
    wal.cap_visible(0)  # as a new leader before its epoch's start commits
    try:
        await broker.subscribe("/default/t4", "s", "c", SubType.EXCLUSIVE, [])
    finally:
        wal.cap_visible(None)
    record = await broker.store.get(keys.subscription("/default/t4", "s"))
    assert record is not None and record.value["start_offset"] == 4
    cursor = await broker.store.get(keys.subscription_cursor("/default/t4", "s"))
    assert cursor is not None and cursor.value == 3


async def test_a_new_latest_subscription_on_a_new_leader_starts_at_what_it_holds(
    broker: BrokerService,
) -> None:
    pid = await broker.create_producer("/default/t5", "p", reliable=True, access_mode=0)
    session = await broker.producer(pid, "/default/t5")
    for i in range(5):
        await broker.send(session, _msg(b"%d" % i))
    wal = broker.topics["/default/t5"].wal
    assert wal is not None
    wal.cap_visible(0)  # as a new leader before its epoch's start commits
    try:
        await broker.subscribe("/default/t5", "latest", "c", SubType.EXCLUSIVE, [])
    finally:
        wal.cap_visible(None)
    record = await broker.store.get(keys.subscription("/default/t5", "latest"))
    assert record is not None and record.value["start_offset"] == 5  # not 0: the history is not new
