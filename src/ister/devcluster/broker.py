"""One `ister broker` process: its own data dir, ports and log file; restartable on the same data dir and
ports. The tests' `BrokerProcess` (tests/integration/harness.py) and `ister dev` start brokers with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ister.devcluster.ports import free_port, stop_process, wait_port

ISTER = [sys.executable, "-m", "ister.cli"]
START_SECONDS = 30.0
LOG_TAIL_CHARS = 8000


def broker_args(
    data_dir: Path | str,
    *,
    broker_addr: str,
    admin_addr: str,
    prom_exporter: str,
    advertised_addr: str | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """`ister broker`'s arguments (after `ister`): where it keeps data and listens, then `extra`."""
    args = ["broker", "--data-dir", str(data_dir), "--broker-addr", broker_addr]
    if advertised_addr is not None:
        args += ["--advertised-addr", advertised_addr]
    return [*args, "--admin-addr", admin_addr, "--prom-exporter", prom_exporter, *extra]


class BrokerNode:
    """`start()` launches the broker and waits until it listens; `terminate()` stops it gracefully,
    `kill9()` crashes it. Ports are picked free on loopback unless given (`ports`: client, admin, metrics);
    in a network namespace of its own (`prefix`, e.g. `ip netns exec NS`) the broker listens on `host`."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        prefix: list[str] | None = None,
        ports: tuple[int, int, int] | None = None,
        log_path: Path | None = None,
        own_session: bool = False,
        ister_env: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.prefix = prefix or []
        self.port, self.admin_port, self.prom_port = ports or (free_port(), free_port(), free_port())
        self.extra = list(extra)
        self.env = env or {}
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-broker.log"
        self.own_session = own_session  # a process group of its own: a terminal's Ctrl-C does not reach it
        self.ister_env = ister_env  # False: this process's ISTER_* variables are not passed on
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_addr(self) -> str:
        return f"{self.host}:{self.admin_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.prom_port}/metrics"

    @property
    def readyz_url(self) -> str:
        return f"http://{self.host}:{self.prom_port}/readyz"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def args(self) -> list[str]:
        """The `ister broker` arguments (after `ister`)."""
        return broker_args(
            self.data_dir,
            broker_addr=f"{self.host}:{self.port}",
            admin_addr=f"{self.host}:{self.admin_port}",
            prom_exporter=f"{self.host}:{self.prom_port}",
            extra=self.extra,
        )

    def launch(self) -> None:
        """Start the process without waiting for it to listen (it may be waiting for etcd)."""
        inherited = {k: v for k, v in os.environ.items() if self.ister_env or not k.startswith("ISTER_")}
        env = {**inherited, **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, *ISTER, *self.args()],  # `ip netns exec NS` execs the broker: same pid
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=self.own_session,
            )

    def wait_listening(self, timeout: float = START_SECONDS) -> None:
        """Until every listener is up: the metrics port opens first (it answers while the broker waits
        for etcd), the admin port last."""
        assert self.proc is not None
        try:
            deadline = time.monotonic() + timeout
            for port in (self.prom_port, self.port, self.admin_port):
                wait_port(port, self.proc, max(0.1, deadline - time.monotonic()), "broker", self.host)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{self.log()}") from None

    def start(self, timeout: float = START_SECONDS) -> None:
        self.launch()
        self.wait_listening(timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 20.0) -> int:
        """Graceful stop (SIGTERM); returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        stop_process(self.proc)
        self.proc = None

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
