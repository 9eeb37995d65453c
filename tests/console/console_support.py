"""A running `ister console` process for the console tests, and plain HTTP helpers."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import free_port, stop_process, wait_port


@contextmanager
def console(admin_addr: str, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`ister console` on a free port; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ister.cli",
            "console",
            "--admin-addr",
            admin_addr,
            "--listen",
            f"127.0.0.1:{port}",
            *extra,
        ],
        env=env,
    )
    try:
        wait_port(port, proc, 30, "console")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(url: str, form: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "console"
