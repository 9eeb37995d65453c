"""Loopback ports for the servers tests, benchmarks and `ister dev` start, and waiting for a child
process to listen or stopping it."""

from __future__ import annotations

import itertools
import os
import random
import socket
import subprocess
import time

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


def bindable(port: int, host: str = "127.0.0.1", *, reuse: bool = False) -> bool:
    """Can a server bind `host:port` now? With `reuse` as servers bind (SO_REUSEADDR): a port that only
    lingers in TIME_WAIT after a server stopped counts as free, one something listens on does not."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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
