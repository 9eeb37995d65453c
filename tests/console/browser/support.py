"""What every browser test checks on each page it visits, and where it leaves its screenshots."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from playwright.async_api import Locator, Page, ViewportSize

from tests.console.console_support import ARTIFACTS

DESKTOP = ViewportSize(width=1280, height=800)
NARROW = ViewportSize(width=420, height=800)

# Which labelable fields have no label, the page's language and its <h1> count, in the page itself.
_A11Y = """() => {
  const fields = [...document.querySelectorAll('input:not([type=hidden]), select, textarea')];
  const unlabelled = fields.filter(f => f.labels.length === 0 && !f.getAttribute('aria-label'))
                           .map(f => f.outerHTML);
  return {lang: document.documentElement.lang, h1: document.querySelectorAll('h1').length, unlabelled};
}"""


async def checked(page: Page, shot: str) -> None:
    """The page has `lang`, exactly one <h1> and a label for each field; a full-page screenshot."""
    got: dict[str, Any] = await page.evaluate(_A11Y)
    assert got["lang"] == "en", f"{page.url}: no lang"
    assert got["h1"] == 1, f"{page.url}: {got['h1']} <h1> elements"
    assert got["unlabelled"] == [], f"{page.url}: fields without a label: {got['unlabelled']}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"{shot}.png", full_page=True)


async def no_horizontal_scroll(page: Page) -> None:
    widths: list[int] = await page.evaluate(
        "() => [document.scrollingElement.scrollWidth, window.innerWidth]"
    )
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths[0]} > {widths[1]} px"


async def reload_until(page: Page, locator: Locator, text: str, within: float = 20.0) -> None:
    """Reload a page that does not refresh itself until `locator` is one element showing `text` (the
    broker applies acks and resets asynchronously); fail after `within` seconds."""
    deadline = time.monotonic() + within
    while (shown := [t.strip() for t in await locator.all_inner_texts()]) != [text]:
        if time.monotonic() > deadline:
            raise AssertionError(f"{page.url} showed {shown} for {locator}, not {text!r}, for {within} s")
        await asyncio.sleep(0.1)
        await page.reload()


async def cell(page: Page, selector: str) -> str:
    return (await page.locator(selector).inner_text()).strip()
