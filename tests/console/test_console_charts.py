"""The rate charts: uPlot is served from the wheel exactly as vendored (checksums in static/vendor/README.md),
pages load nothing from elsewhere, and the topic page's event stream sends the topic's current rates (the
page keeps the series), or in words why it cannot."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ister.console
from tests.console.console_support import console, get
from tests.integration.harness import BrokerProcess, client, producer

pytestmark = [pytest.mark.integration]

VENDOR = Path(ister.console.__file__).parent / "static" / "vendor"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    broker = BrokerProcess(tmp_path_factory.mktemp("charts") / "data")
    broker.start()
    try:
        with console(broker.admin_addr) as base:
            yield broker, base
    finally:
        broker.stop()


def first_event(
    url: str, name: str, wanted: Callable[[dict[str, object]], bool] = lambda _: True
) -> dict[str, object]:
    """The first `name` event of a server-sent event stream (as JSON) that is `wanted`; the stream sends
    one every 2 s; AssertionError after 30 s without one."""
    deadline = time.monotonic() + 30
    with urllib.request.urlopen(url, timeout=20) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        event = ""
        for raw in resp:
            if time.monotonic() > deadline:
                break
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == name:
                found: dict[str, object] = json.loads(line[6:])
                if wanted(found):
                    return found
    raise AssertionError(f"no {name} event from {url}")


def test_vendored_files_match_their_recorded_checksums_and_are_served(
    setup: tuple[BrokerProcess, str],
) -> None:
    _, base = setup
    table = re.findall(
        r"\| `([^`]+)` \|[^|]+\| 1\.6\.\d+ \| `([0-9a-f]{64})` \|", (VENDOR / "README.md").read_text()
    )
    assert {f for f, _ in table} == {"uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"}
    for name, digest in table:
        data = (VENDOR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        with urllib.request.urlopen(f"{base}/static/vendor/{name}", timeout=10) as resp:
            assert resp.read() == data


def test_the_browser_tests_axe_core_matches_its_recorded_checksums() -> None:
    """axe-core (tests/console/vendor/, the browser tests' contrast and label checks) is what was vendored."""
    vendor = Path(__file__).parent / "vendor"
    table = re.findall(
        r"\| `([^`]+)` \|[^|]+\| 4\.\d+\.\d+ \| `([0-9a-f]{64})` \|", (vendor / "README.md").read_text()
    )
    assert {f for f, _ in table} == {"axe.min.js", "axe.LICENSE", "axe.LICENSE-3RD-PARTY.txt"}
    for name, digest in table:
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name


def test_pages_with_charts_load_only_the_consoles_own_files(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    status, body = get(base + "/")
    assert status == 200 and 'id="chart-msgs"' in body and 'id="rates"' in body
    assert "/static/vendor/uPlot.iife.min.js" in body and "/static/charts.js" in body
    for url in re.findall(r'(?:src|href)="([^"]+)"', body):
        assert url.startswith(("/", "#")) and not url.startswith("//"), url  # no CDN, no other host


async def test_the_topic_stream_sends_current_rates_and_the_page_has_the_charts(
    setup: tuple[BrokerProcess, str],
) -> None:
    broker, base = setup
    topic = "/default/charted"
    c = await client(broker.url)
    p = await producer(c, topic, "charter", reliable=True)
    await p.send(b"first")

    async def keep_sending() -> None:  # the rate is over a window: keep it above zero while the test reads
        while True:
            await p.send(b"m" * 100)
            await asyncio.sleep(0.05)

    sender = asyncio.create_task(keep_sending())
    status, body = await asyncio.to_thread(get, f"{base}/topic{topic}")
    assert status == 200 and f'data-events="/events/topic{topic}"' in body
    url = f"{base}/events/topic{topic}"
    rates = await asyncio.to_thread(first_event, url, "rates")
    assert set(rates) == {"msg_in", "msg_out", "byte_in", "byte_out"}
    try:
        moving = await asyncio.to_thread(first_event, url, "rates", lambda r: float(str(r["msg_in"])) > 0)
    finally:
        sender.cancel()
    assert float(str(moving["byte_in"])) > 0
    await p.close()


def test_the_topic_stream_says_why_it_has_no_rates(setup: tuple[BrokerProcess, str]) -> None:
    broker, base = setup
    rates = first_event(f"{base}/events/topic/default/never-made", "rates")
    assert "NOT_FOUND" in str(rates["error"])
    broker.stop()
    try:
        rates = first_event(f"{base}/events/topic/default/charted", "rates")
        assert "UNAVAILABLE" in str(rates["error"])
    finally:
        broker.start()
