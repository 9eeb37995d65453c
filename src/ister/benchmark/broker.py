"""A broker subprocess for the benchmark: free loopback ports, a temporary data dir, killed at the end."""

from __future__ import annotations

import itertools
import os
import random
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


# Ports are picked here and bound later by the servers, so a picked port must not be one the kernel hands
# out meanwhile: picks come from PORT_BASE .. PORT_BASE + PORT_SPAN, below Linux's ephemeral range
# (32768-60999, where bind(("", 0)) and outgoing connections take theirs) and above the fixed ports of
# the peer benchmarks (NATS 14222, iperf3 15201, Redis 16379). Under pytest-xdist each worker process
# takes its own share of that span, so two workers never pick the same port.
PORT_BASE = 20_000
PORT_SPAN = 10_000


def port_range() -> range:
    """The ports this process may pick: all of the span, or its worker's share under `pytest -n`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker.startswith("gw") else 0
    width = PORT_SPAN // max(count, 1)
    start = PORT_BASE + index * width
    return range(start, start + width)


_picks = itertools.count(random.randrange(PORT_SPAN))  # the cursor into port_range(), from a random place


def free_port() -> int:
    """A loopback port nothing listens on. The picks go round the process's range in order, so a port is
    handed out again only after every other one of the range was (a cluster's ports are all picked before
    its servers start: the same port twice made two brokers collide)."""
    ports = port_range()
    for _ in range(len(ports)):
        port = ports[next(_picks) % len(ports)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): the next one
        return port
    raise RuntimeError(f"no free loopback port in {ports.start}-{ports.stop - 1}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_port(
    port: int, proc: subprocess.Popen[bytes], timeout: float, what: str, host: str = "127.0.0.1"
) -> None:
    """Wait until `host:port` accepts connections; RuntimeError if `proc` exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if port_open(port, host):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not open port {host}:{port} within {timeout:.0f} s")


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
