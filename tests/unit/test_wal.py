"""The write-ahead log (ister.storage.wal): group commit, readers, rotation, recovery, failures."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ister.core.frames import HEADER_SIZE, encode_frame, scan_frames
from ister.errors import CorruptionError, CorruptRange, OffsetOutOfRange, StorageError
from ister.storage.wal import Wal, WalConfig, WalReader
from ister.storage.wal.checkpoint import Checkpoint, write_checkpoint
from ister.storage.wal.writer import WalWriter
from tests.support import segment_bytes

SMALL_SEGMENTS = WalConfig(segment_max_bytes=1024)


def payload(i: int) -> bytes:
    return f"record-{i:06d}".encode()


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


def file_records(directory: Path) -> list[tuple[int, bytes]]:
    """Every frame of every segment file, validated independently of the WAL code."""
    out: list[tuple[int, bytes]] = []
    for path in segment_files(directory):
        first = int(path.stem)
        res = scan_frames(segment_bytes(path), expect_offset=first)
        assert res.stop == "end", (path, res.stop)
        out.extend((o, bytes(p)) for o, p, _ in res.frames)
    return out


async def read_all(reader: WalReader, until: int, max_records: int = 512) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while reader.next_offset < until:
        batch = await reader.read(max_records=max_records, timeout=5)
        assert batch, f"reader stalled at {reader.next_offset}"
        out.extend(batch)
    return out


def assert_dense(records: list[tuple[int, bytes]], start: int, end: int) -> None:
    assert [o for o, _ in records] == list(range(start, end))


# ---- appending -------------------------------------------------------------------------------------


async def test_append_returns_dense_offsets_from_zero(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path / "t", WalConfig())
    try:
        assert (wal.next_offset, wal.committed_offset, wal.first_offset) == (0, 0, 0)
        assert await wal.append([b"a"]) == 0
        assert await wal.append([b"b", b"c", b"d"]) == 1
        assert await wal.append([b"e"]) == 4
        assert (wal.next_offset, wal.committed_offset, wal.synced_offset) == (5, 5, 5)
        assert file_records(tmp_path / "t") == list(enumerate([b"a", b"b", b"c", b"d", b"e"]))
        stats = wal.stats()
        assert stats["next_offset"] == 5
        assert stats["segments"] == 1
        assert stats["cache_bytes"] > 0
    finally:
        await wal.close()


async def test_assigned_names_the_offsets_and_a_caller_gone_after_it_still_gets_them_written(
    tmp_path: Path,
) -> None:
    """What idempotence relies on (broker/dedup.py): once `assigned` is called the records are written even
    if the caller is cancelled (a publish timeout), so a retry must not store them again."""
    wal = await Wal.open(tmp_path / "t", WalConfig())
    try:
        await wal.append([b"a"])
        taken: list[int] = []
        took = asyncio.Event()

        def assigned(first: int) -> None:
            taken.append(first)
            took.set()

        task = asyncio.ensure_future(wal.append([b"b", b"c"], assigned=assigned))
        await took.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert taken == [1]
        assert await wal.append([b"d"]) == 3
        assert file_records(tmp_path / "t") == list(enumerate([b"a", b"b", b"c", b"d"]))
    finally:
        await wal.close()


async def test_empty_or_oversize_append_is_rejected_without_consuming_offsets(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        with pytest.raises(ValueError):
            await wal.append([])
        with pytest.raises(ValueError):
            await wal.append([b"ok", b"x" * (65 * 1024 * 1024 + 1)])
        assert wal.next_offset == 0
        assert await wal.append([b"first"]) == 0
    finally:
        await wal.close()


async def test_concurrent_appends_are_dense_ordered_and_match_files(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(segment_max_bytes=8 * 1024))
    expected: dict[int, bytes] = {}

    async def producer(p: int) -> None:
        for i in range(25):
            batch = [f"p{p}-{i}-{k}".encode() for k in range(1 + (i % 3))]
            first = await wal.append(batch)
            for k, item in enumerate(batch):
                expected[first + k] = item

    try:
        await asyncio.gather(*(producer(p) for p in range(40)))
        n = wal.next_offset
        assert sorted(expected) == list(range(n))
        assert wal.committed_offset == n
        on_disk = file_records(tmp_path)
        assert on_disk == [(o, expected[o]) for o in range(n)]
        assert len(segment_files(tmp_path)) > 1
        reader = wal.reader(0)
        assert await read_all(reader, n) == on_disk
    finally:
        await wal.close()


async def test_offsets_are_assigned_in_call_order(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        tasks = [asyncio.ensure_future(wal.append([payload(i)])) for i in range(200)]
        offsets = await asyncio.gather(*tasks)
        assert offsets == list(range(200))
    finally:
        await wal.close()


async def test_commit_listener_sees_the_records_and_runs_before_the_appenders_resume(tmp_path: Path) -> None:
    """The topic wakes its subscriptions from `on_committed`: the records must be readable by then, and the
    wake-up must come before the appenders resume (so a delivery does not queue behind the ack)."""
    wal = await Wal.open(tmp_path, WalConfig())
    events: list[tuple[str, int]] = []

    def committed() -> None:
        events.append(("listener", wal.committed_offset))
        events.append(("readable", wal.reader(0).available()))

    wal.on_committed = committed
    try:
        first = await wal.append([b"a", b"b"])
        events.append(("appender", first))
        assert events == [("listener", 2), ("readable", 2), ("appender", 0)]
        events.clear()
        await wal.flush()  # a commit that stores nothing new does not call the listener
        assert events == []
    finally:
        await wal.close()


async def test_under_a_visible_cap_the_listener_runs_when_the_cap_moves(tmp_path: Path) -> None:
    """A replicated topic's leader: subscriptions are woken when records reach enough replicas (the cap),
    not when they are durable here only."""
    wal = await Wal.open(tmp_path, WalConfig())
    calls: list[int] = []
    wal.on_committed = lambda: calls.append(wal.committed_offset)
    try:
        wal.cap_visible(0)
        await wal.append([b"a", b"b", b"c"])
        assert (calls, wal.durable_offset, wal.committed_offset) == ([], 3, 0)
        wal.cap_visible(2)
        wal.cap_visible(2)  # no move, no call
        wal.cap_visible(3)
        wal.cap_visible(None)  # lifting the cap shows nothing new here
        assert calls == [2, 3]
    finally:
        await wal.close()


# ---- readers ---------------------------------------------------------------------------------------


async def test_reader_from_zero_across_segments_then_live(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(segment_max_bytes=512, cache_max_bytes=0))
    try:
        for i in range(0, 300, 3):
            await wal.append([payload(i), payload(i + 1), payload(i + 2)])
        assert len(wal.segments()) > 5
        reader = wal.reader(0)
        got = await read_all(reader, 300, max_records=7)
        assert got == [(i, payload(i)) for i in range(300)]

        async def later() -> None:
            for i in range(300, 400):
                await wal.append([payload(i)])

        appender = asyncio.ensure_future(later())
        live = await read_all(reader, 400, max_records=10)
        await appender
        assert live == [(i, payload(i)) for i in range(300, 400)]
        assert reader.available() == 0
        assert await reader.read(timeout=0.01) == []
    finally:
        await wal.close()


async def test_reader_started_midway(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(segment_max_bytes=600, cache_max_bytes=0, index_every_frames=4))
    try:
        for i in range(200):
            await wal.append([payload(i)])
        for start in (0, 1, 57, 123, 199):
            reader = wal.reader(start)
            assert reader.available() == 200 - start
            assert await read_all(reader, 200, max_records=13) == [(i, payload(i)) for i in range(start, 200)]
        live = wal.reader(200)
        assert await live.read(timeout=0.01) == []
    finally:
        await wal.close()


async def test_reader_created_before_appends(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        reader = wal.reader(0)
        pending = asyncio.ensure_future(reader.read(timeout=5))
        await asyncio.sleep(0)
        assert not pending.done()
        await wal.append([b"x", b"y"])
        assert await pending == [(0, b"x"), (1, b"y")]
        assert reader.next_offset == 2
    finally:
        await wal.close()


async def test_read_limits(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        await wal.append([b"a" * 100] * 10)
        reader = wal.reader(0)
        assert len(await reader.read(max_records=3)) == 3
        assert len(await reader.read(max_bytes=250)) == 2
        # a record larger than max_bytes is still returned alone
        assert len(await reader.read(max_bytes=1)) == 1
        assert reader.next_offset == 6
    finally:
        await wal.close()


async def test_cache_eviction_then_reader_reads_files(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(cache_max_bytes=2000, segment_max_bytes=700))
    try:
        for i in range(300):
            await wal.append([payload(i)])
        stats = wal.stats()
        assert 0 < stats["cache_bytes"] <= 2000
        assert stats["cache_first_offset"] > 200
        reader = wal.reader(0)
        got = await read_all(reader, 300, max_records=50)
        assert got == [(i, payload(i)) for i in range(300)]
    finally:
        await wal.close()


async def test_corrupt_payload_in_closed_segment_is_skipped_and_reported(tmp_path: Path) -> None:
    config = WalConfig(segment_max_bytes=300, cache_max_bytes=0)
    wal = await Wal.open(tmp_path, config)
    for i in range(50):
        await wal.append([payload(i)])
    await wal.close()
    first = segment_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[HEADER_SIZE + 2] ^= 0xFF  # payload byte of offset 0 (headers of old segments stay valid)
    first.write_bytes(bytes(data))
    wal = await Wal.open(tmp_path, config)
    try:
        with pytest.raises(CorruptRange) as info:
            await wal.reader(0, skip_holes=False).read()
        assert (info.value.first, info.value.end) == (0, 1)  # the next frame is intact: only 0 is lost
        assert wal.holes() == [(0, 1)]
        reader = wal.reader(0)
        assert await read_all(reader, 50) == [(i, payload(i)) for i in range(1, 50)]
        assert reader.skipped == [(0, 0)]
        assert reader.damaged == [(0, 0)]
    finally:
        await wal.close()


async def test_reader_range_errors(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(), start_offset=100)
    try:
        await wal.append([b"a"])
        with pytest.raises(OffsetOutOfRange):
            wal.reader(102)
        reader = wal.reader(99)
        with pytest.raises(OffsetOutOfRange):
            await reader.read()
        with pytest.raises(ValueError):
            await wal.reader(100).read(max_records=0)
    finally:
        await wal.close()


async def test_reader_close_and_wal_close(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    await wal.append([b"a", b"b"])
    reader = wal.reader(0)
    waiting = wal.reader(2)
    pending = asyncio.ensure_future(waiting.read())
    await asyncio.sleep(0)
    await wal.close()
    # committed records are still returned after close, then the reader learns the WAL is gone
    assert await reader.read() == [(0, b"a"), (1, b"b")]
    with pytest.raises(StorageError, match="closed"):
        await reader.read()
    with pytest.raises(StorageError, match="closed"):
        await pending
    other = wal.reader(0)
    other.close()
    with pytest.raises(StorageError, match="reader closed"):
        await other.read()


async def test_readers_during_concurrent_appends(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(segment_max_bytes=2048, cache_max_bytes=1500))
    total = 1200

    async def producer(p: int) -> None:
        for i in range(p, total, 6):
            await wal.append([payload(i)])

    async def consumer(start: int) -> list[tuple[int, bytes]]:
        while wal.next_offset < start:
            await wal.reader(wal.next_offset).read(timeout=5)
        return [(o, p) for o, p in await read_all(wal.reader(start), total, max_records=17)]

    try:
        results = await asyncio.gather(
            *(producer(p) for p in range(6)), *(consumer(s) for s in (0, 0, 100, 555, 1199))
        )
        stored = dict(file_records(tmp_path))
        assert sorted(stored) == list(range(total))
        for start, got in zip((0, 0, 100, 555, 1199), results[6:], strict=True):
            assert got == [(o, stored[o]) for o in range(start, total)]
    finally:
        await wal.close()


async def test_close_completes_pending_appends(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    pending = [asyncio.ensure_future(wal.append([payload(i)])) for i in range(50)]
    await asyncio.sleep(0)
    await wal.close()
    assert [await p for p in pending] == list(range(50))
    assert file_records(tmp_path) == [(i, payload(i)) for i in range(50)]


# ---- durability modes and flush -------------------------------------------------------------------


async def test_interval_mode(tmp_path: Path) -> None:
    config = WalConfig(fsync="interval", fsync_interval_ms=5)
    wal = await Wal.open(tmp_path, config)
    results = await asyncio.gather(*(wal.append([payload(i)]) for i in range(100)))
    assert sorted(results) == list(range(100))
    assert wal.committed_offset == 100
    await wal.flush()
    assert wal.synced_offset == 100
    assert await read_all(wal.reader(0), 100) == [(i, payload(i)) for i in range(100)]
    await wal.close()
    wal = await Wal.open(tmp_path, config)
    try:
        assert wal.next_offset == 100
        assert await read_all(wal.reader(0), 100) == [(i, payload(i)) for i in range(100)]
    finally:
        await wal.close()


async def test_flush_and_close_are_idempotent(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    await wal.flush()
    await wal.append([b"x"])
    await wal.flush()
    await asyncio.gather(wal.close(), wal.close())
    await wal.close()
    await wal.flush()  # nothing pending: fine


# ---- failures and back-pressure -------------------------------------------------------------------


async def test_append_after_close_raises_and_consumes_no_offset(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    await wal.append([b"a"])
    await wal.close()
    with pytest.raises(StorageError):
        await wal.append([b"b"])
    assert wal.next_offset == 1
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        assert wal.next_offset == 1
    finally:
        await wal.close()


async def test_writer_failure_fails_appends_and_enters_failed_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    await wal.append([b"ok"])

    def broken_sync(self: WalWriter) -> None:
        raise OSError(5, "simulated I/O error")

    monkeypatch.setattr(WalWriter, "_fdatasync", broken_sync)
    reader = wal.reader(1)
    with pytest.raises(StorageError):
        await wal.append([b"lost"])
    assert wal.failed is not None
    before = wal.next_offset
    with pytest.raises(StorageError):
        await wal.append([b"refused"])
    assert wal.next_offset == before
    with pytest.raises(StorageError):
        await wal.flush()
    with pytest.raises(StorageError, match="failed"):
        await reader.read(timeout=5)
    assert wal.committed_offset == 1
    await wal.close()


async def test_back_pressure_waits_before_assigning_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    original = WalWriter._write_group

    def gated(self: WalWriter, *args: object) -> None:
        assert gate.wait(10)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(WalWriter, "_write_group", gated)
    wal = await Wal.open(tmp_path, WalConfig(max_queued_bytes=300))
    try:
        first = asyncio.ensure_future(wal.append([b"a" * 200]))
        await asyncio.sleep(0)
        assert wal.next_offset == 1
        second = asyncio.ensure_future(wal.append([b"b" * 200]))
        third = asyncio.ensure_future(wal.append([b"c" * 10]))
        for _ in range(3):
            await asyncio.sleep(0)
        assert wal.next_offset == 1  # both wait for space, in FIFO order, with no offset assigned
        assert not second.done() and not third.done()
        gate.set()
        assert await asyncio.wait_for(asyncio.gather(first, second, third), 5) == [0, 1, 2]
        assert wal.stats()["queued_bytes"] == 0
        assert file_records(tmp_path) == [(0, b"a" * 200), (1, b"b" * 200), (2, b"c" * 10)]
    finally:
        gate.set()
        await wal.close()


async def test_many_appends_with_tiny_queue_limit(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(max_queued_bytes=500, max_write_bytes=200))
    try:
        offsets = await asyncio.gather(*(wal.append([payload(i)]) for i in range(300)))
        assert offsets == list(range(300))
        assert file_records(tmp_path) == [(i, payload(i)) for i in range(300)]
        assert wal.stats()["queued_bytes"] == 0
    finally:
        await wal.close()


# ---- recovery --------------------------------------------------------------------------------------


async def write_records(directory: Path, n: int, config: WalConfig = SMALL_SEGMENTS) -> None:
    wal = await Wal.open(directory, config)
    for i in range(0, n, 2):
        await wal.append([payload(i), payload(i + 1)])
    await wal.close()


async def test_directory_is_locked_while_open(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    with pytest.raises(StorageError, match="already open"):
        await Wal.open(tmp_path, WalConfig())
    await wal.close()
    again = await Wal.open(tmp_path, WalConfig())
    await again.close()


async def test_an_open_cancelled_during_recovery_leaves_the_directory_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling an open while its recovery runs in a thread (a follower stopped for a promotion) must
    not leave the directory locked by nobody: the next open of it succeeds."""
    import ister.storage.wal.wal as wal_module

    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real_recover = wal_module.recover

    def slow_recover(*args: object, **kwargs: object) -> object:
        entered.set()
        release.wait(10)
        try:
            return real_recover(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            finished.set()

    monkeypatch.setattr(wal_module, "recover", slow_recover)
    opening = asyncio.ensure_future(Wal.open(tmp_path, WalConfig()))
    await asyncio.to_thread(entered.wait, 10)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    release.set()
    monkeypatch.setattr(wal_module, "recover", real_recover)
    await asyncio.to_thread(finished.wait, 10)  # the abandoned recovery has claimed the directory
    deadline = asyncio.get_running_loop().time() + 5
    while True:  # its result reaches the loop, which gives the claim back
        try:
            wal = await Wal.open(tmp_path, WalConfig())
            break
        except StorageError as e:
            print("retry", e)
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.01)
    await wal.append([b"x"])
    await wal.close()


async def test_reopen_continues_offsets(tmp_path: Path) -> None:
    await write_records(tmp_path, 100)
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert (wal.next_offset, wal.committed_offset, wal.first_offset) == (100, 100, 0)
        assert wal.truncated == []
        assert await wal.append([payload(100)]) == 100
        assert await read_all(wal.reader(0), 101) == [(i, payload(i)) for i in range(101)]
        segments = wal.segments()
        assert [first for first, _, _ in segments] == [int(p.stem) for p in segment_files(tmp_path)]
        assert all(path.name == f"{first:020d}.wal" for first, path, _ in segments)
        assert sum(size for _, _, size in segments) == sum(
            len(segment_bytes(p)) for p in segment_files(tmp_path)
        )
    finally:
        await wal.close()


@pytest.mark.parametrize(
    "damage",
    ["garbage", "zeros", "half_header", "half_payload", "bad_crc", "huge_length"],
)
async def test_torn_tail_is_truncated(tmp_path: Path, damage: str) -> None:
    await write_records(tmp_path, 60)
    last = segment_files(tmp_path)[-1]
    good_size = last.stat().st_size
    frame = encode_frame(60, payload(60))
    tails = {
        "garbage": bytes(range(7, 250)) * 3,
        "zeros": b"\x00" * 100,
        "half_header": frame[:9],
        "half_payload": frame[:-3],
        "bad_crc": frame[:-1] + bytes([frame[-1] ^ 1]),
        "huge_length": (60).to_bytes(8, "little") + (2**32 - 1).to_bytes(4, "little") + b"\x00" * 20,
    }
    with last.open("ab") as f:
        f.write(tails[damage])
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert last.stat().st_size == good_size
        assert wal.truncated == [(last, good_size + len(tails[damage]), good_size)]
        assert wal.next_offset == 60
        assert await wal.append([b"after"]) == 60
        got = await read_all(wal.reader(0), 61)
        assert got == [(i, payload(i)) for i in range(60)] + [(60, b"after")]
    finally:
        await wal.close()


async def test_crash_tail_above_the_high_water_mark_is_truncated(tmp_path: Path) -> None:
    # A crash leaves frames the checkpoint does not cover yet (it lags by up to a second): a torn frame
    # there was never acknowledged, so it is cut off as before and its offset is used again.
    await write_records(tmp_path, 60)
    write_checkpoint(tmp_path, Checkpoint(50))
    last = segment_files(tmp_path)[-1]
    res = scan_frames(last.read_bytes(), expect_offset=int(last.stem))
    last_frame_offset, _, last_frame_pos = res.frames[-1]
    os.truncate(last, last_frame_pos + HEADER_SIZE + 2)
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert last_frame_offset == 59
        assert wal.next_offset == 59
        assert wal.lost_ranges == [] and wal.holes() == []
        assert last.stat().st_size == last_frame_pos
        assert await read_all(wal.reader(0), 59) == [(i, payload(i)) for i in range(59)]
    finally:
        await wal.close()


async def test_valid_frame_with_wrong_offset_in_last_segment_is_kept_and_skipped(tmp_path: Path) -> None:
    await write_records(tmp_path, 10)
    last = segment_files(tmp_path)[-1]
    stray = encode_frame(500, b"a checksum-valid record")
    with last.open("ab") as f:
        f.write(stray)
    size = last.stat().st_size
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert last.stat().st_size == size  # not dropped: the file is left as it is
        resume = 10 + len(stray) // HEADER_SIZE  # past any frame the kept bytes could hold
        assert wal.next_offset == resume
        assert wal.holes() == [(10, resume)]
        assert await wal.append([b"x"]) == resume
        reader = wal.reader(0)
        assert await read_all(reader, resume + 1) == [(i, payload(i)) for i in range(10)] + [(resume, b"x")]
        assert reader.skipped == [(10, resume - 1)]
    finally:
        await wal.close()


async def test_start_offset_on_empty_directory_and_persisted(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(), start_offset=1000)
    assert (wal.next_offset, wal.first_offset, wal.committed_offset) == (1000, 1000, 1000)
    await wal.close()
    # the start offset is recorded by the (empty) active segment's name: never reused
    wal = await Wal.open(tmp_path, WalConfig())
    assert wal.next_offset == 1000
    assert await wal.append([b"x"]) == 1000
    await wal.close()
    assert file_records(tmp_path) == [(1000, b"x")]


async def test_start_offset_smaller_than_existing_is_ignored(tmp_path: Path) -> None:
    await write_records(tmp_path, 20)
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS, start_offset=5)
    try:
        assert wal.next_offset == 20
        assert wal.first_offset == 0
        assert await wal.append([b"x"]) == 20
    finally:
        await wal.close()


async def test_start_offset_beyond_existing_frames(tmp_path: Path) -> None:
    await write_records(tmp_path, 20)
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS, start_offset=50)
    try:
        assert wal.next_offset == 50
        # offsets 20..49 are not stored here: the locally readable range starts at 50
        assert wal.first_offset == 50
        assert await wal.append([b"x"]) == 50
        assert await wal.reader(50).read() == [(50, b"x")]
        with pytest.raises(OffsetOutOfRange):
            await wal.reader(10).read()
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert (wal.next_offset, wal.first_offset) == (51, 50)
    finally:
        await wal.close()


async def test_empty_last_segment_after_rotation_crash(tmp_path: Path) -> None:
    await write_records(tmp_path, 30)
    (tmp_path / f"{30:020d}.wal").touch()
    wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert wal.next_offset == 30
        assert await wal.append([b"x"]) == 30
        assert await read_all(wal.reader(0), 31) == [(i, payload(i)) for i in range(30)] + [(30, b"x")]
    finally:
        await wal.close()


@pytest.mark.parametrize("damage", ["truncate", "bad_header", "bad_length"])
async def test_damaged_closed_segment_loads_and_its_range_is_skipped(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    await write_records(tmp_path, 100)
    files = segment_files(tmp_path)
    assert len(files) >= 3
    victim = files[1]
    victim_first, next_first = int(victim.stem), int(files[2].stem)
    data = victim.read_bytes()
    second = HEADER_SIZE + int.from_bytes(data[8:12], "little")
    damaged = bytearray(data)
    if damage == "truncate":
        damaged = damaged[:-5]
        readable_end = next_first - 1  # the last frame is cut
    elif damage == "bad_header":
        damaged[second : second + 8] = (10**9).to_bytes(8, "little")
        readable_end = victim_first + 1
    else:
        damaged[second + 11] ^= 0x40  # the length field of the second frame now says 1 GiB
        readable_end = victim_first + 1
    victim.write_bytes(bytes(damaged))
    with caplog.at_level(logging.ERROR, logger="ister.storage.wal"):
        wal = await Wal.open(tmp_path, SMALL_SEGMENTS)
    try:
        assert victim.stat().st_size == len(damaged)  # nothing was repaired or dropped
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and victim.name in r.getMessage()]
        assert len(errors) == 1
        assert wal.holes() == [(readable_end, next_first)]
        assert (wal.first_offset, wal.next_offset) == (0, 100)
        reader = wal.reader(0)
        got = await read_all(reader, 100)
        expected = [i for i in range(100) if not readable_end <= i < next_first]
        assert [o for o, _ in got] == expected
        assert all(p == payload(o) for o, p in got)
        assert reader.skipped == [(readable_end, next_first - 1)]
        assert await wal.append([b"more"]) == 100
    finally:
        await wal.close()


async def test_overlapping_segments_raise(tmp_path: Path) -> None:
    await write_records(tmp_path, 100)
    files = segment_files(tmp_path)
    second_first = int(files[1].stem)
    files[1].rename(tmp_path / f"{second_first - 1:020d}.wal")
    with pytest.raises(CorruptionError):
        await Wal.open(tmp_path, SMALL_SEGMENTS)


# ---- crash: kill -9 under load ----------------------------------------------------------------------

CHILD = r"""
import asyncio, sys
from pathlib import Path
from ister.storage.wal import Wal, WalConfig

async def main() -> None:
    wal = await Wal.open(Path(sys.argv[1]), WalConfig(segment_max_bytes=16 * 1024))
    async def worker(w: int) -> None:
        i = 0
        while True:
            item = f"w{w}-{i}".encode()
            first = await wal.append([item, item + b"!"])
            sys.stdout.write(f"{first} {item.decode()}\n")
            sys.stdout.flush()
            i += 1
    await asyncio.gather(*(worker(w) for w in range(8)))

asyncio.run(main())
"""


def run_child_and_kill(directory: Path, min_acks: int) -> list[tuple[int, bytes]]:
    """Start CHILD, SIGKILL it once it acknowledged `min_acks` appends; return every acknowledgement."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: list[tuple[int, bytes]] = []
    try:
        assert proc.stdout is not None
        while len(acked) < min_acks:
            line = proc.stdout.readline()
            if not line:
                break
            first, item = line.split()
            acked.append((int(first), item.encode()))
        assert len(acked) >= min_acks, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    for line in rest.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():  # the last line may be cut by the kill
            acked.append((int(parts[0]), parts[1].encode()))
    return acked


async def test_kill_9_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    acked = run_child_and_kill(directory, 1500)
    wal = await Wal.open(directory, WalConfig(segment_max_bytes=16 * 1024))
    try:
        end = wal.next_offset
        assert end >= max(first for first, _ in acked) + 2
        stored = dict(await read_all(wal.reader(0), end))
        assert sorted(stored) == list(range(end))  # dense from 0, nothing after a hole
        for first, item in acked:
            assert stored[first] == item
            assert stored[first + 1] == item + b"!"
        assert await wal.append([b"after crash"]) == end
    finally:
        await wal.close()
