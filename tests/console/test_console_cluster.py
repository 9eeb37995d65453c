"""The console over a real 2-broker cluster: the overview's load table and publish rates from the load
reports, the drain button behind its confirmation (the broker drains), activate, and the rebalancing page."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.console.console_support import console, get, post
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.support import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
async def cluster(tmp_path: Path, etcd_server: EtcdServer) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, etcd_server.endpoint, 2, 2)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


async def test_load_table_drain_and_activate(cluster: Cluster) -> None:
    ids = sorted(await cluster.live())
    page = lambda url: asyncio.to_thread(get, url)  # noqa: E731
    with console(cluster.brokers[0].admin_addr) as base:

        async def reported() -> str | None:
            body = (await page(base + "/fragments/overview"))[1]
            rows = re.findall(r'data-load="(\d+)"', body)
            return body if sorted(int(r) for r in rows) == ids and "no report yet" not in body else None

        body = await until(reported, "both brokers' load reports on the overview")
        assert re.search(r'<dd id="rate-publish">\d', body), body  # from the load reports, not a dash
        victim = ids[1]
        assert f'href="/brokers/{victim}/drain"' in body  # the token may: no auth on this cluster
        status, body = await page(f"{base}/brokers/{victim}/drain")
        assert status == 200 and 'id="confirm"' in body and "<strong>0</strong> topic(s)" in body
        assert (await asyncio.to_thread(post, f"{base}/brokers/{victim}/drain", {}))[0] == 400  # unconfirmed
        status, body = await asyncio.to_thread(post, f"{base}/brokers/{victim}/drain", {"confirm": "yes"})
        assert status == 200 and f"Broker {victim} is draining" in body

        async def state_is(mode: str) -> bool:
            body = (await page(base + "/fragments/overview"))[1]
            found = re.search(rf'data-broker="{victim}">.*?<td class="state">(\w+)</td>', body, re.S)
            return found is not None and found.group(1) == mode

        await until(lambda: state_is("drained"), "the broker drained (it had no topics)")
        assert f'href="/brokers/{victim}/activate"' in (await page(base + "/"))[1]
        status, body = await asyncio.to_thread(post, f"{base}/brokers/{victim}/activate", {"confirm": "yes"})
        assert status == 200 and f"Broker {victim} is active again." in body
        await until(lambda: state_is("active"), "the broker active again")
        status, body = await page(base + "/rebalancing")
        assert status == 200 and 'id="balance-brokers"' in body and 'id="moves"' in body
