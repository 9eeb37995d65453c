"""Liveness and readiness (broker/health.py) on a fake clock, and their routes on the metrics server."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ister.broker.health import Check, Health, json_body, metadata_probe
from ister.errors import MetadataError
from ister.metadata.embedded import EmbeddedStore
from ister.server.metrics_http import BearerToken, MetricsServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ok_probe(name: str) -> tuple[str, object]:
    async def probe() -> Check:
        return Check(name, True, "fine")

    return name, probe


def health(clock: Clock, beat: list[float], *probes: tuple[str, object]) -> Health:
    return Health(
        lambda: beat[0], list(probes), clock=clock, live_within=10, probe_timeout=0.2, stale_after=5
    )  # type: ignore[arg-type]


def test_live_follows_the_loop_heartbeat() -> None:
    clock, beat = Clock(), [100.0]
    h = health(clock, beat)
    assert h.live() == (200, {"status": "ok", "event_loop_lag_seconds": 0.0})
    clock.now = 110.5  # the loop has not beaten for 10.5 s
    status, body = h.live()
    assert status == 503 and body["status"] == "unhealthy" and "10.5 s" in body["reason"]
    beat[0] = 110.4
    assert h.live()[0] == 200


async def test_while_waiting_for_a_dependency_the_wait_is_the_first_reason() -> None:
    clock, beat = Clock(), [100.0]
    h = health(clock, beat)
    h.waiting = "waiting for etcd at http://127.0.0.1:2379 (attempt 2 failed: refused; next try in 1.0 s)"
    status, body = h.ready()
    assert status == 503 and body["waiting_for"] == h.waiting
    assert body["reasons"] == [h.waiting, "starting", "starting: readiness not checked yet"]
    assert h.live()[0] == 200  # waiting is not dead
    h.waiting = None  # reached: the probes of the parts built after it are added
    h.add_probes([ok_probe("metadata")])  # type: ignore[list-item]
    await h.check_once()
    h.started = True
    assert h.ready()[0] == 200 and "waiting_for" not in h.ready()[1]


async def test_ready_once_started_and_every_probe_holds() -> None:
    clock, beat = Clock(), [100.0]
    h = health(clock, beat, ok_probe("metadata"))
    status, body = h.ready()
    assert status == 503 and body["reasons"] == ["starting", "starting: readiness not checked yet"]
    await h.check_once()
    assert h.ready()[0] == 503  # checked, but the broker is not serving yet
    h.started = True
    assert h.ready() == (
        200,
        {"status": "ready", "checks": {"metadata": {"ok": True, "detail": "fine"}}},
    )
    h.stopping = True
    status, body = h.ready()
    assert status == 503 and body["reasons"] == ["shutting down"]


async def test_a_failing_a_raising_and_a_silent_probe_each_say_why() -> None:
    async def draining() -> list[Check]:
        return [Check("state", False, "draining"), Check("topics", True)]

    async def raising() -> Check:
        raise MetadataError("etcd at 127.0.0.1:2379 unreachable")

    async def silent() -> Check:
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    clock, beat = Clock(), [100.0]
    h = health(clock, beat, ("cluster", draining), ("metadata", raising), ("slow", silent))
    h.started = True
    await h.check_once()
    status, body = h.ready()
    assert status == 503
    assert body["reasons"] == [
        "state: draining",
        "metadata: etcd at 127.0.0.1:2379 unreachable",
        "slow: no answer within 0.2 s",
    ]
    assert body["checks"]["topics"] == {"ok": True, "detail": ""}


async def test_ready_fails_when_the_probes_stop_running() -> None:
    clock, beat = Clock(), [100.0]
    h = health(clock, beat, ok_probe("metadata"))
    h.started = True
    await h.check_once()
    clock.now = 106.0  # the loop did not run the probes for 6 s
    status, body = h.ready()
    assert status == 503 and body["reasons"][0].startswith("readiness last checked 6.0 s ago")


async def test_run_checks_again_and_again() -> None:
    calls = []
    third = asyncio.Event()

    async def probe() -> Check:
        calls.append(1)
        if len(calls) == 3:
            third.set()
        return Check("metadata", True)

    h = Health(lambda: 0.0, [("metadata", probe)], every=0.01)
    task = asyncio.create_task(h.run())
    try:
        await asyncio.wait_for(third.wait(), 5)
    finally:
        task.cancel()


async def test_metadata_probe_reads_the_store(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path / "metadata")
    probe = metadata_probe(store, "/cluster/leader")
    assert await probe() == Check("metadata", True, "the metadata store answers")
    await store.close()
    h = Health(lambda: 0.0, [("metadata", probe)])
    checks = await h.check_once()  # a closed store raises: the probe fails with its message
    assert [c.ok for c in checks] == [False] and checks[0].detail


# -- on the metrics server ----------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MetricsServer]:
    token = tmp_path / "token"
    token.write_text("secret\n")
    answers = {"ready": (503, {"status": "not_ready", "reasons": ["metadata: down"]})}

    def broken() -> tuple[int, bytes]:
        raise RuntimeError("a bug")

    s = MetricsServer(
        "127.0.0.1",
        0,
        lambda: b"m 1\n",
        bearer_token=BearerToken(str(token)),
        routes={
            "/healthz": lambda: json_body((200, {"status": "ok"})),
            "/readyz": lambda: json_body(answers["ready"]),
            "/broken": broken,
        },
    ).start()
    yield s
    s.shutdown()


def get(server: MetricsServer, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def test_health_routes_answer_json_without_the_bearer_token(server: MetricsServer) -> None:
    assert get(server, "/healthz") == (200, "application/json", b'{"status": "ok"}\n')
    status, kind, body = get(server, "/readyz?verbose=1")
    assert (status, kind) == (503, "application/json")
    assert json.loads(body) == {"status": "not_ready", "reasons": ["metadata: down"]}
    assert get(server, "/readyz", "HEAD")[:2] == (503, "application/json")
    assert get(server, "/metrics")[0] == 401  # the token still guards the metrics
    assert get(server, "/healthz", "POST")[0] == 401  # only GET and HEAD reach a route
    status, _, body = get(server, "/broken")
    assert status == 503 and json.loads(body)["status"] == "error"
    assert get(server, "/healthz")[0] == 200  # the server lives on
