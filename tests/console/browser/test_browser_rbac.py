"""The console in a browser with a token whose role lacks ManageTopic (Ister's RBAC has no read-only
topic permission: ManageTopic reads topic stats and resets cursors): it sees the brokers, no topic page
and no reset link, and a reset it posts anyway comes back as the broker's refusal on a 403 page."""

from __future__ import annotations

import os

import pytest
from playwright.async_api import Page, expect

from tests.console.browser.support import checked
from tests.console.console_support import console
from tests.console.test_console_rbac import secured as secured  # the TLS+JWT broker and its roles
from tests.integration.harness import BrokerProcess
from tests.integration.security_support import Pki, token

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_token_without_topic_rights_sees_no_reset_and_its_post_gets_a_403_page(
    secured: tuple[BrokerProcess, Pki], page: Page
) -> None:
    broker, pki = secured
    env = {k: v for k, v in os.environ.items() if k not in ("ISTER_TOKEN", "ISTER_API_KEY")}
    with console(broker.admin_addr, "--token", token("ops"), "--tls-ca", str(pki.ca_file), env=env) as base:
        await page.goto(base + "/")
        await expect(page.locator("#total-brokers")).to_have_text("1")
        await expect(page.locator("#denied")).to_contain_text("may not list topics")
        await checked(page, "rbac-overview")
        answer = await page.goto(base + "/topic/default/guarded")
        assert answer is not None and answer.status == 403
        await expect(page.get_by_role("alert")).to_contain_text("PERMISSION_DENIED")
        await expect(page.locator("a.reset")).to_have_count(0)
        await checked(page, "rbac-topic")
        # The form itself needs no right; what it posts is the broker's to refuse.
        await page.goto(base + "/reset/default/guarded?subscription=s")
        await page.get_by_label("Position: earliest, latest or an offset").fill("earliest")
        async with page.expect_response(lambda r: r.request.method == "POST") as posted:
            await page.locator("#preview").click()
        assert (await posted.value).status == 403
        await expect(page.locator("#reset-error")).to_contain_text("PERMISSION_DENIED")
        await checked(page, "rbac-reset-refused")
