"""`ister console` against a real broker: the pages show what the test made, and the unreachable
banner comes and goes with the broker (HTTP level; the browser tests drive the same pages)."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from tests.console.console_support import get, post
from tests.integration.harness import ISTER, BrokerProcess, client, consumer, producer, take
from tests.support import free_port, stop_process, until_sync, wait_port

# One broker for the module, its state built test by test (a reset follows the backlog a test left): the
# tests run in order, in one xdist worker.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("console-http")]

TOPICS = 300


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    broker = BrokerProcess(tmp_path_factory.mktemp("console") / "data")
    broker.start()
    with grpc.insecure_channel(broker.admin_addr) as channel:
        stub = apb_grpc.TopicAdminStub(channel)
        for i in range(TOPICS):
            stub.CreateTopic(apb.NewTopicRequest(name=f"/default/orders-{i:04d}"), timeout=10)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ister.cli",
            "console",
            "--admin-addr",
            broker.admin_addr,
            "--listen",
            f"127.0.0.1:{port}",
        ],
    )
    try:
        wait_port(port, proc, 30, "console")
        yield broker, f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        broker.stop()


def test_overview_shows_the_broker_as_leader_and_the_topic_count(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    status, body = get(base + "/")
    assert status == 200
    assert f'<dd id="total-topics">{TOPICS}</dd>' in body
    assert '<dd id="total-brokers">1</dd>' in body
    assert "leader" in body and "unreachable" not in body


def test_topics_are_searched_sorted_and_paged_on_the_server(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    status, body = get(base + "/topics?q=ORDERS-01&sort=name&desc=1&size=20")
    assert status == 200
    assert "100 topics match · page 1 of 5" in body
    assert body.index("/default/orders-0199") < body.index("/default/orders-0180")
    assert "/default/orders-0200" not in body
    status, body = get(base + "/topics?sort=owner")
    assert status == 400 and "sort must be one of" in body


async def test_topic_and_subscriptions_pages_show_offsets_and_the_backlog_left(
    setup: tuple[BrokerProcess, str],
) -> None:
    broker, base = setup
    topic = "/default/payments"
    c = await client(broker.url)
    p = await producer(c, topic, "payer", reliable=True)
    cons, queue = await consumer(c, topic, "reader", "audit")
    for i in range(10):
        await p.send(f"m{i}".encode())
    await take(queue, 4, ack=cons)  # 4 acknowledged, 6 left: the backlog the pages must show

    def backlog_row(body: str) -> bool:
        return re.search(r'data-sub="audit">.*?class="num backlog">6<', body, re.S) is not None

    page = lambda path: asyncio.to_thread(get, base + path)  # noqa: E731
    status, body = await page(f"/topic{topic}")
    assert status == 200
    assert '<dd id="end-offset">10</dd>' in body and '<dd id="start-offset">0</dd>' in body
    assert "payer" in body
    for path in (f"/topic{topic}", "/subscriptions"):
        for _ in range(200):
            if backlog_row((await page(path))[1]):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{path} never showed a backlog of 6: {(await page(path))[1]}")
    status, body = await page("/topic/default/no-such-topic")
    assert status == 404
    await cons.close()
    await p.close()


def test_reset_cursor_previews_then_moves_only_when_confirmed(setup: tuple[BrokerProcess, str]) -> None:
    _, base = setup
    topic = "/default/payments"  # the previous test left subscription audit at offset 4 of 10
    url = f"{base}/reset{topic}"
    status, body = post(url, {"subscription": "audit", "to": "earliest", "at": ""})
    assert status == 200 and 'id="confirm"' in body, body
    assert re.search(r"<td>/default/payments</td><td class=\"num\">0</td><td class=\"num\">10</td>", body)
    assert 'class="num backlog">6<' in get(f"{base}/topic{topic}")[1]  # the preview moved nothing
    status, body = post(url, {"subscription": "audit", "to": "soon", "at": ""})
    assert status == 400 and "use earliest, latest or an offset" in body
    status, body = post(url, {"subscription": "audit", "to": "earliest", "at": "", "confirm": "yes"})
    assert status == 200 and "The cursor of audit was moved." in body
    until_sync(lambda: 'class="num backlog">10<' in get(f"{base}/topic{topic}")[1], "backlog 10 after reset")


READING = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "int"}, {"name": "v", "type": "double"}],
}


def test_the_message_browser_decodes_avro_and_moves_no_cursor(
    setup: tuple[BrokerProcess, str], tmp_path: Path
) -> None:
    broker, base = setup
    avsc = tmp_path / "r.avsc"
    avsc.write_text(json.dumps(READING))
    out = subprocess.run(
        [
            *ISTER,
            "produce",
            "-s",
            broker.url,
            "-t",
            "/default/readings",
            "--schema-file",
            str(avsc),
            "-m",
            '{"id": 7, "v": 2.5}',
            "-k",
            "k1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    status, body = get(base + "/messages/default/readings?from=0&count=10")
    assert status == 200
    assert re.search(r'<code>\{"id": ?7, ?"v": ?2\.5\}</code>', html.unescape(body)), body
    assert "<td>k1</td>" in body and "(avro)" in body
    assert get(base + "/messages/default/readings?from=x")[0] == 400
    # The topic `ister produce --schema-file` created is bound to the subject it registered (derived from the
    # topic's name): the topic page and `ister admin topics describe` name it, with its latest version.
    status, body = get(base + "/topic/default/readings")
    assert status == 200 and '<dd id="schema">default-readings v1 (avro)</dd>' in body, body
    described = subprocess.run(
        [
            *ISTER,
            "admin",
            "topics",
            "describe",
            "/default/readings",
            "--admin-addr",
            broker.admin_addr,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    info = json.loads(described.stdout)
    assert (info["schema_subject"], info["schema_version"], info["schema_type"]) == (
        "default-readings",
        1,
        "avro",
    )


def test_the_banner_shows_while_the_broker_is_down_and_goes_when_it_is_back(
    setup: tuple[BrokerProcess, str],
) -> None:
    broker, base = setup

    def all_topics_shown() -> bool:  # the earlier tests add a few topics to the TOPICS made here
        shown = re.search(r'id="total-topics">(\d+)<', get(base + "/fragments/overview")[1])
        return shown is not None and int(shown.group(1)) >= TOPICS

    assert all_topics_shown()
    broker.stop()
    try:
        until_sync(lambda: 'id="unreachable"' in get(base + "/fragments/overview")[1], "the banner")
    finally:
        broker.start()
    until_sync(all_topics_shown, "recovery", within=60)
