"""What the tests share: free loopback ports, waiting for a condition with a deadline, child processes.

`until` polls a condition that no event signals (a file appearing, a counter reaching a value, a broker
registering) and fails naming what it waited for; it never stands in for a wait on something the test can
await directly. The port and child-process helpers are the benchmark's (`ister.benchmark.broker`), so the
bench scripts and the tests start and stop processes the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ister.benchmark.broker import free_port, port_open, stop_process, wait_port

__all__ = [
    "ServerProcess",
    "free_port",
    "port_open",
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


STOP_SECONDS = 10.0  # after SIGTERM, then SIGKILL


class ServerProcess:
    """The stop/kill/restart/log-tail part of the harnesses of external servers (etcd, SeaweedFS).

    Subclasses set `proc` and `_log` in `start()` and define `log_path`; `_cleanup()` runs on reap."""

    proc: subprocess.Popen[bytes] | None
    _log: IO[bytes] | None

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def _tail(self) -> str:
        try:
            return "log tail: " + " | ".join(self.log_path.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return f"log {self.log_path}"

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL if it does not exit in time)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_SECONDS)
        self._reap()

    def kill(self) -> None:
        """SIGKILL and wait: a crash."""
        stop_process(self.proc, STOP_SECONDS)
        self._reap()

    def restart(self) -> None:
        self.stop()
        self.start()

    def _reap(self) -> None:
        stop_process(self.proc, STOP_SECONDS)
        self.proc = None
        self._cleanup()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _cleanup(self) -> None:
        """Anything the server leaves behind (a subclass hook)."""
