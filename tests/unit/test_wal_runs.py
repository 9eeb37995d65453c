"""Runs of WAL records read from their segment file by another process (the table worker): the pure frame
split from a position (core/frames.py) and `storage/wal/runs.py`'s locate and read_run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ister.core.frames import HEADER_SIZE, encode_frames, split_dense, split_dense_from
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.runs import RunUnreadable, WalRun, locate, read_run


def payload(i: int) -> bytes:
    return b"record-%06d" % i


def frames(first: int, n: int) -> bytes:
    return encode_frames(first, [payload(i) for i in range(first, first + n)])


# ---- split_dense_from (pure) -------------------------------------------------------------------------------


def test_split_from_a_position_returns_the_payloads_and_the_end() -> None:
    lead = frames(0, 3)
    buf = lead + frames(3, 5)
    payloads, end, needed, problem = split_dense_from(buf, len(lead), 3, 100)
    assert payloads == [payload(i) for i in range(3, 8)]
    assert (end, needed, problem) == (len(buf), 0, None)
    payloads, end, _, problem = split_dense_from(buf, len(lead), 3, 2)  # at most max_frames
    assert payloads == [payload(3), payload(4)] and problem is None
    assert end == len(lead) + len(frames(3, 2))
    assert split_dense(buf, 0, 100)[:2] == split_dense_from(buf, 0, 0, 100)[:2]


def test_split_from_a_position_stops_at_a_truncated_frame_and_says_what_it_needs() -> None:
    buf = frames(0, 4)
    one = len(frames(0, 1))
    payloads, end, needed, problem = split_dense_from(buf[:-3], one, 1, 100)
    assert payloads == [payload(1), payload(2)] and problem is None
    assert (end, needed) == (3 * one, one)  # the whole last frame
    payloads, end, needed, problem = split_dense_from(buf[: 3 * one + 5], one, 1, 100)
    assert (len(payloads), end, needed, problem) == (2, 3 * one, HEADER_SIZE, None)  # a partial header


def test_split_from_a_position_refuses_a_bad_crc_and_an_offset_gap() -> None:
    buf = bytearray(frames(0, 4))
    one = len(frames(0, 1))
    buf[2 * one + HEADER_SIZE + 1] ^= 0xFF  # a payload byte of offset 2
    payloads, end, _, problem = split_dense_from(bytes(buf), one, 1, 100)
    assert (payloads, end, problem) == ([payload(1)], 2 * one, "crc")
    gap = frames(0, 2) + frames(3, 2)  # offset 2 missing
    payloads, end, _, problem = split_dense_from(gap, one, 1, 100)
    assert (payloads, end, problem) == ([payload(1)], 2 * one, "gap")
    payloads, end, _, problem = split_dense_from(gap, one, 7, 100)  # the first frame already unexpected
    assert (payloads, end, problem) == ([], one, "gap")


# ---- locate and read_run (files of a real WAL) -------------------------------------------------------------


async def filled(path: Path, n: int, config: WalConfig | None = None) -> Wal:
    wal = await Wal.open(path, config or WalConfig(cache_max_bytes=0))
    for i in range(0, n, 100):
        await wal.append([payload(j) for j in range(i, min(n, i + 100))])
    return wal


async def test_a_run_is_read_from_an_indexed_frame_in_small_chunks(tmp_path: Path) -> None:
    wal = await filled(tmp_path, 2500)  # the sparse index has an entry every 1,000 frames
    try:
        run = locate(wal, 1500, 2300)
        assert run is not None and (run.at, run.first, run.end, run.count) == (1000, 1500, 2300, 800)
        assert run.position > 0
        for chunk in (7, 100, 1 << 20):  # refills inside headers, payloads and the skipped frames
            assert read_run(run, chunk) == [payload(i) for i in range(1500, 2300)]
        whole = locate(wal, 0, 2500)  # the active segment, up to the committed offset
        assert whole is not None and whole.position == 0
        assert read_run(whole) == [payload(i) for i in range(2500)]
    finally:
        await wal.close()


async def test_locate_declines_what_one_file_does_not_hold(tmp_path: Path) -> None:
    wal = await filled(tmp_path, 600, WalConfig(cache_max_bytes=0, segment_max_bytes=4096))
    try:
        bounds = [first for first, _, _ in wal.segments()]
        assert len(bounds) > 2
        assert locate(wal, 0, bounds[1]) is not None  # one whole closed segment
        assert locate(wal, 0, bounds[1] + 1) is None  # crossing into the next one
        assert locate(wal, 590, 601) is None  # past the committed offset
        assert locate(wal, 5, 5) is None
        wal.damage.note_damaged(bounds[1] + 3, bounds[1] + 4, "test")  # a hole in the second segment
        assert locate(wal, bounds[1], bounds[1] + 3) is not None
        assert locate(wal, bounds[1], bounds[1] + 4) is None
        await wal.drop_segments([wal.segments()[0][1]])
        assert locate(wal, 0, 10) is None  # below the WAL's first offset
    finally:
        await wal.close()


async def test_read_run_refuses_a_file_gone_short_damaged_or_not_as_located(tmp_path: Path) -> None:
    wal = await filled(tmp_path, 300, WalConfig(cache_max_bytes=0, segment_max_bytes=2048))
    try:
        first, path, _ = wal.segments()[0]
        end = wal.segments()[1][0]
        run = locate(wal, first, end)
        assert run is not None and read_run(run) == [payload(i) for i in range(first, end)]
        data = path.read_bytes()
        path.write_bytes(data[:-5])  # truncated: ends inside the last frame
        with pytest.raises(RunUnreadable, match="ends at byte"):
            read_run(run)
        damaged = bytearray(data)
        damaged[len(frames(0, 10)) + HEADER_SIZE + 2] ^= 0xFF  # a payload byte of offset 10
        path.write_bytes(bytes(damaged))
        assert read_run(locate(wal, 0, 10) or run) == [payload(i) for i in range(10)]  # before it: fine
        with pytest.raises(RunUnreadable, match="crc"):
            read_run(run)
        path.write_bytes(data)
        with pytest.raises(RunUnreadable, match="gap"):  # a position that is not offset `at`'s frame
            read_run(WalRun(run.path, len(frames(0, 4)), 3, 5, 8))
        with pytest.raises(RunUnreadable, match="gap"):
            read_run(WalRun(run.path, len(frames(0, 4)), 5, 5, 8))
        os.unlink(path)  # deleted by retention
        with pytest.raises(RunUnreadable, match="gone"):
            read_run(run)
    finally:
        await wal.close()
