"""Wal.truncate / Wal.reset (follower replicas): where the cut lands, readers, cache, holes, reopen."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ister.core.frames import scan_frames
from ister.errors import LogTruncated, OffsetOutOfRange, StorageError
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal import reader as reader_module
from ister.storage.wal.cache import RecordCache
from ister.storage.wal.checkpoint import read_checkpoint
from ister.storage.wal.holes import Holes
from ister.storage.wal.truncate import INTENT_NAME

SEGMENTS = WalConfig(segment_max_bytes=2048)
COLD = WalConfig(segment_max_bytes=2048, cache_max_bytes=0)


def payload(i: int, tag: str = "old") -> bytes:
    return f"{tag}-{i:06d}".encode()


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


async def append_range(wal: Wal, first: int, end: int, tag: str = "old") -> None:
    for i in range(first, end, 10):
        got = await wal.append([payload(j, tag) for j in range(i, min(end, i + 10))])
        assert got == i


async def read_all(wal: Wal, start: int = -1) -> list[tuple[int, bytes]]:
    reader = wal.reader(wal.first_offset if start < 0 else start)
    out: list[tuple[int, bytes]] = []
    while reader.next_offset < wal.committed_offset:
        batch = await reader.read(max_records=97, timeout=5)
        assert batch, f"reader stalled at {reader.next_offset}"
        out.extend(batch)
    assert reader.skipped == []
    return out


def old(first: int, end: int) -> list[tuple[int, bytes]]:
    return [(i, payload(i)) for i in range(first, end)]


def dir_contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def frames_on_disk(directory: Path) -> list[int]:
    """Offsets of every frame in every segment file (all must be valid, dense per file)."""
    out: list[int] = []
    for path in segment_files(directory):
        data = path.read_bytes()
        res = scan_frames(data, expect_offset=int(path.stem))
        assert res.stop == "end", f"{path.name}: {res.stop}"
        out += [o for o, _, _ in res.frames]
    return out


async def new_wal(directory: Path, n: int, config: WalConfig = SEGMENTS) -> Wal:
    wal = await Wal.open(directory, config)
    await append_range(wal, 0, n)
    return wal


async def check_reopen(directory: Path, expect: list[tuple[int, bytes]], next_offset: int) -> None:
    wal = await Wal.open(directory, SEGMENTS)
    try:
        assert wal.next_offset == next_offset
        assert wal.holes() == [] and wal.lost_ranges == []
        assert await read_all(wal) == expect
    finally:
        await wal.close()


def mid_segment_offset(wal: Wal) -> int:
    first, end = wal.record_ranges()[1]
    return (first + end) // 2


# ---- where the cut lands ---------------------------------------------------------------------------------


INTERVAL = WalConfig(segment_max_bytes=2048, fsync="interval", fsync_interval_ms=5000)


@pytest.mark.parametrize(
    "config", [SEGMENTS, COLD, INTERVAL], ids=["cache_warm", "cache_cold", "fsync_interval"]
)
async def test_truncate_in_the_middle_of_a_segment(tmp_path: Path, config: WalConfig) -> None:
    wal = await new_wal(tmp_path, 400, config)
    try:
        end = mid_segment_offset(wal)
        files_before = len(segment_files(tmp_path))
        await wal.truncate(end)
        assert (wal.next_offset, wal.committed_offset, wal.synced_offset) == (end, end, end)
        assert wal.record_ranges()[-1][1] == end
        assert len(segment_files(tmp_path)) < files_before
        assert frames_on_disk(tmp_path) == list(range(end))
        ckpt = read_checkpoint(tmp_path)
        assert ckpt is not None and ckpt.next_offset == end and ckpt.lost == ()
        assert not (tmp_path / INTENT_NAME).exists()
        assert await read_all(wal) == old(0, end)
        # appends continue densely at the cut, with new payloads
        await append_range(wal, end, end + 25, "new")
        assert await read_all(wal, end - 3) == old(end - 3, end) + [
            (i, payload(i, "new")) for i in range(end, end + 25)
        ]
    finally:
        await wal.close()
    await check_reopen(
        tmp_path, old(0, end) + [(i, payload(i, "new")) for i in range(end, end + 25)], end + 25
    )


async def test_truncate_at_a_segment_boundary_keeps_an_empty_active_segment(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 400)
    try:
        end = wal.record_ranges()[2][0]
        await wal.truncate(end)
        assert wal.segments()[-1][0] == end and wal.active_bytes == 0
        assert segment_files(tmp_path)[-1].name == f"{end:020d}.wal"
        assert frames_on_disk(tmp_path) == list(range(end))
        assert await wal.append([b"x"]) == end
    finally:
        await wal.close()
    await check_reopen(tmp_path, [*old(0, end), (end, b"x")], end + 1)


async def test_truncate_at_next_offset_changes_nothing(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 200)
    try:
        before = {p.name: p.read_bytes() for p in segment_files(tmp_path)}
        reader = wal.reader(200)
        await wal.truncate(200)
        assert wal.next_offset == 200
        assert {p.name: p.read_bytes() for p in segment_files(tmp_path)} == before
        assert await wal.append([b"x"]) == 200
        assert await reader.read(timeout=5) == [(200, b"x")]
    finally:
        await wal.close()


async def test_truncate_to_the_first_offset_empties_the_log(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, SEGMENTS, start_offset=1000)
    try:
        await append_range(wal, 1000, 1300)
        await wal.truncate(1000)
        assert (wal.first_offset, wal.next_offset) == (1000, 1000)
        assert wal.record_ranges() == []
        assert [p.name for p in segment_files(tmp_path)] == [f"{1000:020d}.wal"]
        assert await read_all(wal) == []
        assert await wal.append([b"a", b"b"]) == 1000
    finally:
        await wal.close()
    await check_reopen(tmp_path, [(1000, b"a"), (1001, b"b")], 1002)


async def test_truncate_across_several_segments_then_again(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 800)
    try:
        assert wal.segment_count > 5
        end = wal.record_ranges()[0][1] - 7  # inside the first segment
        await wal.truncate(end)
        assert wal.segment_count == 1 and len(segment_files(tmp_path)) == 1
        await append_range(wal, end, end + 300, "new")  # rotates again
        assert wal.segment_count > 1
        await wal.truncate(end + 150)
        expect = old(0, end) + [(i, payload(i, "new")) for i in range(end, end + 150)]
        assert await read_all(wal) == expect
    finally:
        await wal.close()
    await check_reopen(tmp_path, expect, end + 150)


async def test_bad_bounds_raise_value_error_and_change_nothing(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, SEGMENTS, start_offset=100)
    try:
        await append_range(wal, 100, 200)
        before = dir_contents(tmp_path)
        for end in (99, 201, -1):
            with pytest.raises(ValueError, match="truncate"):
                await wal.truncate(end)
        with pytest.raises(ValueError):
            await wal.reset(-1)
        assert dir_contents(tmp_path) == before
        assert wal.next_offset == 200 and await wal.append([b"x"]) == 200
    finally:
        await wal.close()


# ---- readers, cache, concurrent appends -------------------------------------------------------------------


async def test_readers_past_the_cut_raise_and_the_others_read_the_new_records(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 300)
    try:
        end = 250
        live = wal.reader(300)
        waiting = asyncio.create_task(live.read(timeout=30))  # parked for new records
        past = wal.reader(260)
        at_end = wal.reader(end)
        below = wal.reader(240)
        assert await below.read(max_records=5) == old(240, 245)
        await wal.truncate(end)
        with pytest.raises(LogTruncated, match="truncated to offset 250"):
            await waiting
        for reader in (live, past):
            with pytest.raises(LogTruncated):
                await reader.read(timeout=0)
        await append_range(wal, end, 300, "new")
        with pytest.raises(LogTruncated):  # still: it returned records that are gone
            await past.read(timeout=0)
        got = await below.read(max_records=100, timeout=5)
        assert got == old(245, 250) + [(i, payload(i, "new")) for i in range(250, 300)]
        assert await at_end.read(max_records=100, timeout=5) == [
            (i, payload(i, "new")) for i in range(250, 300)
        ]
        fresh = wal.reader(260)  # a reader made after the cut is fine
        assert (await fresh.read(max_records=1)) == [(260, payload(260, "new"))]
    finally:
        await wal.close()


async def test_the_cache_never_serves_cut_records(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 300)
    try:
        assert wal.stats()["cache_first_offset"] == 0  # everything is cached
        cache_bytes = wal.stats()["cache_bytes"]
        await wal.truncate(123)
        assert wal.stats()["cache_bytes"] < cache_bytes
        await append_range(wal, 123, 200, "new")
        assert await read_all(wal) == old(0, 123) + [(i, payload(i, "new")) for i in range(123, 200)]
    finally:
        await wal.close()


async def test_appends_in_flight_finish_first_and_appends_during_the_cut_are_refused(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 100)
    try:
        in_flight = asyncio.ensure_future(wal.append([b"in-flight"]))  # offset 100, queued
        cut = asyncio.create_task(wal.truncate(50))
        await asyncio.sleep(0)  # the cut has started (it waits for the flush)
        with pytest.raises(StorageError, match="being truncated"):
            await wal.append([b"refused"])
        with pytest.raises(StorageError, match="being truncated"):
            await wal.truncate(40)
        with pytest.raises(StorageError, match="being truncated"):
            await wal.rotate()
        assert await wal.drop_segments([p for _, p, _ in wal.segments()]) == 0
        assert await in_flight == 100  # acknowledged, then cut
        await cut
        assert wal.next_offset == 50
        assert await wal.append([b"after"]) == 50
    finally:
        await wal.close()


async def test_a_cancelled_truncate_still_completes(tmp_path: Path) -> None:
    wal = await new_wal(tmp_path, 200)
    try:
        past = wal.reader(150)
        task = asyncio.create_task(wal.truncate(100))
        await asyncio.sleep(0)  # let it start: nothing to flush, so the cut is now with the writer
        assert wal._cutting and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(LogTruncated):  # a read waits for the running cut, then sees it
            await past.read(timeout=10)
        assert wal.next_offset == 100 and not wal._cutting
        assert await wal.append([b"x"]) == 100
    finally:
        await wal.close()
    await check_reopen(tmp_path, [*old(0, 100), (100, b"x")], 101)


# ---- holes and lost ranges --------------------------------------------------------------------------------


async def make_lost_range(directory: Path) -> tuple[int, int]:
    """A WAL whose checkpoint records a lost range [lost_from, 300); 300..309 appended after it."""
    wal = await new_wal(directory, 300)
    await wal.close()
    last = segment_files(directory)[-1]
    res = scan_frames(last.read_bytes(), expect_offset=int(last.stem))
    lost_from, _, pos = res.frames[len(res.frames) // 2]
    os.truncate(last, pos)
    wal = await Wal.open(directory, SEGMENTS)
    assert wal.lost_ranges == [(lost_from, 300)]
    await append_range(wal, 300, 310)
    await wal.close()
    return lost_from, 300


async def test_truncate_inside_a_lost_range_keeps_its_start_and_forgets_the_rest(tmp_path: Path) -> None:
    lost_from, _lost_end = await make_lost_range(tmp_path)
    end = lost_from + 5
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        await wal.truncate(end)
        assert wal.holes() == [(lost_from, end)] and wal.lost_ranges == [(lost_from, end)]
        ckpt = read_checkpoint(tmp_path)
        assert ckpt is not None and ckpt.next_offset == end and ckpt.lost == ((lost_from, end),)
        assert segment_files(tmp_path)[-1].name == f"{end:020d}.wal"  # a new empty segment at the cut
        assert await wal.append([b"x"]) == end
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert (wal.first_offset, wal.next_offset) == (0, end + 1)
        assert wal.holes() == [(lost_from, end)]
        reader = wal.reader(0)
        got: list[tuple[int, bytes]] = []
        while reader.next_offset < end + 1:
            got += await reader.read(max_records=500, timeout=5)
        assert got == [*old(0, lost_from), (end, b"x")]
        assert reader.skipped == [(lost_from, end - 1)]
    finally:
        await wal.close()


async def test_truncate_below_a_lost_range_forgets_it(tmp_path: Path) -> None:
    lost_from, _ = await make_lost_range(tmp_path)
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        await wal.truncate(lost_from - 10)
        assert wal.holes() == [] and wal.lost_ranges == []
        await append_range(wal, lost_from - 10, lost_from + 40, "new")
    finally:
        await wal.close()
    expect = old(0, lost_from - 10) + [(i, payload(i, "new")) for i in range(lost_from - 10, lost_from + 40)]
    await check_reopen(tmp_path, expect, lost_from + 40)


# ---- reset and open(start_offset) -------------------------------------------------------------------------


async def test_open_at_a_later_start_offset_keeps_the_old_files(tmp_path: Path) -> None:
    """Why a follower needs reset(): open(start_offset=X) moves the next offset to X, but the old segment
    files stay in the directory (listed by segments(), seen by a superseded-WAL export) and a lower X is
    ignored."""
    wal = await new_wal(tmp_path, 300)
    await wal.close()
    wal = await Wal.open(tmp_path, SEGMENTS, start_offset=1000)
    try:
        assert (wal.first_offset, wal.next_offset) == (1000, 1000)
        assert len(wal.segments()) > 1 and wal.segments()[0][0] == 0
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, SEGMENTS, start_offset=10)
    try:
        assert wal.next_offset == 1000
    finally:
        await wal.close()


@pytest.mark.parametrize("start", [5000, 120, 0])
async def test_reset_drops_every_record_and_restarts_at_start(tmp_path: Path, start: int) -> None:
    lost_from, _ = await make_lost_range(tmp_path)
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        below = wal.reader(min(start, wal.next_offset) - 1) if start > 0 else None
        past = wal.reader(start + 1) if start + 1 <= wal.next_offset else None
        await wal.reset(start)
        assert (wal.first_offset, wal.next_offset, wal.committed_offset) == (start, start, start)
        assert wal.holes() == [] and wal.lost_ranges == [] and wal.record_ranges() == []
        assert [p.name for p in segment_files(tmp_path)] == [f"{start:020d}.wal"]
        ckpt = read_checkpoint(tmp_path)
        assert ckpt is not None and (ckpt.next_offset, ckpt.lost) == (start, ())
        if below is not None:
            with pytest.raises(OffsetOutOfRange):
                await below.read(timeout=0)
        if past is not None:
            with pytest.raises(LogTruncated):
                await past.read(timeout=0)
        await append_range(wal, start, start + 30, "new")
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert (wal.first_offset, wal.next_offset) == (start, start + 30)
        assert wal.holes() == []
        assert await read_all(wal) == [(i, payload(i, "new")) for i in range(start, start + 30)]
    finally:
        await wal.close()
    assert lost_from > 0


async def damage_second_segment(directory: Path) -> tuple[int, int]:
    """A closed segment whose frame k has a bad header: the file reads up to k, [k, next file) is damaged."""
    wal = await new_wal(directory, 400)
    await wal.close()
    victim = segment_files(directory)[1]
    data = bytearray(victim.read_bytes())
    res = scan_frames(bytes(data), expect_offset=int(victim.stem))
    k, _, pos = res.frames[len(res.frames) // 2]
    data[pos : pos + 8] = (k + 1000).to_bytes(8, "little")
    victim.write_bytes(bytes(data))
    return k, int(segment_files(directory)[2].stem)


@pytest.mark.parametrize("where", ["at_the_damage", "inside_it"])
async def test_truncate_in_a_damaged_closed_segment(tmp_path: Path, where: str) -> None:
    k, next_first = await damage_second_segment(tmp_path)
    end = k if where == "at_the_damage" else k + 3
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert wal.holes() == [(k, next_first)]
        await wal.truncate(end)
        # at the damage the file is cut there (its bad bytes go); inside it a new segment starts at the cut
        assert wal.holes() == ([] if end == k else [(k, end)])
        last = segment_files(tmp_path)[-1]
        if end == k:
            assert int(last.stem) < k and frames_on_disk(tmp_path) == list(range(k))
        else:
            assert int(last.stem) == end and last.stat().st_size == 0
        assert await wal.append([b"x"]) == end
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert wal.next_offset == end + 1
        assert wal.holes() == ([] if end == k else [(k, end)])
        reader = wal.reader(0)
        got: list[tuple[int, bytes]] = []
        while reader.next_offset < end + 1:
            got += await reader.read(max_records=500, timeout=5)
        assert got == [*old(0, k), (end, b"x")]
    finally:
        await wal.close()


@pytest.mark.parametrize("who", ["reader", "verify"])
async def test_a_file_read_overlapping_a_cut_is_not_taken_for_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    wal = await new_wal(tmp_path, 400, COLD)
    try:
        victim_first, victim_end = wal.record_ranges()[3]
        end = wal.record_ranges()[1][0] + 3
        entered, release = threading.Event(), threading.Event()
        real = reader_module.read_segments

        def held(*args: Any) -> Any:
            entered.set()
            assert release.wait(10)
            return real(*args)  # the file is gone or cut by now

        monkeypatch.setattr(reader_module, "read_segments", held)
        if who == "reader":
            task: asyncio.Task[Any] = asyncio.create_task(wal.reader(victim_first + 2).read(timeout=10))
        else:
            task = asyncio.create_task(wal.verify_segment(victim_first))
        assert await asyncio.to_thread(entered.wait, 10)
        await asyncio.wait_for(wal.truncate(end), 10)  # completes while the read is held
        release.set()
        if who == "reader":
            with pytest.raises(LogTruncated):
                await task
        else:
            assert await task == []
        assert wal.holes() == []
        assert victim_end > end
    finally:
        await wal.close()


# ---- the in-memory pieces ----------------------------------------------------------------------------------


def test_record_cache_truncate_keeps_the_prefix_and_its_byte_count() -> None:
    def filled() -> RecordCache:
        cache = RecordCache(1 << 20)
        for first, n in ((0, 10), (10, 10), (20, 5)):
            items = [payload(i) for i in range(first, first + n)]
            cache.add(first, items, sum(map(len, items)))
        return cache

    for end in (25, 30, 15, 10, 1, 0):
        cache = filled()
        cache.truncate(end)
        kept = min(end, 25)
        assert cache.end_offset == kept
        got = cache.read(0, kept, 100, 1 << 20) if kept else None
        assert got == (old(0, kept) if kept else None)
        items = [payload(i) for i in range(kept)]
        if kept:  # the same bytes as a cache that only ever held the prefix, chunked the same way
            fresh = RecordCache(1 << 20)
            for first in range(0, kept, 10):
                chunk = items[first : first + 10]
                fresh.add(first, chunk, sum(map(len, chunk)))
            assert cache.nbytes == fresh.nbytes
        else:
            assert cache.nbytes == 0
        cache.add(kept, [b"n"], 1)  # appends continue at the cut
        assert cache.read(kept, kept + 1, 10, 100) == [(kept, b"n")]


def test_holes_cut_forgets_above_and_clips_across() -> None:
    holes = Holes("/t/x")
    holes.add(10, 20, lost=True, why="a")
    holes.add(30, 40, lost=False, why="b")
    holes.add(50, 60, lost=True, why="c")
    holes.cut(35)
    assert holes.ranges() == [(10, 20), (30, 35)]
    assert holes.lost_ranges() == ((10, 20),)
    holes.cut(30)
    assert holes.ranges() == [(10, 20)]
    holes.cut(5)
    assert holes.ranges() == [] and not holes
