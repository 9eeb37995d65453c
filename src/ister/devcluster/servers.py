"""The stop/kill/restart/log-tail part shared by the harnesses of external servers (etcd, SeaweedFS) that
tests and benchmarks start."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import IO

from ister.devcluster.ports import stop_process

STOP_SECONDS = 10.0  # after SIGTERM, then SIGKILL
PORT_ATTEMPTS = 3  # a freshly picked port can be taken by someone else before the server binds it


class ServerProcess:
    """The stop/kill/restart/log-tail part of the harnesses of external servers (etcd, SeaweedFS).

    Subclasses set `proc` and `_log` in `_launch()`, say whether they have ports and pick them, and define
    `log_path`; `_cleanup()` runs on reap."""

    proc: subprocess.Popen[bytes] | None
    _log: IO[bytes] | None

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _has_ports(self) -> bool:
        raise NotImplementedError

    def _pick_ports(self) -> None:
        raise NotImplementedError

    def _launch(self) -> None:
        """Start the process and wait until it serves; RuntimeError when it does not."""
        raise NotImplementedError

    def start(self) -> None:
        """Start (on new free ports the first time, the same ports after that) and wait until ready."""
        if self.running:
            return
        first = not self._has_ports()
        attempts = PORT_ATTEMPTS if first else 1
        for attempt in range(attempts):
            if first:
                self._pick_ports()
            try:
                self._launch()
                return
            except RuntimeError:
                self._reap()
                if attempt + 1 >= attempts:
                    raise

    own_session = False  # True: a process group of its own (a terminal's Ctrl-C does not reach it)
    stop_signal = signal.SIGTERM  # what `stop()` sends first (PostgreSQL's fast shutdown is SIGINT)

    def _spawn(self, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        """Start the process, its output appended to `log_path` (after a line with the command)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115  (open for the life of the process)
        self._log.write(f"--- starting: {' '.join(args)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=self.own_session,
        )

    def _tail(self) -> str:
        try:
            return "log tail: " + " | ".join(self.log_path.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return f"log {self.log_path}"

    def stop(self) -> None:
        """`stop_signal` (SIGTERM) and wait (SIGKILL if it does not exit in time)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
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
