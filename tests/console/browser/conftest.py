"""One headless Chromium for the browser tests: Debian's `chromium` (`make chromium`), driven by Playwright's
async API (its sync API leaves an event loop running, which breaks the asyncio tests a worker runs next).
Playwright's own browser download is never used."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from tests.console.browser.support import DESKTOP

HERE = Path(__file__).parent


# tryfirst: before xdist's hook reads the marks (tests/spark/conftest.py says why).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One xdist worker runs them all: one browser for the session, and the broker processes of the modules
    # do not start beside each other on the 2-core gate.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("console-browser"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed: run `make chromium` (make test installs it)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        await launched.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A fresh context (no cookies, no cache) at 1280x800 for each test."""
    context = await browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(20_000)
    opened = await context.new_page()
    yield opened
    await context.close()
