"""A single-member etcd server for tests and benchmarks: own ports and data dir, restartable on both."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ister.devcluster.ports import free_port
from ister.devcluster.servers import ServerProcess

START_SECONDS = 20.0  # etcd answers in about 1 s here; this bound only stops a broken start hanging the run


def etcd_binary() -> str | None:
    """The etcd executable, or None when it is not installed."""
    return shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )


def etcd_args(
    name: str,
    data_dir: Path | str,
    *,
    listen_client: str,
    advertise_client: str,
    listen_peer: str,
    advertise_peer: str,
    initial_cluster: str,
) -> list[str]:
    """etcd's arguments for one member (`initial_cluster`: every member's `name=peer URL`)."""
    return [
        "--name",
        name,
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        listen_client,
        "--advertise-client-urls",
        advertise_client,
        "--listen-peer-urls",
        listen_peer,
        "--initial-advertise-peer-urls",
        advertise_peer,
        "--initial-cluster",
        initial_cluster,
        "--initial-cluster-state",
        "new",
        "--logger",
        "zap",
    ]


@dataclass(frozen=True)
class EtcdServerTls:
    """Client-port TLS for the test etcd: its certificate, and the CA client certificates must chain to
    (`--client-cert-auth`); `client_cert`/`client_key` are what the readiness probe presents."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert: Path
    client_key: Path


class EtcdServer(ServerProcess):
    """`start()` launches etcd and waits until it serves requests; `restart()` keeps ports and data."""

    def __init__(
        self,
        data_dir: Path,
        name: str = "ister-test",
        tls: EtcdServerTls | None = None,
        host: str = "127.0.0.1",
        *,
        ports: tuple[int, int] | None = None,
        own_session: bool = False,
    ) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
        self.binary = binary
        self.dir = Path(data_dir)
        self.name = name
        self.tls = tls
        self.host = host  # where its client and peer ports listen (partition tests: a bridge's address)
        self.client_port, self.peer_port = ports or (0, 0)  # 0: picked free at the first start
        self.own_session = own_session  # a process group of its own: a terminal's Ctrl-C does not reach it
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def log_path(self) -> Path:
        return self.dir / "etcd.log"

    def _has_ports(self) -> bool:
        return self.client_port != 0

    def _pick_ports(self) -> None:
        self.client_port, self.peer_port = free_port(), free_port()

    def _launch(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        client = self.url
        peer = f"http://{self.host}:{self.peer_port}"
        args = [
            self.binary,
            *etcd_args(
                self.name,
                self.dir / "data.etcd",
                listen_client=client,
                advertise_client=client,
                listen_peer=peer,
                advertise_peer=peer,
                initial_cluster=f"{self.name}={peer}",
            ),
        ]
        if self.tls is not None:
            t = self.tls
            args += ["--cert-file", str(t.cert_file), "--key-file", str(t.key_file)]
            args += ["--trusted-ca-file", str(t.ca_file), "--client-cert-auth"]
        self._spawn(args)
        self._wait_ready()

    def _probe_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls.ca_file))
        ctx.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return ctx

    def _wait_ready(self) -> None:
        """Poll /health (etcd serves it from a real quorum read) until it reports healthy."""
        deadline = time.monotonic() + START_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited during start ({self._tail()})")
            try:
                with urllib.request.urlopen(
                    f"{self.url}/health", timeout=1.0, context=self._probe_context()
                ) as response:
                    body = json.loads(response.read())
                if body.get("health") == "true":
                    return
                last = str(body)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.05)  # poll interval, not a wait for readiness
        raise RuntimeError(f"etcd not healthy within {START_SECONDS} s: {last} ({self._tail()})")
