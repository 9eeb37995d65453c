"""A reliable subscription catching up from the durable tier (objects -> WAL): runs of frames as they sit in
the objects reach the batch API's consumer frames unchanged, with the next chunk read ahead; the failure
paths of those reads (store down during a read-ahead, a damaged object) as the consumer sees them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ister.broker.reliable import ReliableSubscription
from ister.broker.sessions import ConsumerSession, ConsumerStream
from ister.client.messages import split_frames
from ister.clock import REAL_CLOCK, VirtualClock
from ister.core.dispatch import FailurePolicy, SubType
from ister.limits import HEARTBEAT_SECONDS
from ister.metadata.embedded import EmbeddedStore
from ister.server.ister_api import _next_frame
from ister.storage.objects.catalog import list_descriptors
from ister.storage.objects.store import ObjectStore, ObjectStoreUnavailable, open_store
from ister.storage.objects.tiered import TieredReader
from ister.storage.wal import Wal, WalConfig, WalReader
from tests.support import until
from tests.unit.test_objects_tiered import TOPIC, append_n, old_owner, payload


class CountingReads(ObjectStore):
    """A memory:// store whose n-th ranged GETs (0-based, counted from `arm`) fail as if unreachable."""

    def __init__(self) -> None:
        base = open_store("memory://")
        super().__init__(base._store, base.url)
        self.reads = 0
        self.fail: set[int] = set()
        self.failed = 0

    def arm(self, *nth: int) -> None:
        self.fail = {self.reads + n for n in nth}

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        n = self.reads
        self.reads += 1
        if n in self.fail:
            self.failed += 1
            raise ObjectStoreUnavailable("injected: store down")
        return await super().get_range(key, start, end)


async def subscription(
    wal: Wal, objects: ObjectStore, meta: EmbeddedStore, window: int, chunk_bytes: int, clock: VirtualClock
) -> tuple[ReliableSubscription, ConsumerStream, list[int]]:
    reader = TieredReader(TOPIC, wal, objects, meta, 0, chunk_bytes=chunk_bytes)
    return started_subscription(wal, reader, window, 10_000, clock)


def started_subscription(
    wal: Wal,
    reader: TieredReader | WalReader,
    window: int,
    stream_size: int,
    clock: VirtualClock | None = None,
) -> tuple[ReliableSubscription, ConsumerStream, list[int]]:
    """An exclusive subscription of TOPIC from offset 0 reading through `reader`, one consumer attached
    with a stream of `stream_size`, its loop started (its heartbeats on `clock` when given); the cursors it
    writes (nothing may be dead-lettered)."""
    cursors: list[int] = []

    async def write_cursor(cursor: int) -> None:
        cursors.append(cursor)

    async def dead_letter(*_: object) -> None:
        raise AssertionError("nothing is dead-lettered here")

    sub = ReliableSubscription(
        TOPIC, "catch-up", SubType.EXCLUSIVE, wal=wal, start_offset=0, window=window,
        policy=FailurePolicy(), write_cursor=write_cursor, publish_dead_letter=dead_letter, reader=reader,
        clock=REAL_CLOCK if clock is None else clock,
    )  # fmt: skip
    session = ConsumerSession(1, "c", TOPIC, "catch-up", SubType.EXCLUSIVE, ())
    sub.add_consumer(session)
    stream = ConsumerStream(stream_size)
    sub.attach(session, stream)
    sub.start()
    return sub, stream, cursors


POLL = 0.002  # the subscription's steps are short: look often


def waiting(sub: ReliableSubscription) -> bool:
    """The subscription's task waits for its next wake-up (its step done, its heartbeat armed)."""
    return sub._timer is not None and not sub._wake.is_set() and not sub._step_lock.locked()


async def heartbeat(sub: ReliableSubscription, clock: VirtualClock) -> None:
    """One heartbeat of virtual time, and the step it starts run to its end."""
    await clock.advance(HEARTBEAT_SECONDS)
    await until(lambda: waiting(sub), "the step after a heartbeat", poll=POLL)


async def consume(
    sub: ReliableSubscription, stream: ConsumerStream, end: int, clock: VirtualClock, seconds: float = 10
) -> list[int]:
    """What a batch-API consumer receives (MessageBatch frames, each record's crc checked by the client's
    decoder) until offset end - 1, acking each frame cumulatively; each record compared with what was sent.
    Heartbeats come when the subscription waits with nothing for the consumer (a failed read is retried
    on the next one)."""
    got: list[int] = []
    async with asyncio.timeout(seconds):
        while not got or got[-1] < end - 1:
            await until(
                lambda: not stream.empty() or waiting(sub), "a frame or the subscription waiting", poll=POLL
            )
            if stream.empty():
                await heartbeat(sub, clock)
                continue
            frames, count = await _next_frame(stream)
            assert count, "the stream ended"
            offsets, records = split_frames(frames, count)
            assert [bytes(r) for r in records] == [payload(o) for o in offsets]
            got.extend(offsets)
            await sub.ack_upto(offsets[-1], 1)
    return got


async def test_catch_up_delivers_the_objects_frames_as_they_are(tmp_path: Path) -> None:
    objects = CountingReads()
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=4096)
    await old_owner(tmp_path / "a", objects, meta, 600, config, seal=True)
    wal = await Wal.open(tmp_path / "b", config, start_offset=600)
    await append_n(wal, 50)
    clock = VirtualClock()
    sub, stream, _ = await subscription(wal, objects, meta, window=100, chunk_bytes=1024, clock=clock)
    try:
        assert await consume(sub, stream, 650, clock) == list(range(650))  # objects, then the WAL, in order
        # the next step forgets what was acknowledged
        await until(lambda: not (sub._held.blocks or sub._held.records), "acknowledged records forgotten", 5)
        assert sub.cursor == 649
    finally:
        await sub.close()
        await wal.close()


async def test_store_down_during_a_read_ahead_the_consumer_misses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = CountingReads()
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1 << 20)
    await old_owner(tmp_path / "a", objects, meta, 4000, config, seal=True)  # one object of ~120 KB
    wal = await Wal.open(tmp_path / "b", config, start_offset=4000)
    # The first GET of the body serves the first chunk; the second is the read-ahead of the next one, made
    # while the first is delivered: it fails, and so does the first retry.
    objects.arm(1, 2)
    clock = VirtualClock()
    sub, stream, _ = await subscription(wal, objects, meta, window=100, chunk_bytes=4096, clock=clock)
    try:
        with caplog.at_level(logging.WARNING):
            got = await consume(sub, stream, 4000, clock)
        assert got == list(range(4000))  # each offset once, in order: the read resumed where it failed
        assert objects.failed == 2
        assert "store down" in caplog.text  # the failed step is reported, then retried
        assert sub.cursor == 3999
    finally:
        await sub.close()
        await wal.close()


async def test_a_damaged_object_stops_the_catch_up_before_it_until_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = CountingReads()
    meta = EmbeddedStore.in_memory()
    config = WalConfig(segment_max_bytes=1 << 20)
    await old_owner(tmp_path / "a", objects, meta, 300, config, seal=True)
    wal = await Wal.open(tmp_path / "b", config, start_offset=300)
    (desc,) = await list_descriptors(meta, TOPIC)
    good = await objects.get(desc.key)
    damaged = bytearray(good)
    damaged[good.index(payload(200)) + 3] ^= 0xFF  # one byte of offset 200's record
    await objects.put(desc.key, bytes(damaged))
    clock = VirtualClock()
    sub, stream, _ = await subscription(wal, objects, meta, window=50, chunk_bytes=700, clock=clock)
    try:
        with caplog.at_level(logging.WARNING):
            got = await consume(sub, stream, 190, clock)
            for _ in range(2):  # two heartbeats: the step fails and is retried, nothing more comes
                await heartbeat(sub, clock)
        # Everything of the chunks before the damaged one arrived (read ahead or not), nothing at or after it.
        assert got == list(range(len(got))) and 190 <= len(got) <= 200
        assert stream.empty() and not sub._task.done()  # type: ignore[union-attr]
        assert "crc" in caplog.text
        await objects.put(desc.key, good)  # repaired: the catch-up goes on from where it stopped
        assert got + await consume(sub, stream, 300, clock) == list(range(300))
    finally:
        await sub.close()
        await wal.close()
