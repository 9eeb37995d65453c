"""Wal.truncate / Wal.reset under failures: a crash at each step, every disk call failing in turn (while
cutting and while an open finishes an interrupted cut), a real process kill, a damaged intent file."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ister.errors import LogTruncated, OffsetOutOfRange, StorageError
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal import segfiles as segfiles_module
from ister.storage.wal import segment as segment_module
from ister.storage.wal import truncate as truncate_module
from ister.storage.wal.checkpoint import read_checkpoint
from ister.storage.wal.truncate import INTENT_NAME

SEGMENTS = WalConfig(segment_max_bytes=2048)
RECORDS = 400


class Crash(Exception):
    """Stands for the process dying at that point: nothing after it runs."""


def payload(i: int, tag: str = "old") -> bytes:
    return f"{tag}-{i:06d}".encode()


def old(first: int, end: int) -> list[tuple[int, bytes]]:
    return [(i, payload(i)) for i in range(first, end)]


async def write_log(directory: Path, n: int = RECORDS) -> None:
    wal = await Wal.open(directory, SEGMENTS)
    for i in range(0, n, 10):
        await wal.append([payload(j) for j in range(i, min(n, i + 10))])
    await wal.close()


async def read_all(wal: Wal) -> list[tuple[int, bytes]]:
    reader = wal.reader(wal.first_offset)
    out: list[tuple[int, bytes]] = []
    while reader.next_offset < wal.committed_offset:
        batch = await reader.read(max_records=500, timeout=5)
        assert batch, f"reader stalled at {reader.next_offset}"
        out.extend(batch)
    assert reader.skipped == []
    return out


def cut_point(directory: Path) -> int:
    """An offset in the middle of the second segment file (so later files exist to delete)."""
    files = sorted(directory.glob("*.wal"))
    return (int(files[1].stem) + int(files[2].stem)) // 2


async def assert_reopens_as(directory: Path, first: int, records: list[tuple[int, bytes]], end: int) -> None:
    """The WAL reopens holding exactly `records` below `end`, with no hole and no lost range, and the
    next append gets `end`: no offset comes back with another payload, none is reported lost."""
    wal = await Wal.open(directory, SEGMENTS)
    try:
        assert (wal.first_offset, wal.next_offset) == (first, end)
        assert wal.holes() == [] and wal.lost_ranges == []
        assert await read_all(wal) == records
        assert await wal.append([b"next"]) == end
    finally:
        await wal.close()
    assert not (directory / INTENT_NAME).exists()
    ckpt = read_checkpoint(directory)
    assert ckpt is not None and ckpt.next_offset == end + 1 and ckpt.lost == ()


# ---- a crash at each step of the cut ---------------------------------------------------------------------

STEPS = [
    ("replace_file", 1),  # the intent: not written, the old log stays
    ("write_checkpoint", 1),  # from here on the intent is durable: the open finishes the cut
    ("unlink_segment", 1),
    ("unlink_segment", 2),
    ("cut_file", 1),
    ("create_empty", 1),
    ("fsync_dir", 1),
    ("remove_file", 1),
]


def crash_at(monkeypatch: pytest.MonkeyPatch, name: str, nth: int) -> None:
    real = getattr(truncate_module, name)
    calls = 0

    def step(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth:
            raise Crash(f"crash in {name} (call {nth})")
        return real(*args, **kwargs)

    monkeypatch.setattr(truncate_module, name, step)


# a truncation inside a segment cuts that file; a reset creates a new one instead
CASES = [
    (k, s, n) for k in ("truncate", "reset") for s, n in STEPS if (s == "create_empty") == (k == "reset")
]


@pytest.mark.parametrize(("kind", "step", "nth"), CASES, ids=[f"{k}-{s}-{n}" for k, s, n in CASES])
async def test_a_crash_at_each_step_reopens_old_or_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, step: str, nth: int
) -> None:
    await write_log(tmp_path)
    end = cut_point(tmp_path) if kind == "truncate" else 5000
    wal = await Wal.open(tmp_path, SEGMENTS)
    past = wal.reader(RECORDS)
    with monkeypatch.context() as patch:
        crash_at(patch, step, nth)
        with pytest.raises(StorageError, match="Crash"):
            await (wal.truncate(end) if kind == "truncate" else wal.reset(end))
    # the WAL failed: it refuses appends, and never serves what the cut removes
    assert wal.failed is not None
    with pytest.raises(StorageError):
        await wal.append([b"x"])
    with pytest.raises(LogTruncated if kind == "truncate" else OffsetOutOfRange):  # reset: below the start
        await past.read(timeout=0)
    await wal.close()
    if step == "replace_file":
        await assert_reopens_as(tmp_path, 0, old(0, RECORDS), RECORDS)
    elif kind == "truncate":
        await assert_reopens_as(tmp_path, 0, old(0, end), end)
    else:
        await assert_reopens_as(tmp_path, end, [], end)


async def test_a_damaged_intent_is_ignored_and_the_files_still_give_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the intent (damaged: logged, ignored), the steps' order alone keeps the log a prefix of the
    old one reaching at least the cut, under a checkpoint no higher than it: no lost range, no reuse."""
    await write_log(tmp_path)
    end = cut_point(tmp_path)
    wal = await Wal.open(tmp_path, SEGMENTS)
    with monkeypatch.context() as patch:
        crash_at(patch, "unlink_segment", 2)  # the newest file is gone, the others not yet
        with pytest.raises(StorageError):
            await wal.truncate(end)
    await wal.close()
    intent = tmp_path / INTENT_NAME
    intent.write_bytes(b"\xff" + intent.read_bytes()[1:])
    with caplog.at_level(logging.ERROR, logger="ister.storage.wal"):
        wal = await Wal.open(tmp_path, SEGMENTS)
    try:
        assert any("intent" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
        last = wal.next_offset
        assert end <= last < RECORDS
        assert wal.holes() == [] and wal.lost_ranges == []
        assert await read_all(wal) == old(0, last)
        assert await wal.append([b"next"]) == last
    finally:
        await wal.close()
    assert not intent.exists()


# ---- every disk call failing in turn ---------------------------------------------------------------------

FAULTY = ("open", "write", "fsync", "rename", "unlink", "ftruncate", "close")


@contextmanager
def failing_disk(
    monkeypatch: pytest.MonkeyPatch, gated: tuple[Any, str], fail_at: int | None
) -> Iterator[Callable[[], int]]:
    """While `gated` (module, function name) runs, count the os calls in FAULTY and make call number
    `fail_at` fail with EIO (close: after closing). Yields a function returning the count."""
    calls = 0
    active = threading.local()

    def wrap(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            if not getattr(active, "on", False):
                return real(*args, **kwargs)
            calls += 1
            if calls != fail_at:
                return real(*args, **kwargs)
            if name == "close":
                real(*args, **kwargs)
            raise OSError(errno.EIO, f"injected EIO in os.{name}")

        return call

    module, fname = gated
    inner = getattr(module, fname)

    def gate(*args: Any, **kwargs: Any) -> Any:
        active.on = True
        try:
            return inner(*args, **kwargs)
        finally:
            active.on = False

    with monkeypatch.context() as patch:
        for name in FAULTY:
            patch.setattr(os, name, wrap(name))
        patch.setattr(module, fname, gate)
        yield lambda: calls


@pytest.mark.parametrize("kind", ["truncate", "reset"])
async def test_every_disk_call_of_a_cut_failing_fails_the_wal_and_reopens_old_or_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    template = tmp_path / "template"
    await write_log(template)
    end = cut_point(template) if kind == "truncate" else 5000

    async def attempt(fail_at: int | None) -> tuple[int, Path]:
        directory = tmp_path / f"run-{fail_at}"
        shutil.copytree(template, directory)
        wal = await Wal.open(directory, SEGMENTS)
        with failing_disk(monkeypatch, (segfiles_module, "carry_out"), fail_at) as count:
            try:
                await (wal.truncate(end) if kind == "truncate" else wal.reset(end))
                assert fail_at is None
                assert wal.failed is None
            except StorageError as exc:
                assert fail_at is not None and "injected EIO" in str(exc)
                assert wal.failed is not None  # the WAL is failed, never half cut in memory
            calls = count()
        await wal.close()
        return calls, directory

    total, directory = await attempt(None)
    assert total >= 10
    outcomes = {"old": 0, "cut": 0}
    for fail_at in range(1, total + 1):
        _, directory = await attempt(fail_at)
        intent_on_disk = (directory / INTENT_NAME).exists()
        if not intent_on_disk and read_checkpoint(directory) == read_checkpoint(template):
            outcomes["old"] += 1
            await assert_reopens_as(directory, 0, old(0, RECORDS), RECORDS)  # failed before the intent
            continue
        outcomes["cut"] += 1
        if kind == "truncate":
            await assert_reopens_as(directory, 0, old(0, end), end)
        else:
            await assert_reopens_as(directory, end, [], end)
    assert outcomes["old"] >= 4 and outcomes["cut"] >= 6, outcomes


async def test_every_disk_call_failing_while_an_open_finishes_a_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open that cannot finish an interrupted cut raises StorageError and changes nothing it cannot
    redo: the next open finishes it."""
    template = tmp_path / "template"
    await write_log(template)
    end = cut_point(template)
    wal = await Wal.open(template, SEGMENTS)
    with monkeypatch.context() as patch:
        crash_at(patch, "write_checkpoint", 1)  # only the intent is on disk
        with pytest.raises(StorageError):
            await wal.truncate(end)
    await wal.close()

    async def attempt(fail_at: int | None) -> tuple[int, Path]:
        directory = tmp_path / f"run-{fail_at}"
        shutil.copytree(template, directory)
        with failing_disk(monkeypatch, (segment_module, "finish_pending_cut"), fail_at) as count:
            try:
                wal = await Wal.open(directory, SEGMENTS)
                assert fail_at is None
                await wal.close()
            except StorageError as exc:
                assert fail_at is not None
                assert "cannot finish an interrupted truncation" in str(exc)
            calls = count()
        return calls, directory

    total, _ = await attempt(None)
    assert total >= 8
    for fail_at in range(1, total + 1):
        _, directory = await attempt(fail_at)
        await assert_reopens_as(directory, 0, old(0, end), end)


async def test_an_fsync_error_while_cutting_the_segment_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_log(tmp_path)
    end = cut_point(tmp_path)
    wal = await Wal.open(tmp_path, SEGMENTS)

    def no_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "fsync failed")

    with monkeypatch.context() as patch:
        real_cut = truncate_module.cut_file

        def cut_file(path: Path, size: int) -> None:
            patch.setattr(os, "fsync", no_fsync)
            real_cut(path, size)

        patch.setattr(truncate_module, "cut_file", cut_file)
        with pytest.raises(StorageError, match="fsync failed"):
            await wal.truncate(end)
    assert wal.failed is not None
    await wal.close()
    await assert_reopens_as(tmp_path, 0, old(0, end), end)  # the intent was durable: the open finishes


# ---- a real crash (the process dies, nothing after the step runs) ----------------------------------------

CHILD = r"""
import asyncio, os, sys
from pathlib import Path
from ister.storage.wal import Wal, WalConfig
from ister.storage.wal import truncate

async def main() -> None:
    directory, step, end = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    real = getattr(truncate, step)
    def die(*args, **kwargs):
        if step == "remove_file":
            real(*args, **kwargs)  # the intent is gone, the directory not fsync'd yet
        os._exit(9)
    setattr(truncate, step, die)
    wal = await Wal.open(directory, WalConfig(segment_max_bytes=2048))
    await wal.truncate(end)

asyncio.run(main())
"""


@pytest.mark.parametrize("step", ["write_checkpoint", "unlink_segment", "cut_file", "remove_file"])
async def test_a_killed_process_reopens_cut(tmp_path: Path, step: str) -> None:
    await write_log(tmp_path)
    end = cut_point(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(tmp_path), step, str(end), env=env
    )
    assert await asyncio.wait_for(child.wait(), 60) == 9
    await assert_reopens_as(tmp_path, 0, old(0, end), end)
