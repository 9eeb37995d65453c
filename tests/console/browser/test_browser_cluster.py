"""The console in a browser against a real 3-broker cluster on etcd: the overview lists the three brokers
and one leader, a replicated topic's page shows its three replicas in sync, and with one broker gone the
overview lists the topic as under-replicated (highlighted, and still passing the contrast checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from ister.client import Client
from tests.console.browser.support import checked, reload_until
from tests.console.console_support import console
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.replication_support import RF_ENV

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(240)]


async def test_a_three_broker_cluster_overview_and_a_topics_replicas(
    tmp_path: Path, etcd_server: EtcdServer, page: Page
) -> None:
    cluster = Cluster(tmp_path, etcd_server.endpoint, 3, 2, env=RF_ENV)
    try:
        await cluster.start()
        topic = "/default/ledger"
        async with Client(cluster.brokers[0].url) as ister:
            pub = await ister.producer(topic)
            await pub.send_batch([b"a", b"b", b"c"])
            await pub.flush()
        leader = await cluster.leader()
        ids = sorted(str(cluster.broker_id(b)) for b in cluster.brokers)
        with console(cluster.brokers[0].admin_addr) as base:
            await page.goto(base + "/")
            rows = page.locator("#brokers tbody tr")
            await expect(rows).to_have_count(3)
            assert sorted(await page.locator("#brokers tbody tr td:first-child").all_inner_texts()) == ids
            await expect(page.locator(f'#brokers tr[data-broker="{leader}"]')).to_contain_text("leader")
            await expect(page.get_by_role("cell", name="leader", exact=True)).to_have_count(1)
            await expect(page.locator("#brokers td.state", has_text="active")).to_have_count(3)
            await checked(page, "cluster-overview")
            await page.goto(f"{base}/topic{topic}")
            await expect(page.locator("#end-offset")).to_have_text("3")
            # Replicas in placement order (the owner first), the in-sync set sorted: all three once the
            # followers caught up.
            in_sync = ", ".join(sorted(ids, key=int))
            await reload_until(page, page.locator("#in-sync"), in_sync)
            assert set((await page.locator("#replicas").inner_text()).split(", ")) == set(ids)
            owner_first = (await page.locator("#replicas").inner_text()).split(", ")[0]
            await expect(page.locator("#owner")).to_have_text(owner_first)
            await checked(page, "cluster-topic")
            await page.goto(base + "/rebalancing")
            await expect(page.locator("#recent-moves")).to_be_visible()
            await checked(page, "cluster-rebalancing")

            # A follower goes: the live overview shows the topic under-replicated, without a reload.
            await page.goto(base + "/")
            await expect(page.locator("#count-under-replicated")).to_have_text("0")
            victim = next(b for b in cluster.brokers[1:] if str(cluster.broker_id(b)) != owner_first)
            victim.kill9()
            row = page.locator(f'#under-replicated tr[data-topic="{topic}"]')
            await expect(row).to_be_visible(timeout=30_000)
            await expect(page.locator("#count-under-replicated")).to_have_text("1")
            await checked(page, "cluster-overview-under-replicated")
    finally:
        await cluster.stop()
