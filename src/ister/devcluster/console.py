"""The web console (`ister console`, docs/console.md) as a child of `ister dev up --console`."""

from __future__ import annotations

import sys
from pathlib import Path

from ister.devcluster.ports import wait_port
from ister.devcluster.servers import ServerProcess

START_SECONDS = 30.0  # the console imports Starlette and serves at once; more means it is broken


class ConsoleServer(ServerProcess):
    """`ister console` on 127.0.0.1:`port`, reading the admin API at `admin_addr` (one broker's: the
    admin API answers for the whole cluster)."""

    def __init__(self, directory: Path, admin_addr: str, port: int, *, own_session: bool = False) -> None:
        self.dir = directory
        self.admin_addr = admin_addr
        self.port = port
        self.own_session = own_session
        self.proc = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def log_path(self) -> Path:
        return self.dir / "console.log"

    def _has_ports(self) -> bool:
        return True  # the plan's port, always the same

    def _pick_ports(self) -> None:
        return None

    def _launch(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        listen = f"127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "ister.cli", "console", "--admin-addr", self.admin_addr]
        self._spawn([*args, "--listen", listen])
        assert self.proc is not None
        try:
            wait_port(self.port, self.proc, START_SECONDS, "the console")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; {self._tail()}") from None
