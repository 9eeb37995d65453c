"""Preallocated segment files (storage/wal/writer.py, "Preallocation"): the active segment's file is
allocated ahead of its data, cut back when sealed or closed, and a crash's leftover zeros are cut quietly."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ister.errors import ConfigError
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal.pool import WriterPool
from tests.support import segment_bytes, small_tmpfs, until
from tests.unit.test_wal import file_records, payload, read_all, segment_files

AHEAD = 64 * 1024


async def test_the_active_segment_is_allocated_ahead_and_cut_back_on_close(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        assert await wal.append([payload(0)]) == 0
        (path,) = segment_files(tmp_path)
        # the first frame is written as it is: no zeros where offset 0 is expected
        assert path.stat().st_size == len(segment_bytes(path))
        for i in range(1, 400):
            await wal.append([payload(i)])
        data = len(segment_bytes(path))  # (segment_bytes fails unless only zeros follow the frames)
        size = path.stat().st_size
        assert data < size <= data + AHEAD + 4096  # ahead of the data, by at most the configured reserve
        assert await read_all(wal.reader(0), 400) == [(i, payload(i)) for i in range(400)]
    finally:
        await wal.close()
    assert path.stat().st_size == data  # cut back when the WAL closed
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        assert wal.truncated == [] and wal.next_offset == 400
        assert await wal.append([b"next"]) == 400
    finally:
        await wal.close()


async def test_sealed_segments_end_at_their_last_frame(tmp_path: Path) -> None:
    config = WalConfig(segment_max_bytes=8192, preallocate_bytes=AHEAD)
    wal = await Wal.open(tmp_path, config)
    try:
        for i in range(0, 600, 3):
            await wal.append([payload(j) for j in range(i, i + 3)])
        *sealed, active = segment_files(tmp_path)
        assert len(sealed) >= 2
        for path in sealed:
            assert path.stat().st_size == len(segment_bytes(path)), path
        assert active.stat().st_size > len(segment_bytes(active))
        assert file_records(tmp_path) == [(i, payload(i)) for i in range(600)]
    finally:
        await wal.close()


async def test_an_idle_segment_file_gives_its_reserve_back(tmp_path: Path) -> None:
    pool = WriterPool(2, idle_close_s=0.2)
    wal = await Wal.open(tmp_path / "w", WalConfig(preallocate_bytes=AHEAD), pool=pool, lock_root=tmp_path)
    try:
        for i in range(100):
            await wal.append([payload(i)])
        (path,) = segment_files(tmp_path / "w")
        assert path.stat().st_size > len(segment_bytes(path))
        await until(lambda: pool.stats()["open_files"] == 0, "the idle close")
        # The pool counts the file closed when it asks the writer to close it; the writer gives the reserve
        # back in its next turn, after that: wait for the file to shrink.
        framed = len(segment_bytes(path))  # nothing is appended meanwhile
        await until(
            lambda: path.stat().st_size == framed,
            lambda: f"the file cut to its {framed} bytes of frames (it has {path.stat().st_size})",
        )
        for i in range(100, 200):  # reopened and allocated ahead again
            assert await wal.append([payload(i)]) == i
        assert path.stat().st_size > len(segment_bytes(path))
        assert file_records(tmp_path / "w") == [(i, payload(i)) for i in range(200)]
    finally:
        await wal.close()
        assert pool.close(10)


async def test_preallocation_off_writes_the_files_exactly(tmp_path: Path) -> None:
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=0))
    try:
        for i in range(300):
            await wal.append([payload(i)])
        (path,) = segment_files(tmp_path)
        assert path.stat().st_size == len(segment_bytes(path))
    finally:
        await wal.close()


CHILD = r"""
import asyncio, sys
from pathlib import Path
from ister.storage.wal import Wal, WalConfig

async def main() -> None:
    wal = await Wal.open(Path(sys.argv[1]), WalConfig(preallocate_bytes=65536))
    for i in range(int(sys.argv[2])):
        await wal.append([f"record-{i:06d}".encode()])
    print("acked", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def append_then_kill(directory: Path, n: int) -> None:
    """A child process appends `n` records (each acknowledged), then is killed with SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(n)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "acked"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def test_a_crash_leaves_zeros_that_recovery_cuts_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "wal"
    append_then_kill(directory, 500)
    (path,) = segment_files(directory)
    data = len(segment_bytes(path))
    assert path.stat().st_size > data  # the reserve the writer had, left by the kill
    with caplog.at_level(logging.INFO, logger="ister.storage.wal"):
        wal = await Wal.open(directory, WalConfig(preallocate_bytes=AHEAD))
    try:
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert any("preallocated space" in r.getMessage() for r in caplog.records)
        assert wal.holes() == [] and wal.next_offset == 500
        assert path.stat().st_size == data
        assert await read_all(wal.reader(0), 500) == [(i, payload(i)) for i in range(500)]
        assert await wal.append([b"after"]) == 500
    finally:
        await wal.close()


async def test_a_torn_frame_in_the_reserve_is_still_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        for i in range(50):
            await wal.append([payload(i)])
    finally:
        await wal.close()
    (path,) = segment_files(tmp_path)
    data = path.stat().st_size
    fd = os.open(path, os.O_WRONLY)
    try:  # a reserve, then half a frame in it: what a crash in the middle of a write leaves
        os.posix_fallocate(fd, 0, data + AHEAD)
        os.pwrite(fd, b"\x32\x00\x00\x00\x00\x00\x00\x00\x40", data)
    finally:
        os.close(fd)
    with caplog.at_level(logging.WARNING, logger="ister.storage.wal"):
        wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        assert any("torn WAL tail" in r.getMessage() for r in caplog.records)
        assert wal.next_offset == 50 and path.stat().st_size == data
    finally:
        await wal.close()


async def test_no_room_for_a_reserve_still_writes(tmp_path: Path) -> None:
    """A real full disk: a tmpfs with a few pages left refuses the reserve, not the appends that fit."""
    with small_tmpfs(tmp_path, "1m") as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))
        wal = await Wal.open(disk / "wal", WalConfig(preallocate_bytes=1024 * 1024))
        try:
            for i in range(200):
                assert await wal.append([payload(i)]) == i
            (path,) = segment_files(disk / "wal")
            assert path.stat().st_size < 1024 * 1024  # no reserve of a whole MiB fitted
            assert await read_all(wal.reader(0), 200) == [(i, payload(i)) for i in range(200)]
        finally:
            await wal.close()
        assert file_records(disk / "wal") == [(i, payload(i)) for i in range(200)]


async def test_a_filesystem_without_fallocate_gets_plain_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Simulated: every filesystem this machine can mount supports fallocate.
    calls = 0

    def unsupported(fd: int, offset: int, length: int) -> None:
        nonlocal calls
        calls += 1
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        with caplog.at_level(logging.WARNING, logger="ister.storage.wal"):
            for i in range(100):
                await wal.append([payload(i)])
        assert calls == 1  # tried once, then never again for this WAL
        assert len([r for r in caplog.records if "cannot preallocate" in r.getMessage()]) == 1
        assert file_records(tmp_path) == [(i, payload(i)) for i in range(100)]
    finally:
        await wal.close()


def test_preallocate_bytes_is_validated() -> None:
    with pytest.raises(ConfigError, match="preallocate_bytes"):
        WalConfig(preallocate_bytes=-1)


async def test_a_reserve_that_cannot_be_cut_at_close_is_cut_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Simulated: shrinking a file does not fail on any filesystem this machine can mount.
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    for i in range(100):
        await wal.append([payload(i)])

    def failing(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", failing)
    with caplog.at_level(logging.WARNING, logger="ister.storage.wal"):
        await wal.close()
    monkeypatch.undo()
    assert any("cannot cut the preallocated tail" in r.getMessage() for r in caplog.records)
    (path,) = segment_files(tmp_path)
    data = len(segment_bytes(path))
    assert path.stat().st_size > data  # the zeros stayed
    wal = await Wal.open(tmp_path, WalConfig(preallocate_bytes=AHEAD))
    try:
        assert wal.holes() == [] and wal.next_offset == 100 and path.stat().st_size == data
        assert await read_all(wal.reader(0), 100) == [(i, payload(i)) for i in range(100)]
    finally:
        await wal.close()
