"""What the tests share: free loopback ports, waiting for a condition with a deadline, child processes.

`until` polls a condition that no event signals (a file appearing, a counter reaching a value, a broker
registering) and fails naming what it waited for; it never stands in for a wait on something the test can
await directly. The port and child-process helpers are the benchmark's (`ister.benchmark.broker`), so the
bench scripts and the tests start and stop processes the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ister.clock import VirtualClock
from ister.core.frames import scan_frames
from ister.devcluster.ports import free_port, port_open, stop_process, wait_port
from ister.devcluster.servers import ServerProcess

__all__ = [
    "ServerProcess",
    "free_port",
    "port_open",
    "small_tmpfs",
    "stop_process",
    "until",
    "until_sync",
    "wait_port",
]

WAIT_SECONDS = 10.0  # the default bound on a wait; it only limits how long a failing test takes to fail
POLL_SECONDS = 0.02


def _describe(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


async def until(
    check: Callable[[], Any],
    what: str | Callable[[], str],
    within: float = WAIT_SECONDS,
    poll: float = POLL_SECONDS,
) -> Any:
    """Poll `check` (sync or async) until it returns something truthy, and return that value; after
    `within` seconds fail with an AssertionError naming `what` (a string, or a function giving one, called
    only on failure so it can show the state at that moment)."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {_describe(what)}")
        await asyncio.sleep(poll)


def until_sync(
    check: Callable[[], Any],
    what: str | Callable[[], str],
    within: float = WAIT_SECONDS,
    poll: float = 0.1,
) -> Any:
    """`until` for tests that block their thread (a local Spark run): the same contract, with time.sleep."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {_describe(what)}")
        time.sleep(poll)


def segment_bytes(path: Path) -> bytes:
    """A WAL segment file's bytes up to the end of its frames. The active segment of an open WAL may end in
    zeros its writer allocated ahead (storage/wal/writer.py, "Preallocation"); anything else past the
    frames fails the test."""
    data = path.read_bytes()
    res = scan_frames(data, expect_offset=int(path.stem), verify_crc=False, collect=False)
    tail = data[res.end_pos :]
    assert tail.count(0) == len(tail), f"{path}: {len(tail)} bytes past the frames at {res.end_pos}"
    return data[: res.end_pos]


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "4m") mounted under `tmp_path`: a real disk that fills up. Skips the test
    where mounting is not allowed (it needs root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def advance_until(
    clock: VirtualClock, check: Callable[[], Any], what: str | Callable[[], str], step: float, limit: float
) -> Any:
    """`until` in virtual time: advance `clock` by `step` (running what falls due) until `check` returns
    something truthy, and return that; fail naming `what` once `limit` virtual seconds have passed."""
    start = clock.monotonic()
    while not (value := check()):
        if clock.monotonic() - start >= limit:
            raise AssertionError(f"not within {limit} virtual seconds: {_describe(what)}")
        await clock.advance(step)
    return value
