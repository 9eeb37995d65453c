"""Every console page in a real headless Chromium, against a real broker and a real `ister console`
process, with data this module made: 10,000 topics to search, a backlog, a cursor reset, an Avro message,
and a broker restart the live overview rides out without a reload."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from playwright.async_api import Browser, Page, expect

from ister.wire.gen import DanubeAdmin_pb2 as apb
from ister.wire.gen import DanubeAdmin_pb2_grpc as apb_grpc
from ister.wire.gen import SchemaRegistry_pb2 as spb
from ister.wire.gen import SchemaRegistry_pb2_grpc as spb_grpc
from tests.console.browser.support import DESKTOP, NARROW, cell, checked, no_horizontal_scroll, reload_until
from tests.console.console_support import console
from tests.integration.harness import ISTER, BrokerProcess, client, consumer, producer, take

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(180)]

# 10,000 topics, made the fastest real way: 10 non-reliable partitioned topics of 1,000 partitions, each
# partition a topic of its own in the listing (about 10 s on an idle 2-core machine; one topic per
# CreateTopic call, 64 at a time, takes twice that).
FLEETS, PARTITIONS = 10, 1000
FLEET_TOPICS = sorted(f"/default/fleet-{f}-part-{p}" for f in range(FLEETS) for p in range(PARTITIONS))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    broker = BrokerProcess(tmp_path_factory.mktemp("console-browser") / "data")
    broker.start()
    try:
        with grpc.insecure_channel(broker.admin_addr) as channel:
            stub = apb_grpc.TopicAdminStub(channel)
            calls = [
                stub.CreatePartitionedTopic.future(
                    apb.PartitionedTopicRequest(base_name=f"/default/fleet-{f}", partitions=PARTITIONS),
                    timeout=120,
                )
                for f in range(FLEETS)
            ]
            for call in calls:
                call.result()
        with console(broker.admin_addr) as base:
            yield broker, base
    finally:
        broker.stop()


async def tab_to(page: Page, name: str, most: int = 12) -> list[str]:
    """Press Tab until the link or field named `name` has the focus; the names focused on the way."""
    seen: list[str] = []
    for _ in range(most):
        await page.keyboard.press("Tab")
        focused: str = await page.evaluate(
            "() => (document.activeElement.innerText || document.activeElement.id || '').trim()"
        )
        seen.append(focused)
        if focused == name:
            return seen
    raise AssertionError(f"{most} Tabs never reached {name!r}: {seen}")


async def test_overview_and_keyboard_navigation(setup: tuple[BrokerProcess, str], page: Page) -> None:
    broker, base = setup
    await page.goto(base + "/")
    row = page.locator("#brokers tbody tr")
    await expect(row).to_have_count(1)
    cells = await row.locator("td").all_inner_texts()
    assert cells[1:5] == [broker.url, "Cluster_Leader", "active", "leader"], cells
    await expect(page.locator("#total-brokers")).to_have_text("1")
    assert int(await cell(page, "#total-topics")) >= FLEETS * PARTITIONS
    await checked(page, "overview")
    # The skip link first, then the main navigation, in reading order; Enter follows the focused link.
    assert await tab_to(page, "Topics") == ["Skip to content", "Overview", "Topics"]
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(base + "/topics")
    await expect(page.locator("h1")).to_have_text("Topics")
    await checked(page, "topics-all")
    await tab_to(page, "Subscriptions")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(base + "/subscriptions")
    await checked(page, "subscriptions-empty")


async def test_topics_search_sort_and_paging_over_10000_topics(
    setup: tuple[BrokerProcess, str], page: Page
) -> None:
    _, base = setup
    await page.goto(base + "/topics")
    # By keyboard: the search field follows the navigation; Enter submits the search.
    await tab_to(page, "q")
    started = time.monotonic()
    await page.keyboard.type("FLEET-3-PART-41")
    await page.keyboard.press("Enter")
    await expect(page.locator("#match-count")).to_have_text("11 topics match · page 1 of 1")
    searched = time.monotonic() - started
    names = await page.locator("#topics tbody td:first-child").all_inner_texts()
    assert names == sorted(["/default/fleet-3-part-41", *(f"/default/fleet-3-part-41{i}" for i in range(10))])
    await page.locator("#q").fill("fleet-")
    await page.locator("#q").press("Enter")
    await expect(page.locator("#match-count")).to_have_text("10000 topics match · page 1 of 200")
    assert await page.locator("#topics tbody tr").count() == 50
    await page.get_by_role("link", name="Name ▲").click()  # sorted by name already: this reverses it
    await expect(page.locator("#topics tbody td").first).to_have_text(FLEET_TOPICS[-1])
    await page.get_by_role("link", name="Next").click()
    await expect(page.locator("#match-count")).to_have_text("10000 topics match · page 2 of 200")
    newest_first = FLEET_TOPICS[::-1]
    assert await page.locator("#topics tbody td:first-child").all_inner_texts() == newest_first[50:100]
    await page.get_by_role("link", name="Previous").click()
    await expect(page.locator("#match-count")).to_have_text("10000 topics match · page 1 of 200")
    await checked(page, "topics")
    print(f"search over {len(FLEET_TOPICS)} topics, typed to shown: {searched:.2f} s")


async def test_topic_page_shows_the_offsets_and_the_backlog_the_test_left(
    setup: tuple[BrokerProcess, str], page: Page
) -> None:
    broker, base = setup
    topic = "/default/payments"
    c = await client(broker.url)
    p = await producer(c, topic, "payer", reliable=True)
    cons, queue = await consumer(c, topic, "reader", "audit")
    for i in range(10):
        await p.send(f"m{i}".encode())
    await take(queue, 4, ack=cons)  # 4 acknowledged, 6 left
    await page.goto(base + "/topics?q=payments")
    # The console lists topics from a cache of up to 3 s: the new topic shows within that.
    await reload_until(page, page.locator("#topics tbody td:first-child"), topic)
    await page.get_by_role("link", name=topic).click()
    await expect(page.locator("h1")).to_have_text(topic)
    backlog = page.locator('tr[data-sub="audit"] td.backlog')
    await reload_until(page, backlog, "6")
    for field, value in (("#start-offset", "0"), ("#end-offset", "10"), ("#message-count", "10")):
        assert await cell(page, field) == value, field
    await expect(page.locator("table").filter(has_text="payer")).to_be_visible()
    await checked(page, "topic")
    await page.get_by_role("link", name="Subscriptions", exact=True).click()
    listed = page.locator(f'tr[data-sub="audit"]:has(a[href="/topic{topic}"]) td.backlog')
    await expect(listed).to_have_text("6")
    await checked(page, "subscriptions")
    await cons.close()
    await p.close()


async def test_reset_cursor_previews_then_moves_on_confirm(
    setup: tuple[BrokerProcess, str], page: Page, browser: Browser
) -> None:
    _, base = setup
    topic = "/default/payments"  # the previous test left subscription audit at offset 4 of 10
    await page.goto(f"{base}/topic{topic}")
    await page.locator('tr[data-sub="audit"] a.reset').click()
    await expect(page.locator("#subscription")).to_have_value("audit")
    await checked(page, "reset")
    await page.get_by_label("Position: earliest, latest or an offset").fill("earliest")
    await page.locator("#preview").click()
    row = page.locator("#preview-table tbody tr")
    await expect(row).to_have_count(1)
    assert await row.locator("td").all_inner_texts() == [topic, "0", "10", "10", "0"]
    await checked(page, "reset-preview")
    # The preview is the broker's dry run: in another tab the backlog is still 6.
    other = await page.context.new_page()
    await other.goto(f"{base}/topic{topic}")
    await expect(other.locator('tr[data-sub="audit"] td.backlog')).to_have_text("6")
    await other.close()
    await page.locator("#confirm").click()
    await expect(page).to_have_url(f"{base}/topic{topic}?reset=audit")
    await expect(page.get_by_role("status").filter(has_text="The cursor of audit was moved.")).to_be_visible()
    await reload_until(page, page.locator('tr[data-sub="audit"] td.backlog'), "10")
    await checked(page, "reset-done")


READING = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "id", "type": "int"}, {"name": "v", "type": "double"}],
}


async def test_the_message_browser_shows_an_avro_message_decoded(
    setup: tuple[BrokerProcess, str], page: Page, tmp_path: Path
) -> None:
    broker, base = setup
    avsc = tmp_path / "r.avsc"
    avsc.write_text(json.dumps(READING))
    produce = [*ISTER, "produce", "-s", broker.url, "-t", "/default/readings", "--schema-file", str(avsc)]
    out = await asyncio.to_thread(
        subprocess.run,
        [*produce, "-m", '{"id": 7, "v": 2.5}', "-k", "k1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    await page.goto(f"{base}/topic/default/readings")
    await page.locator("#browse").click()
    await expect(page.locator("h1")).to_have_text("Messages of /default/readings")
    cells = await page.locator('#messages tr[data-offset="0"] td').all_inner_texts()
    assert cells[2] == "k1" and "(avro)" in cells[4], cells
    assert json.loads(cells[5]) == {"id": 7, "v": 2.5}
    await checked(page, "messages")


async def test_every_other_page_passes_the_contrast_and_label_checks(
    setup: tuple[BrokerProcess, str], page: Page
) -> None:
    """The pages the other tests do not visit, each checked as they are (axe-core's color-contrast and
    label rules among them): schemas with a diff and the draft form, security, rebalancing and the
    cluster's health on a standalone broker, a refusal and a bad request (the error page)."""
    broker, base = setup
    with grpc.insecure_channel(broker.admin_addr) as channel:
        registry = spb_grpc.SchemaRegistryStub(channel)
        for fields in (
            READING["fields"],
            [*READING["fields"], {"name": "unit", "type": "string", "default": ""}],
        ):
            definition = json.dumps({**READING, "fields": fields}).encode()
            registry.RegisterSchema(
                spb.RegisterSchemaRequest(subject="a11y", schema_type="avro", schema_definition=definition),
                timeout=10,
            )
    pages = [
        ("/schemas", "schemas", "Schemas"),
        ("/schemas/a11y", "schema", "a11y"),
        ("/security", "security", "Security"),
        ("/rebalancing", "rebalancing", "Rebalancing"),
        ("/brokers/0/drain", "refused", "Error"),
        ("/messages/default/readings?from=x", "bad-request", "Error"),
    ]
    for path, shot, heading in pages:
        await page.goto(base + path)
        await expect(page.locator("h1")).to_contain_text(heading)
        await checked(page, shot)
    await page.goto(base + "/schemas/a11y")
    await page.locator("#draft").fill(json.dumps(READING))
    await page.locator("#check").click()
    await checked(page, "schema-checked")


@pytest.mark.parametrize("viewport", [DESKTOP, NARROW], ids=["1280x800", "420x800"])
async def test_overview_and_topics_fit_the_window(
    setup: tuple[BrokerProcess, str], browser: Browser, viewport: dict[str, int]
) -> None:
    _, base = setup
    context = await browser.new_context(viewport=viewport)  # type: ignore[arg-type]
    try:
        page = await context.new_page()
        pages = (("/", "overview"), ("/topics?q=fleet", "topics"), ("/topic/default/fleet-0-part-0", "topic"))
        for path, shot in pages:
            await page.goto(base + path)
            await no_horizontal_scroll(page)
            await checked(page, f"{shot}-{viewport['width']}")
    finally:
        await context.close()


async def test_the_live_overview_shows_the_broker_down_and_back_without_a_reload(
    setup: tuple[BrokerProcess, str], page: Page
) -> None:
    broker, base = setup
    await page.goto(base + "/")
    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    await page.evaluate("() => { window.sameDocument = true; }")
    await asyncio.to_thread(broker.stop)
    try:
        await expect(page.locator("#unreachable")).to_be_visible(timeout=30_000)
        await checked(page, "overview-unreachable")
    finally:
        await asyncio.to_thread(broker.start)
    await expect(page.locator("#unreachable")).to_have_count(0, timeout=30_000)
    await expect(page.locator("#total-brokers")).to_have_text("1")
    assert await page.evaluate("() => window.sameDocument") is True and loads == []
