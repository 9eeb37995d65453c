"""Shipping WAL frames as they are (a replicated leader to its followers): the leader's `FrameTail` and
reader runs, the follower's `append_frames`, the frames check, and offsets kept exact when a disk fills."""

from __future__ import annotations

import asyncio
import errno
import random
from pathlib import Path

import pytest
from crc32c import crc32c

from ister.core.frames import encode_frames, scan_frames
from ister.errors import DiskFull, StorageError
from ister.replication.follower import check_frames
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.frametail import FrameRun, FrameTail
from ister.storage.wal.writer import WalWriter
from tests.support import segment_bytes
from tests.unit.test_wal import file_records


def records(first: int, n: int) -> list[bytes]:
    return [b"rec-%d" % i for i in range(first, first + n)]


# ---- FrameTail ------------------------------------------------------------------------------------------


def test_frame_tail_serves_whole_appends_from_their_first_offset() -> None:
    tail = FrameTail(1 << 20)
    tail.add(10, 2, encode_frames(10, records(10, 2)))
    tail.add(12, 3, encode_frames(12, records(12, 3)))
    run = tail.take(10, 100, 100, 1 << 20)
    assert run is not None and (run.first, run.count, run.end) == (10, 5, 15)
    assert [bytes(p) for _, p, _ in scan_frames(b"".join(run.blobs), expect_offset=10).frames] == records(
        10, 5
    )
    assert tail.take(11, 100, 100, 1 << 20) is None  # inside an append: the caller reads records instead
    assert tail.take(15, 100, 100, 1 << 20) is None  # nothing there yet
    assert tail.take(9, 100, 100, 1 << 20) is None
    # Limits: by end, by record count, by bytes (at least one append).
    run = tail.take(10, 14, 100, 1 << 20)
    assert run is not None and run.count == 2
    run = tail.take(10, 100, 4, 1 << 20)
    assert run is not None and run.count == 2
    assert tail.take(10, 100, 1, 1 << 20) is None  # the first append alone is over the record limit
    run = tail.take(10, 100, 100, 1)
    assert run is not None and run.count == 2


def test_frame_tail_is_bounded_trimmed_truncated_and_restarts_on_a_gap() -> None:
    one = len(encode_frames(0, records(0, 1)))
    tail = FrameTail(3 * one)
    for i in range(5):
        tail.add(i, 1, encode_frames(i, records(i, 1)))
    assert tail.nbytes <= 3 * one and tail.first_offset == 2 and tail.end_offset == 5
    tail.trim(4)
    assert (tail.first_offset, len(tail)) == (4, 1)
    tail.add(5, 1, encode_frames(5, records(5, 1)))
    tail.truncate(5)
    assert (tail.first_offset, tail.end_offset) == (4, 5)
    tail.add(9, 1, encode_frames(9, records(9, 1)))  # not after 5: the tail starts again there
    assert (tail.first_offset, tail.end_offset, len(tail)) == (9, 10, 1)
    tail.truncate(0)
    assert len(tail) == 0 and tail.nbytes == 0 and tail.take(9, 10, 10, 10) is None


def test_frame_tail_matches_a_model_under_random_operations() -> None:
    """Seeded: whatever `take` returns is exactly the frames of the offsets it names."""
    for seed in range(200):
        rng = random.Random(seed)
        tail = FrameTail(rng.choice([64, 256, 4096]))
        end = rng.randrange(0, 50)
        for _ in range(60):
            op = rng.random()
            if op < 0.6:
                n = rng.randrange(1, 5)
                tail.add(end, n, encode_frames(end, records(end, n)))
                end += n
            elif op < 0.7:
                tail.trim(rng.randrange(0, end + 1))
            elif op < 0.8 and end:
                end = rng.randrange(0, end + 1)
                tail.truncate(end)
            start = rng.randrange(0, end + 2)
            run = tail.take(start, end, rng.randrange(1, 10), rng.randrange(1, 200))
            if run is not None:
                assert run.first == start and run.end <= end
                frames = scan_frames(b"".join(run.blobs), expect_offset=start)
                assert frames.stop == "end" and frames.count == run.count
                assert [bytes(p) for _, p, _ in frames.frames] == records(start, run.count)


# ---- the WAL: leader side -------------------------------------------------------------------------------


async def test_a_leader_reader_gets_committed_appends_as_their_frames(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        await wal.append(records(0, 3))  # before keep_frames: only as records
        wal.keep_frames(1 << 20)
        await wal.append(records(3, 2))
        await wal.append(records(5, 4))
        reader = wal.reader(0, durable=True)
        got = await reader.read_run(100, 1 << 20, 1.0)
        assert got == list(enumerate(records(0, 3)))
        run = await reader.read_run(100, 1 << 20, 1.0)
        assert isinstance(run, FrameRun) and (run.first, run.count) == (3, 6)
        assert b"".join(run.blobs) == segment_bytes(tmp_path / "00000000000000000000.wal")[-run.nbytes :]
        assert await reader.read_run(100, 1 << 20, 0.05) == []  # nothing new
        wal.keep_frames(0)
        await wal.append(records(9, 1))
        assert await reader.read_run(100, 1 << 20, 1.0) == [(9, b"rec-9")]
    finally:
        await wal.close()


async def test_frames_of_a_cut_log_are_not_served(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        wal.keep_frames(1 << 20)
        await wal.append(records(0, 2))
        await wal.append(records(2, 2))
        await wal.truncate(2)
        assert wal.frames(2, 10, 10, 1 << 20) is None
        await wal.append([b"other-2", b"other-3"])
        run = wal.frames(2, 10, 10, 1 << 20)
        assert run is not None
        assert [bytes(p) for _, p, _ in scan_frames(b"".join(run.blobs)).frames] == [b"other-2", b"other-3"]
        await wal.reset(50)
        assert wal.frames(0, 100, 10, 1 << 20) is None and wal.frames(2, 100, 10, 1 << 20) is None
    finally:
        await wal.close()


# ---- the WAL: follower side -----------------------------------------------------------------------------


async def test_append_frames_writes_them_as_they_are_and_recovers_them(tmp_path: Path) -> None:
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    leader = await Wal.open(leader_dir, WalConfig())
    follower = await Wal.open(follower_dir, WalConfig())
    try:
        leader.keep_frames(1 << 20)
        for first, n in ((0, 3), (3, 1), (4, 5)):
            await leader.append(records(first, n))
        run = leader.frames(0, 100, 100, 1 << 20)
        assert run is not None and run.count == 9
        assert await follower.append_frames(0, 9, b"".join(run.blobs)) == 0
        assert (follower.next_offset, follower.durable_offset) == (9, 9)
        with pytest.raises(StorageError, match="do not follow its end 9"):
            await follower.append_frames(3, 1, encode_frames(3, records(3, 1)))
        with pytest.raises(ValueError):
            await follower.append_frames(9, 2, b"short")
        assert follower.next_offset == 9
        # Not cached, but readable from the files, and identical to the leader's.
        reader = follower.reader(0)
        got: list[tuple[int, bytes]] = []
        while len(got) < 9:
            got += await reader.read(100, 1 << 20, 1.0)
        assert got == list(enumerate(records(0, 9)))
        await follower.append([b"rec-9"], at=9)
        with pytest.raises(StorageError):
            await follower.append([b"x"], at=3)
    finally:
        await leader.close()
        await follower.close()
    assert file_records(follower_dir) == list(enumerate(records(0, 10)))
    follower = await Wal.open(follower_dir, WalConfig())
    try:
        assert follower.next_offset == 10 and follower.holes() == []
    finally:
        await follower.close()


async def test_a_refused_append_fails_the_ones_queued_behind_it_so_no_record_lands_at_a_wrong_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower appends in order without waiting; when the disk refuses one, the WAL hands its offsets
    back, and every later append (which expected offsets after it) must fail instead of taking them."""
    wal = await Wal.open(tmp_path, WalConfig())
    real = WalWriter._write_all
    full = True

    def refuse(self: WalWriter, buf: bytes) -> None:
        if not full:
            return real(self, buf)
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        await wal.append_frames(0, 2, encode_frames(0, records(0, 2)))
        monkeypatch.setattr(WalWriter, "_write_all", refuse)
        refused = asyncio.ensure_future(wal.append_frames(2, 2, encode_frames(2, records(2, 2))))
        await asyncio.sleep(0)  # submitted
        assert wal.next_offset == 4
        with pytest.raises(DiskFull):
            await refused
        full = False
        assert wal.next_offset == 2
        with pytest.raises(StorageError, match="do not follow"):
            await wal.append_frames(4, 1, encode_frames(4, records(4, 1)))
        with pytest.raises(StorageError, match="do not follow"):
            await wal.append(records(4, 1), at=4)
        assert wal.next_offset == 2
        await wal.append_frames(2, 2, encode_frames(2, records(2, 2)))
    finally:
        await wal.close()
    assert file_records(tmp_path) == list(enumerate(records(0, 4)))


# ---- the follower's check -------------------------------------------------------------------------------


def test_check_frames_accepts_exact_frames_and_names_what_is_wrong() -> None:
    frames = encode_frames(7, records(7, 3))
    assert check_frames(frames, 7, 3, crc32c(frames)) is None
    assert "checksum" in (check_frames(frames, 7, 3, crc32c(frames) ^ 1) or "")
    flipped = bytearray(frames)
    flipped[-1] ^= 0xFF
    assert "checksum" in (check_frames(bytes(flipped), 7, 3, crc32c(frames)) or "")
    assert "offset 7" in (check_frames(frames, 8, 3, crc32c(frames)) or "")  # not from 8
    assert "too short" in (check_frames(frames, 7, 30, crc32c(frames)) or "")
    assert "too short" in (check_frames(b"", 7, 1, crc32c(b"")) or "")
