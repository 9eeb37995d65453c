"""What every browser test checks on each page it visits, and where it leaves its screenshots."""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

from playwright.async_api import Locator, Page, ViewportSize

from tests.console.console_support import ARTIFACTS

AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe.min.js"  # axe-core 4.14.1 (vendor/README.md)
AXE_RULES = ["color-contrast", "label"]
_AXE_RUN = """async (rules) => {
  const only = {runOnly: {type: 'rule', values: rules}, resultTypes: ['violations']};
  const found = await axe.run(document, only);
  return found.violations.map(v => `${v.id}: ${v.help}\\n` +
    v.nodes.map(n => `  ${n.target.join(' ')}: ${n.failureSummary.replace(/\\s+/g, ' ')}`).join('\\n'));
}"""

DESKTOP = ViewportSize(width=1280, height=800)
NARROW = ViewportSize(width=420, height=800)

# Which labelable fields have no label, the page's language and its <h1> count, in the page itself.
_A11Y = """() => {
  const fields = [...document.querySelectorAll('input:not([type=hidden]), select, textarea')];
  const unlabelled = fields.filter(f => f.labels.length === 0 && !f.getAttribute('aria-label'))
                           .map(f => f.outerHTML);
  return {lang: document.documentElement.lang, h1: document.querySelectorAll('h1').length, unlabelled};
}"""


@functools.cache
def _axe_source() -> str:
    return AXE.read_text()


async def axe_violations(page: Page) -> list[str]:
    """axe-core's color-contrast and label rules on the page as it is now, one text per failed rule."""
    if not await page.evaluate("() => typeof axe !== 'undefined'"):
        await page.add_script_tag(content=_axe_source())
    found: list[str] = await page.evaluate(_AXE_RUN, AXE_RULES)
    return found


async def checked(page: Page, shot: str) -> None:
    """The page has `lang`, exactly one <h1> and a label for each field, and passes axe-core's contrast
    and label rules; a full-page screenshot."""
    got: dict[str, Any] = await page.evaluate(_A11Y)
    assert got["lang"] == "en", f"{page.url}: no lang"
    assert got["h1"] == 1, f"{page.url}: {got['h1']} <h1> elements"
    assert got["unlabelled"] == [], f"{page.url}: fields without a label: {got['unlabelled']}"
    violations = await axe_violations(page)
    assert not violations, f"{page.url}: " + "\n".join(violations)
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
