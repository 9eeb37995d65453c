"""Prometheus metrics of reliable dispatch, graceful shutdown with live streams, and configuration sources."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import danube
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import (
    ISTER,
    BrokerProcess,
    client,
    consumer,
    nothing_within,
    producer,
    take,
)
from tests.support import free_port

pytestmark = pytest.mark.integration
S = danube.SubType

LAG = "danube_subscription_lag_messages"
HEARTBEAT = "danube_dispatcher_heartbeat_polls_total"
NOTIFIER = "danube_dispatcher_notifier_polls_total"


# -- helpers -------------------------------------------------------------------------------------------------


def _scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def scrape(url: str) -> dict[tuple[str, str, str], float]:
    """(sample name, topic, subscription) -> value for every labelled sample on the exporter."""
    text = await asyncio.to_thread(_scrape_text, url)
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "topic" in s.labels and "subscription" in s.labels:
                out[(s.name, s.labels["topic"], s.labels["subscription"])] = s.value
    return out


async def wait_metric(
    url: str,
    name: str,
    topic: str,
    sub: str,
    ok: Callable[[float], bool],
    within: float = 10.0,
) -> float:
    """Poll the exporter until the sample exists and satisfies `ok`; fail with the last value seen."""
    deadline = time.monotonic() + within
    last: float | None = None
    while True:
        last = (await scrape(url)).get((name, topic, sub))
        if last is not None and ok(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{{topic={topic!r}, subscription={sub!r}}} = {last} after {within} s")
        await asyncio.sleep(0.1)


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


# -- metrics -------------------------------------------------------------------------------------------------


async def test_dispatch_metrics_after_reliable_traffic(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c1", "metrics", S.EXCLUSIVE)
    for i in range(5):
        await p.send(f"m{i}".encode())
    await take(q, 5, ack=cons)
    # The publish notifier woke the dispatcher at least once for these messages.
    await wait_metric(shared_broker.metrics_url, NOTIFIER, topic, "metrics", lambda v: v > 0)
    samples = await scrape(shared_broker.metrics_url)
    for name in (LAG, HEARTBEAT, NOTIFIER):
        assert (name, topic, "metrics") in samples, f"{name} has no series for {topic}/metrics"
    await cons.close()


async def test_heartbeat_polls_idle_subscription(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    await producer(c, topic, "p1", reliable=True)
    cons, _q = await consumer(c, topic, "c1", "idle", S.EXCLUSIVE)
    url = shared_broker.metrics_url
    start = await wait_metric(url, HEARTBEAT, topic, "idle", lambda v: v >= 0)
    t0 = time.monotonic()
    # Heartbeat every <= 500 ms: three more polls need ~1.5 s; allow twice that before failing.
    await wait_metric(url, HEARTBEAT, topic, "idle", lambda v: v >= start + 3, within=3.0)
    assert time.monotonic() - t0 < 3.5
    await cons.close()


async def test_lag_gauge_tracks_unacked_then_zero(shared_broker: BrokerProcess, topic: str) -> None:
    c = await client(shared_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c1", "lag", S.EXCLUSIVE)
    url = shared_broker.metrics_url
    await wait_metric(url, LAG, topic, "lag", lambda v: v == 0)
    for i in range(6):
        await p.send(f"m{i}".encode())
    got = await take(q, 6)  # delivered, not acknowledged
    await wait_metric(url, LAG, topic, "lag", lambda v: v == 6)
    for m in got[:2]:
        await cons.ack(m)
    await wait_metric(url, LAG, topic, "lag", lambda v: v == 4)
    await cons.ack(got[3])  # out of order: offset 2 is still open
    await cons.ack(got[2])  # closes the gap: the cursor passes 2 and 3 together
    await wait_metric(url, LAG, topic, "lag", lambda v: v == 2)
    for m in got[4:]:
        await cons.ack(m)
    await wait_metric(url, LAG, topic, "lag", lambda v: v == 0)
    await cons.close()


# -- graceful shutdown ---------------------------------------------------------------------------------------


async def test_sigterm_with_live_streams_exits_zero_and_keeps_cursor(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    """test_durability covers SIGTERM after the consumer left; here its stream is still open."""
    c = await client(fresh_broker.url)
    p = await producer(c, topic, "p1", reliable=True)
    cons, q = await consumer(c, topic, "c1", "live", S.EXCLUSIVE)
    for i in range(10):
        await p.send(f"m{i}".encode())
    got = await take(q, 7, ack=cons)  # 7 acks: far from the 1,000-ack or 5 s flush triggers
    assert [m.msg_id.topic_offset for m in got] == list(range(7))
    t0 = time.monotonic()
    assert fresh_broker.terminate() == 0
    assert time.monotonic() - t0 < 15
    assert "Traceback" not in fresh_broker.log()
    await cons.close()  # stop the old client's reconnect loop before the broker comes back
    fresh_broker.start()
    c2 = await client(fresh_broker.url)
    cons2, q2 = await consumer(c2, topic, "c1", "live", S.EXCLUSIVE)
    rest = await take(q2, 3, ack=cons2)
    assert [m.msg_id.topic_offset for m in rest] == [7, 8, 9]  # the shutdown flushed cursor 6
    assert await nothing_within(q2, 0.5)
    await cons2.close()


# -- configuration sources -----------------------------------------------------------------------------------


async def test_config_file_applies_and_flags_override(tmp_path: Path, topic: str) -> None:
    yaml_prom = free_port()
    config = tmp_path / "ister.yml"
    config.write_text(
        "dispatch:\n"
        "  max_unacked_messages: 3\n"  # non-default window, observable through delivery
        f"prom_exporter: 127.0.0.1:{yaml_prom}\n"  # overridden by the harness's --prom-exporter flag
    )
    broker = BrokerProcess(tmp_path / "data", "--config-file", str(config))
    broker.start()
    try:
        c = await client(broker.url)
        p = await producer(c, topic, "p1", reliable=True)
        cons, q = await consumer(c, topic, "c1", "win", S.EXCLUSIVE)
        for i in range(6):
            await p.send(f"m{i}".encode())
        first = await take(q, 3)
        assert [m.payload for m in first] == [b"m0", b"m1", b"m2"]
        assert await nothing_within(q, 1.0), "window of 3 from the config file not applied"
        for m in first:
            await cons.ack(m)
        rest = await take(q, 3, ack=cons)
        assert [m.payload for m in rest] == [b"m3", b"m4", b"m5"]
        # The flag's Prometheus port serves; the config file's was never opened.
        assert LAG in await asyncio.to_thread(_scrape_text, broker.metrics_url)
        assert _refused(yaml_prom)
        await cons.close()
    finally:
        broker.stop()


def _run_broker_with(tmp_path: Path, yaml_text: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "bad.yml"
    config.write_text(yaml_text)
    return subprocess.run(
        [
            *ISTER,
            "broker",
            "--config-file",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
            "--broker-addr",
            f"127.0.0.1:{free_port()}",
            "--prom-exporter",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("dispatch:\n  max_unacked_messages: 0\n", "max_unacked_messages"),
        ("wal:\n  fsync: sometimes\n", "fsync"),
        ("wal:\n  fsynk: always\n", "fsynk"),
        ("admin_addr: no-port\n", "admin_addr"),
        ("dispatch: [1, 2]\n", "dispatch"),
    ],
    ids=["out-of-range", "bad-enum", "unknown-key", "bad-address", "wrong-type"],
)
def test_invalid_config_file_exits_nonzero_naming_the_key(tmp_path: Path, yaml_text: str, key: str) -> None:
    result = _run_broker_with(tmp_path, yaml_text)
    assert result.returncode != 0
    assert key in result.stderr
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_bootstrap_namespace_in_config_file(tmp_path: Path) -> None:
    result = _run_broker_with(tmp_path, "bootstrap_namespaces: ['has space']\n")
    assert result.returncode != 0
    assert "bootstrap_namespaces" in result.stderr
    assert "Traceback" not in result.stderr


def test_unrelated_ister_variable_is_ignored_with_a_warning(tmp_path: Path) -> None:
    """A script's own ISTER_REPO does not stop the broker; the warning names it."""
    broker = BrokerProcess(tmp_path / "data", env={"ISTER_REPO": "/src/ister", "ISTER_LOG_LEVEL": "info"})
    broker.start()
    try:
        assert "warning: ignoring environment variable ISTER_REPO: no setting is named 'repo'" in broker.log()
    finally:
        broker.stop()


# -- the exporter --------------------------------------------------------------------------------------------


def _status(url: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_exporter_answers_404_off_the_metrics_path(shared_broker: BrokerProcess) -> None:
    base = shared_broker.metrics_url.removesuffix("/metrics")
    assert _status(shared_broker.metrics_url) == 200
    assert _status(base + "/") == 404
    assert _status(base + "/healthz") == 200  # the health endpoints (test_health.py)
    assert _status(base + "/healthzz") == 404
    assert _status(shared_broker.metrics_url, "POST") == 405


def _topics_in(text: str) -> set[str]:
    return {
        s.labels["topic"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "topic" in s.labels
    }


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


@pytest.mark.parametrize(
    ("env", "exported"),
    [({"ISTER_METRICS__PER_TOPIC": "false"}, 0), ({"ISTER_METRICS__MAX_TOPICS": "2"}, 2)],
    ids=["per-topic-off", "top-2"],
)
async def test_per_topic_series_are_bounded(tmp_path: Path, env: dict[str, str], exported: int) -> None:
    broker = BrokerProcess(tmp_path / "data", env=env)
    broker.start()
    try:
        c = await client(broker.url)
        topics = [f"/default/bounded_{i}" for i in range(4)]
        for i, t in enumerate(topics):
            p = await producer(c, t, "p", reliable=True)
            for _ in range(i + 1):  # the busiest topics are the last ones
                await p.send(b"x")
        text = await asyncio.to_thread(_scrape_text, broker.metrics_url)
        assert _topics_in(text) == set(topics[len(topics) - exported :])
        assert _sample(text, "ister_metrics_topics", series="exported") == exported
        assert _sample(text, "ister_metrics_topics", series="omitted") == len(topics) - exported
        assert _sample(text, "ister_broker_messages_in_total") == 1 + 2 + 3 + 4  # every topic counts
    finally:
        broker.stop()
