"""`ister dev` as a user runs it: `up --brokers 3` in the foreground, `status`, produce and consume through
it with the official client, a broker killed (-9) and started again by `up`, `restart-broker`, Ctrl-C
(SIGINT) stopping everything and keeping the data, `up` again with the messages still there, `down`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ister.devcluster.dev import readiness_at
from ister.devcluster.ports import bindable, port_range
from ister.devcluster.seaweed import GRPC_OFFSET
from ister.devcluster.spec import BASE_SPAN
from ister.devcluster.state import alive, read_state
from tests.integration.harness import ISTER, client, consumer, producer, take
from tests.support import free_port, until

pytestmark = pytest.mark.integration

WAIT = 90.0
POLL = 0.5  # the waits for `up` read files, pids and /readyz (ms of CPU each); brokers start in seconds
READ_ALL = ["--from-beginning", "-c", "10", "--json"]


def port_block() -> int:
    """A base port p with p .. p + BASE_SPAN (and weed's gRPC ports above them) free on loopback."""
    for _ in range(50):
        base = free_port()
        if base + BASE_SPAN >= port_range().stop:
            continue  # the block stays in this process's share of ports (pytest-xdist workers)
        ports = [*range(base, base + BASE_SPAN), *(base + 2 + i + GRPC_OFFSET for i in range(7))]
        if all(bindable(p) for p in ports):
            return base
    raise AssertionError("no free block of ports")


def dev(directory: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ISTER, "dev", *args, "--dir", str(directory)], capture_output=True, text=True, timeout=timeout
    )


def status(directory: Path) -> dict[str, Any]:
    got = dev(directory, "status", "-o", "json")
    assert got.returncode == 0, got.stderr
    body: dict[str, Any] = json.loads(got.stdout)
    return body


def looks_ready(directory: Path) -> bool:
    """What `ister dev status` reads, read here (state.json, pids, each broker's /readyz): the waits poll
    this and run the command, which costs a Python start (~0.5 s of CPU), only once it holds."""
    state = read_state(directory)
    if state is None or state.get("phase") != "running" or not alive(state.get("pid"), "dev"):
        return False
    services = state["services"]
    return all(alive(s.get("pid"), s.get("marker", "")) for s in services) and all(
        readiness_at(s["addresses"]["readyz"]) is None for s in services if s["name"].startswith("broker-")
    )


def all_ready(directory: Path) -> dict[str, Any] | None:
    if not looks_ready(directory):
        return None  # `up` has not written its state yet, or something does not run or is not ready
    body = status(directory)
    ok = body["phase"] == "running" and all(v is None for v in body["ready"].values())
    return body if ok and all(body["running"].values()) else None


def start_up(directory: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ISTER, "dev", "up", "--dir", str(directory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ISTER_")},
    )


def exited(up: subprocess.Popen[str] | None) -> str:
    """What `up` printed when it has exited (a failing wait shows why)."""
    if up is None or up.poll() is None:
        return ""
    return f"\n`up` exited with {up.returncode}:\n{up.communicate()[0]}"


def console_page(url: str) -> str | None:
    """The console's overview once it lists three brokers (they register one by one)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            page: str = resp.read().decode()
    except OSError:
        return None
    return page if page.count("data-broker=") == 3 else None


def pids(body: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["pid"] for s in body["services"]}


def addresses(body: dict[str, Any], name: str) -> dict[str, str]:
    return next(s["addresses"] for s in body["services"] if s["name"] == name)


@pytest.mark.timeout(400)  # two `up`s of three brokers, a crash and a restart: about 40 s on an idle machine
async def test_dev_up_status_produce_consume_restart_stop_and_up_again(tmp_path: Path) -> None:
    where = tmp_path / "dev"
    up = start_up(where, "--brokers", "3", "--port-base", str(port_block()), "--console")
    second: subprocess.Popen[str] | None = None
    try:
        body = await until(
            lambda: all_ready(where),
            lambda: f"the dev cluster running and every broker ready{exited(up)}",
            WAIT,
            POLL,
        )
        assert body["brokers"] == 3 and body["replication_factor"] == 3
        names = [s["name"] for s in body["services"]]
        assert names == ["etcd", "broker-0", "broker-1", "broker-2", "console"]
        url = addresses(body, "broker-0")["client"]
        # The console (--console) serves the cluster's overview, read from broker-0's admin API.
        page = await until(
            lambda: console_page(addresses(body, "console")["http"]),
            "the console's overview listing three brokers",
            WAIT,
        )
        for i in range(3):
            assert addresses(body, f"broker-{i}")["client"].removeprefix("http://") in page

        # Through it with the official client: a reliable topic, replicated on three brokers.
        c = await client(url)
        prod = await producer(c, "/default/dev-topic", "p1", reliable=True)
        cons, queue = await consumer(c, "/default/dev-topic", "c1", "s1")
        for i in range(10):
            await prod.send(f"m{i}".encode(), {})
        got = await take(queue, 10, ack=cons, within=30)
        assert [bytes(m.payload) for m in got] == [f"m{i}".encode() for i in range(10)]
        # Done with: left open, danube-client's receive loop reopens its stream without a pause while a
        # broker is down (~15k failed calls in this test, most of its own CPU).
        await cons.close()

        # A broker crashes: `up` starts it again (a new pid, ready again).
        before = pids(body)
        os.kill(before["broker-1"], signal.SIGKILL)
        again = await until(
            lambda: (b := all_ready(where)) is not None and pids(b)["broker-1"] != before["broker-1"] and b,
            "broker-1 started again by `ister dev up` and ready",
            WAIT,
            POLL,
        )
        assert pids(again)["broker-0"] == before["broker-0"]
        # `restart-broker` does it on purpose, gracefully, and waits until it is ready.
        restarted = dev(where, "restart-broker", "2")
        assert restarted.returncode == 0, restarted.stderr
        assert restarted.stdout.startswith(f"broker-2 restarted: pid {before['broker-2']} -> ")

        # Ctrl-C: everything stops (brokers, then etcd) and the data stays.
        running = pids(await until(lambda: all_ready(where), "ready after the restarts", WAIT, POLL))
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=120)
        assert up.returncode == 0, out
        assert "export ISTER_ADMIN_ADDR=" in out and f"export ISTER_SERVICE_ADDR={url}" in out
        order = [line for line in out.splitlines() if line.endswith(" stopped") or "stopped (status" in line]
        stopped = [line.split()[2] for line in order]
        assert stopped == ["console", "broker-0", "broker-1", "broker-2", "etcd"], out
        assert not any(alive(pid, "") for pid in running.values())
        assert status(where)["phase"] == "stopped"
        assert (where / "broker-0" / "wal").is_dir() and (where / "etcd" / "data.etcd").is_dir()

        # `up` again on the same directory (its ports and size come from the saved plan): the messages are
        # still there.
        second = start_up(where)
        await until(
            lambda: all_ready(where),
            lambda: f"the second `up` running and ready: {dev(where, 'status').stdout}{exited(second)}",
            WAIT,
            POLL,
        )
        read = await asyncio.to_thread(
            subprocess.run,
            [*ISTER, "consume", "-s", url, "-t", "/default/dev-topic", "-m", "again", *READ_ALL],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert read.returncode == 0, read.stderr
        payloads = [json.loads(line)["payload"] for line in read.stdout.splitlines()]
        assert payloads == [f"m{i}" for i in range(10)]
        down = dev(where, "down")
        assert down.returncode == 0 and "stopped (data kept in" in down.stdout, down.stderr
        assert second.wait(30) == 0
        assert status(where)["phase"] == "stopped"
    finally:
        for proc in (up, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=120)


def test_up_refuses_a_second_cluster_on_the_same_directory_and_other_flags(tmp_path: Path) -> None:
    where = tmp_path / "dev"
    where.mkdir()
    (where / "plan.json").write_text(
        json.dumps(
            {
                "brokers": 1,
                "s3": False,
                "ports": {"etcd_client": 1, "etcd_peer": 2, "weed": {}, "brokers": [[3, 4, 5]]},
            }
        )
    )
    got = dev(where, "up", "--brokers", "3")
    assert got.returncode == 2
    assert "holds a cluster of 1 broker: start it as it is, or add --fresh" in got.stderr
    assert (where / "plan.json").exists()  # nothing changed
    bad = dev(where, "status", "-o", "yaml")
    assert bad.returncode == 2 and "--output must be table or json" in bad.stderr


@pytest.mark.timeout(300)
async def test_down_stops_what_a_killed_up_left_running(tmp_path: Path) -> None:
    where = tmp_path / "dev"
    up = start_up(where, "--brokers", "1", "--port-base", str(port_block()))
    try:
        body = await until(lambda: all_ready(where), "the dev cluster running and ready", WAIT, POLL)
        up.kill()  # `up` dies; its children run on in their own process groups
        up.communicate(timeout=30)
        left = pids(body)
        assert all(alive(pid, "") for pid in left.values())
        again = dev(where, "up")
        assert again.returncode == 1
        assert (
            "an earlier `ister dev up` left etcd pid" in again.stderr
            and "`ister dev down` stops them" in again.stderr
        )
        down = dev(where, "down")
        assert down.returncode == 0, down.stderr
        assert "`up` was not running; stopped 2 left-over processes" in down.stdout
        assert "broker-0 stopped" in down.stderr and down.stderr.index("broker-0") < down.stderr.index("etcd")
        assert not any(alive(pid, "") for pid in left.values())
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate(timeout=30)


def test_up_says_which_ports_are_taken_and_starts_nothing(tmp_path: Path) -> None:
    base = port_block()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 11))  # broker-0's admin port
        taken.listen()
        got = dev(tmp_path / "dev", "up", "--brokers", "1", "--port-base", str(base))
    assert got.returncode == 1
    assert f"error: ports in use: {base + 11} (broker-0 admin); stop what listens there" in got.stderr
    assert not (tmp_path / "dev").exists()
