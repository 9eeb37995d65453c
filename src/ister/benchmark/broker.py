"""A broker subprocess for the benchmark: free loopback ports, a temporary data dir, killed at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ister.benchmark.stats import process_cpu_s

ISTER = [sys.executable, "-m", "ister.cli"]


_handed_out: set[int] = set()  # ports this process gave out: picked before any server binds them


def free_port() -> int:
    """A loopback port nothing listens on, never one this process handed out before: a cluster's ports
    are all picked before its servers start, and the kernel may offer a just-closed port again (two
    brokers of one test got the same port)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Wait until `port` accepts connections; RuntimeError if `proc` exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if port_open(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not open port {port} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGKILL `proc` if it still runs, and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout)


class BenchBroker:
    """`ister broker` on free loopback ports with its own temporary data dir. Use as a context manager."""

    def __init__(
        self, fsync: str = "always", log_level: str = "warning", env: dict[str, str] | None = None
    ) -> None:
        self.fsync = fsync
        self.log_level = log_level
        self.env = env or {}  # extra environment, e.g. ISTER_LIMITS__MAX_TOPICS_PER_BROKER
        self.port = free_port()
        self.prom_port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="ister-bench-"))
        self.log_path = self.tmp / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> BenchBroker:
        cmd = [
            *ISTER,
            "broker",
            "--data-dir",
            str(self.tmp / "data"),
            "--broker-addr",
            f"127.0.0.1:{self.port}",
            "--admin-addr",
            f"127.0.0.1:{free_port()}",
            "--prom-exporter",
            f"127.0.0.1:{self.prom_port}",
            "--fsync",
            self.fsync,
            "--log-level",
            self.log_level,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        try:
            wait_port(self.port, self.proc, timeout, "ister broker")
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n{self.log()}") from None
        return self

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the broker process so far (0.0 when unknown)."""
        return process_cpu_s(self.proc.pid) if self.proc is not None else 0.0

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> BenchBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
