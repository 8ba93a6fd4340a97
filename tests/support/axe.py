"""axe-core in the browser tests: the vendored copy (tests/e2e/vendor/axe-core, never served)
run on a page, and its serious or critical violations."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from playwright.async_api import Page

AXE = Path(__file__).resolve().parents[1] / "e2e" / "vendor" / "axe-core" / "axe.min.js"
GRAVE = ("serious", "critical")

_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ")),
  }));
}"""


@cache
def _source() -> str:
    return AXE.read_text(encoding="utf-8")


async def grave_violations(page: Page) -> list[dict[str, Any]]:
    """The page's serious and critical accessibility violations (axe-core's rules).

    The script is evaluated through the DevTools protocol, which the page's CSP does not
    govern, so the page under test keeps its strict policy."""
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.evaluate(_source())
    found: list[dict[str, Any]] = await page.evaluate(_RUN)
    return [v for v in found if v["impact"] in GRAVE]
