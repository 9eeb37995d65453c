"""A broker subprocess for the benchmark: free loopback ports, a temporary data dir, killed at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from ister.benchmark.stats import process_cpu_s
from ister.devcluster.ports import free_port, stop_process, wait_port

ISTER = [sys.executable, "-m", "ister.cli"]


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
        self.admin_addr = f"127.0.0.1:{free_port()}"
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
            self.admin_addr,
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
