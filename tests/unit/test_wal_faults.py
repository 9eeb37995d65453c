"""WAL storage faults: a damaged last segment (high-water checkpoint), damaged closed segments, full disk."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ister.core.frames import HEADER_SIZE, scan_frames
from ister.errors import DataLoss, DiskFull, ResourceExhausted
from ister.storage.wal import Wal, WalConfig, WalReader
from ister.storage.wal.checkpoint import CHECKPOINT_NAME, SLOT_SIZE, read_checkpoint
from ister.storage.wal.writer import WalWriter
from ister.wire.status import status_for
from tests.support import small_tmpfs

SEGMENTS = WalConfig(segment_max_bytes=2048)


def payload(i: int) -> bytes:
    return f"record-{i:06d}".encode()


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


async def write_records(directory: Path, n: int, config: WalConfig = SEGMENTS) -> None:
    wal = await Wal.open(directory, config)
    for i in range(0, n, 10):
        await wal.append([payload(j) for j in range(i, min(n, i + 10))])
    await wal.close()


async def read_all(reader: WalReader, until: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while reader.next_offset < until:
        batch = await reader.read(max_records=97, timeout=5)
        assert batch, f"reader stalled at {reader.next_offset}"
        assert [o for o, _ in batch] == list(range(batch[0][0], batch[0][0] + len(batch)))
        out.extend(batch)
    return out


def frame_positions(path: Path) -> list[tuple[int, int]]:
    """(offset, byte position) of every frame of a segment file."""
    res = scan_frames(path.read_bytes(), expect_offset=int(path.stem))
    return [(o, pos) for o, _, pos in res.frames]


def errors_mentioning(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


# ---- item 6: a damaged last segment never makes the WAL hand out acknowledged offsets again ---------------


@pytest.mark.parametrize("cut", ["mid_frame", "frame_boundary"])
async def test_last_segment_cut_short_after_a_clean_stop_never_reuses_offsets(
    tmp_path: Path, cut: str, caplog: pytest.LogCaptureFixture
) -> None:
    await write_records(tmp_path, 1000)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.next_offset == 1000  # written at close
    last = segment_files(tmp_path)[-1]
    positions = frame_positions(last)
    lost_from, pos = positions[len(positions) // 2]
    os.truncate(last, pos + (HEADER_SIZE + 3 if cut == "mid_frame" else 0))
    with caplog.at_level(logging.ERROR, logger="ister.storage.wal"):
        wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        # the acknowledged high-water mark wins: the lost offsets become a hole, never new messages
        assert wal.next_offset == 1000
        assert wal.lost_ranges == [(lost_from, 1000)]
        assert wal.holes() == [(lost_from, 1000)]
        assert len(errors_mentioning(caplog, f"{lost_from}..999")) == 1
        assert await wal.append([b"after"]) == 1000
        reader = wal.reader(0)
        got = await read_all(reader, 1001)
        assert got == [(i, payload(i)) for i in range(lost_from)] + [(1000, b"after")]
        assert reader.skipped == reader.damaged == [(lost_from, 999)]
    finally:
        await wal.close()
    # the hole is remembered (the checkpoint lists it): the good records before it stay readable
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert (wal.first_offset, wal.next_offset) == (0, 1001)
        assert wal.holes() == [(lost_from, 1000)]
        assert wal.lost_ranges == [(lost_from, 1000)]
        got = await read_all(wal.reader(0), 1001)
        assert got == [(i, payload(i)) for i in range(lost_from)] + [(1000, b"after")]
    finally:
        await wal.close()


async def test_a_strict_reader_gets_data_loss_for_a_lost_start(tmp_path: Path) -> None:
    await write_records(tmp_path, 300)
    last = segment_files(tmp_path)[-1]
    lost_from, pos = frame_positions(last)[-5]
    os.truncate(last, pos)
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        await wal.append([b"x"])
        strict = wal.reader(lost_from + 1)
        strict.strict_start = True
        with pytest.raises(DataLoss, match=f"{lost_from + 1}..299"):
            await strict.read(timeout=0)
        before = wal.reader(lost_from - 1)
        before.strict_start = True  # a read that starts before the hole gets what precedes it, then skips
        assert await before.read(timeout=0) == [(lost_from - 1, payload(lost_from - 1))]
        assert await before.read(timeout=0) == [(300, b"x")]
        assert before.skipped == [(lost_from, 299)]
    finally:
        await wal.close()


async def test_the_checkpoint_follows_commits_while_running(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        for i in range(5):
            await wal.append([payload(i)])
        deadline = time.monotonic() + 10
        while True:  # bounded lag (about a second), without a close
            ckpt = read_checkpoint(tmp_path)
            if ckpt is not None and ckpt.next_offset == 5:
                break
            assert time.monotonic() < deadline, f"checkpoint stuck at {ckpt}"
            await asyncio.sleep(0.05)
    finally:
        await wal.close()


CHILD = r"""
import asyncio, sys
from pathlib import Path
from ister.storage.wal import Wal, WalConfig

async def main() -> None:
    wal = await Wal.open(Path(sys.argv[1]), WalConfig(segment_max_bytes=4096))
    n = 0
    while True:
        first = await wal.append([b"r%06d" % (n + k) for k in range(5)])
        n = first + 5
        print(n, flush=True)

asyncio.run(main())
"""


def run_child_until_checkpoint(directory: Path, at_least: int) -> None:
    """Append in a child process until the checkpoint holds `at_least`, then kill -9 it."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while True:
            assert int(child.stdout.readline()) > 0  # one more append acknowledged
            ckpt = read_checkpoint(directory) if (directory / CHECKPOINT_NAME).exists() else None
            if ckpt is not None and ckpt.next_offset >= at_least:
                return
            assert time.monotonic() < deadline
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


async def test_crash_then_damage_below_the_checkpoint_never_reuses_offsets(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    run_child_until_checkpoint(directory, 2000)
    mark = read_checkpoint(directory)
    assert mark is not None
    # damage: the segment holding offset mark - 100 loses everything from that frame on
    victim = next(p for p in reversed(segment_files(directory)) if int(p.stem) <= mark.next_offset - 100)
    cut, pos = next((o, p) for o, p in frame_positions(victim) if o == mark.next_offset - 100)
    os.truncate(victim, pos)
    for later in segment_files(directory):
        if int(later.stem) > int(victim.stem):
            later.unlink()  # the lost write took the later files with it
    wal = await Wal.open(directory, WalConfig(segment_max_bytes=4096))
    try:
        assert wal.next_offset >= mark.next_offset
        assert wal.holes()[0][0] == cut
        assert await wal.append([b"new"]) >= mark.next_offset
    finally:
        await wal.close()


async def test_an_unreadable_checkpoint_is_reported_and_recovery_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await write_records(tmp_path, 50)
    ckpt = tmp_path / CHECKPOINT_NAME
    data = bytearray(ckpt.read_bytes())
    data[9] ^= 0xFF  # slot 0 (and a v1 file)
    if len(data) == 2 * SLOT_SIZE:
        data[SLOT_SIZE + 9] ^= 0xFF  # and slot 1: no checkpoint is left
    ckpt.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="ister.storage.wal"):
        wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert len(errors_mentioning(caplog, "checkpoint")) == 1
        assert wal.next_offset == 50
        assert await wal.append([b"x"]) == 50
    finally:
        await wal.close()
    ckpt = read_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.next_offset == 51  # written again


async def test_holes_below_dropped_segments_are_forgotten(tmp_path: Path) -> None:
    await write_records(tmp_path, 400)
    last = segment_files(tmp_path)[-1]
    os.truncate(last, frame_positions(last)[1][1])
    wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert len(wal.holes()) == 1
        await wal.append([b"x"])
        await wal.rotate()
        closed = [path for _, path, _ in wal.segments()[:-1]]
        assert await wal.drop_segments(closed) == len(closed)
        assert wal.holes() == [] and wal.first_offset == 401
    finally:
        await wal.close()


# ---- item 7: a damaged frame in a closed segment is skipped, counted and logged once ---------------------


async def test_flipped_payload_in_a_middle_segment_skips_one_frame_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = WalConfig(segment_max_bytes=2048, cache_max_bytes=0)
    await write_records(tmp_path, 1000, config)
    files = segment_files(tmp_path)
    victim = files[len(files) // 2]
    bad, pos = frame_positions(victim)[3]
    data = bytearray(victim.read_bytes())
    data[pos + HEADER_SIZE + 1] ^= 0x01
    victim.write_bytes(bytes(data))
    wal = await Wal.open(tmp_path, config)
    try:
        assert wal.holes() == []  # payloads of closed segments are checked when read
        with caplog.at_level(logging.ERROR, logger="ister.storage.wal"):
            for _ in range(3):  # several subscriptions read past it
                reader = wal.reader(0)
                got = await read_all(reader, 1000)
                assert got == [(i, payload(i)) for i in range(1000) if i != bad]
                assert reader.skipped == [(bad, bad)]
        assert wal.holes() == [(bad, bad + 1)]
        assert len(errors_mentioning(caplog, f"{bad}..{bad}")) == 1
        assert await wal.append([b"more"]) == 1000
    finally:
        await wal.close()


# ---- item 8: a full disk is refused as retriable and recovered without a restart ------------------------


async def test_disk_full_by_injection_cuts_the_partial_write_and_hands_offsets_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        assert await wal.append([b"a", b"b"]) == 0
        real = WalWriter._write_all
        full = True

        def half_then_full(self: WalWriter, buf: bytes) -> None:
            if not full:
                return real(self, buf)
            # a torn frame on disk, as a short write leaves it
            os.pwrite(self._files.open(), buf[: len(buf) // 2], self._files.active.size)
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

        monkeypatch.setattr(WalWriter, "_write_all", half_then_full)
        with caplog.at_level(logging.WARNING, logger="ister.storage.wal"):
            results = await asyncio.gather(
                *(wal.append([b"x%d" % i]) for i in range(5)), return_exceptions=True
            )
            assert all(isinstance(r, DiskFull) for r in results), results
            err = results[0]
            assert isinstance(err, ResourceExhausted) and err.retriable
            assert status_for(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "disk full" in str(err)
            assert wal.failed is None and (wal.next_offset, wal.committed_offset) == (2, 2)
            with pytest.raises(DiskFull):
                await wal.append([b"still full"])
            assert [o for o, _, _ in scan_frames(segment_files(tmp_path)[0].read_bytes()).frames] == [0, 1]
            full = False
            assert await wal.append([b"c"]) == 2
        assert len(errors_mentioning(caplog, "disk full")) == 1  # once per episode
        assert any("available again" in r.getMessage() for r in caplog.records)
        assert await read_all(wal.reader(0), 3) == [(0, b"a"), (1, b"b"), (2, b"c")]
    finally:
        await wal.close()
    wal = await Wal.open(tmp_path, WalConfig())
    try:
        assert wal.truncated == [] and wal.holes() == [] and wal.next_offset == 3
    finally:
        await wal.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real disk that fills up."""
    with small_tmpfs(tmp_path, "2m") as mount:
        yield mount


async def test_full_tmpfs_refuses_appends_then_recovers_when_space_returns(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (768 * 1024))
    config = WalConfig(segment_max_bytes=256 * 1024)
    wal = await Wal.open(small_disk / "wal", config)
    big = os.urandom(60 * 1024)
    acked: list[tuple[int, bytes]] = []
    try:
        with caplog.at_level(logging.WARNING, logger="ister.storage.wal"):
            refused = 0
            for i in range(100):
                try:
                    acked.append((await wal.append([big + b"%d" % i]), big + b"%d" % i))
                except DiskFull:
                    refused += 1
                    if refused == 3:
                        break
            assert refused == 3 and len(acked) > 5
            assert wal.failed is None
            assert wal.next_offset == wal.committed_offset == len(acked)
            for path in segment_files(small_disk / "wal"):  # no torn frame left behind
                assert scan_frames(path.read_bytes(), expect_offset=int(path.stem)).stop == "end"
            ballast.unlink()  # space returns
            for i in range(5):
                record = b"after-%d" % i
                acked.append((await wal.append([record]), record))
        assert [o for o, _ in acked] == list(range(len(acked)))
        assert len(errors_mentioning(caplog, "disk full")) == 1
        assert any("available again" in r.getMessage() for r in caplog.records)
        assert await read_all(wal.reader(0), len(acked)) == acked
    finally:
        await wal.close()
    wal = await Wal.open(small_disk / "wal", config)
    try:
        assert wal.next_offset == len(acked) and wal.holes() == []
        assert await read_all(wal.reader(0), len(acked)) == acked
    finally:
        await wal.close()


async def test_a_checkpoint_that_cannot_be_written_at_open_does_not_stop_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_records(tmp_path, 300)
    last = segment_files(tmp_path)[-1]
    os.truncate(last, frame_positions(last)[1][1])  # a lost range: the open wants to record it

    def no_space(directory: Path, checkpoint: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("ister.storage.wal.segment.write_checkpoint", no_space)
    wal = await Wal.open(tmp_path, SEGMENTS)
    monkeypatch.undo()
    try:
        lost = wal.lost_ranges
        assert wal.next_offset == 300 and len(lost) == 1
        deadline = time.monotonic() + 10
        while True:  # the writer records the mark and the lost range as soon as it can
            ckpt = read_checkpoint(tmp_path)
            if ckpt is not None and ckpt.lost == tuple(lost):
                break
            assert time.monotonic() < deadline, f"checkpoint not rewritten: {ckpt}"
            await asyncio.sleep(0.05)
        assert await wal.append([b"x"]) == 300
    finally:
        await wal.close()
