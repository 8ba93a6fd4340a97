"""The costs page in a real Chromium on both backends: runs on a priced simulator seed the
ledger (one agent's moved three days back), and the page's charts are drawn (uPlot canvases,
redrawn in the dark scheme) beside tables equal to `GET /api/v1/costs`; the budget bars show
`GET /api/v1/budgets`' figures; the latency table holds each hour's p50 and p95 of the runs'
time to first token; a bad range is the page's 422; without JavaScript the tables remain."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa
from playwright.async_api import Browser, Page, expect

from bullpen.store import rollups
from bullpen.store.tables import cost_events, runs
from tests.support.browser import PageErrors
from tests.support.dashboard_checks import clean, sign_in, without_javascript
from tests.support.db import rows
from tests.support.spend import make_budget, priced_provider
from tests.support.team import create_task, make_agent, until_ended

pytestmark = [pytest.mark.browser]

BACK = timedelta(days=3)  # how far one agent's spend is moved into the past

# A table's rows as [data-day, data-key, cell texts...].
_ROWS = """(selector) => Array.from(document.querySelectorAll(selector + " tbody tr[data-key]"))
  .map((tr) => [tr.dataset.day || "", tr.dataset.key].concat(
    Array.from(tr.cells).map((td) => td.textContent.trim())))"""


def money(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


def count(text: str) -> int:
    return int(text.replace(",", ""))


async def api(http: aiohttp.ClientSession, server: Any, path: str, **query: str) -> Any:
    async with http.get(f"{server.base_url}{path}", params=query, headers=server.auth) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def costs(
    http: aiohttp.ClientSession, server: Any, first: str, last: str, **query: str
) -> list[dict[str, Any]]:
    """The API's rows for the page's UTC days `first` to `last`, both included."""
    until = date.fromisoformat(last) + timedelta(days=1)
    report = await api(
        http,
        server,
        "/api/v1/costs",
        since=f"{first}T00:00:00Z",
        until=f"{until.isoformat()}T00:00:00Z",
        **query,
    )
    return list(report["rows"])


async def check_tables(page: Page, http: aiohttp.ClientSession, server: Any, group: str) -> None:
    """Each table of the page holds exactly the API's rows for its range and grouping."""
    first = await page.locator('input[type="date"][name="since"]').input_value()
    last = await page.locator('input[type="date"][name="until"]').input_value()
    series = await costs(http, server, first, last, group_by=group, interval="day")
    totals = await costs(http, server, first, last, group_by=group)
    assert series and totals

    per_day = await page.evaluate(_ROWS, "#days-table")
    assert [[r[0], r[1], *map(count, r[4:8])] for r in per_day] == [
        [
            r["day"],
            r["key"] or "",
            r["calls"],
            r["input_tokens"],
            r["cached_input_tokens"],
            r["output_tokens"],
        ]
        for r in series
    ]
    for shown, want in zip(per_day, series, strict=True):
        assert money(shown[8]) == pytest.approx(want["cost_usd"], abs=1e-6)
    table = await page.evaluate(_ROWS, "#totals")
    by_key = {r["key"] or "": r for r in totals}
    assert sorted(r[1] for r in table) == sorted(by_key)
    for shown in table:
        want = by_key[shown[1]]
        assert [count(c) for c in shown[3:7]] == [
            want["calls"],
            want["input_tokens"],
            want["cached_input_tokens"],
            want["output_tokens"],
        ]
        assert money(shown[7]) == pytest.approx(want["cost_usd"], abs=1e-6)


async def charts_drawn(page: Page, scheme: str) -> None:
    for kind in ("spend", "tokens", "latency"):
        chart = page.locator(f"#chart-{kind}")
        await expect(chart).to_have_attribute("data-scheme", scheme)
        await expect(chart.locator("canvas")).to_have_count(1)


async def move_back(server: Any, table: sa.Table, column: Any, agent_id: str) -> None:
    """Move an agent's rows of `table` BACK in time (each row: dates are bound as values)."""
    async with server.services.store.write() as conn:
        found = await conn.execute(
            sa.select(table.c.id, column).where(table.c.agent_id == UUID(agent_id))
        )
        for row_id, when in list(found):
            await conn.execute(
                table.update().where(table.c.id == row_id).values({column.name: when - BACK})
            )


def inclusive(values: list[float], p: float) -> float:
    """`percentile_cont`'s linear interpolation, in Python (the exact percentile)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(p * 100) - 1]


async def check_hours(page: Page, hours: dict[str, list[float]], day: date) -> None:
    """The latency table holds the hours of `day` that had runs: their count and each
    percentile of the runs' own first-token times."""
    await expect(page.locator("#latency-table caption")).to_contain_text(day.isoformat())
    of_day = {hour: values for hour, values in hours.items() if hour.startswith(day.isoformat())}
    assert of_day
    await expect(page.locator("#latency-table tbody tr")).to_have_count(len(of_day))
    for hour, values in of_day.items():
        cells = page.locator(f'#latency-table tr[data-hour="{hour}"] td')
        await expect(cells.nth(1)).to_have_text(str(len(values)))
        for i, p in ((2, 0.5), (3, 0.95)):
            text = (await cells.nth(i).inner_text()).removesuffix(" ms")
            # Read from the hourly histogram: within 5 % (docs/spend.md).
            assert float(text) == pytest.approx(inclusive(values, p), rel=0.05, abs=0.051)


async def test_costs_page_charts_tables_budgets_and_latency(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    async with aiohttp.ClientSession() as http:
        await priced_provider(http, server)
        alpha = await make_agent(http, server, "alpha", provider="priced")
        beta = await make_agent(http, server, "beta", provider="priced")
        whole = await make_budget(http, server, scope="workspace", amount_usd=5.0, warn_percent=50)
        capped = await make_budget(
            http,
            server,
            scope="agent",
            agent_id=alpha["id"],
            amount_usd=2.0,
            warn_percent=80,
            period="lifetime",
            hard_stop=False,
        )
        tasks = [
            await create_task(http, server, agent, f"Summarise the figures, part {i}.")
            for i, agent in enumerate((alpha, alpha, beta))
        ]
        for task in tasks:
            assert (await until_ended(http, server, task["id"]))["status"] == "done"
        # Beta's spend and runs three days back: the series has two days.
        await move_back(server, cost_events, cost_events.c.created_at, beta["id"])
        await move_back(server, runs, runs.c.started_at, beta["id"])
        async with server.services.store.write() as conn:  # rows changed behind its back
            await rollups.rebuild(conn, server.boot.workspace_id)

        await sign_in(page, server)
        await page.get_by_role("link", name="Costs").click()
        await expect(page).to_have_url(f"{server.base_url}/costs")
        today = datetime.now(UTC).date()
        # The default range: the last 30 UTC days, today included.
        await expect(page.locator('input[type="date"][name="until"]')).to_have_value(
            today.isoformat()
        )
        await expect(page.locator('input[type="date"][name="since"]')).to_have_value(
            (today - timedelta(days=29)).isoformat()
        )
        await charts_drawn(page, "light")
        # The page's JavaScript and CSS stay within 150 KB uncompressed (docs/web-ui.md).
        sizes = await page.evaluate(
            "performance.getEntriesByType('resource')"
            ".filter((r) => /[.](js|css)$/.test(new URL(r.name).pathname))"
            ".map((r) => [new URL(r.name).pathname, r.decodedBodySize])"
        )
        assert {path for path, _ in sizes} >= {
            "/static/vendor/uplot/uPlot.iife.min.js",
            "/static/vendor/uplot/uPlot.min.css",
            "/static/costs.js",
        }
        assert 0 < sum(size for _, size in sizes) <= 150_000, sizes
        await check_tables(page, http, server, "agent")
        spend = await page.evaluate(_ROWS, "#days-table")
        assert {r[3] for r in spend} == {"alpha", "beta"}  # agents by name
        days = {r[0] for r in spend}
        assert days >= {today.isoformat(), (today - BACK).isoformat()}
        # The chart holds a line per agent, in the legend uPlot draws.
        legend = page.locator("#chart-spend .u-legend .u-series")
        await expect(legend).to_have_count(3)  # the x values' row, then alpha and beta

        # Budgets: the API's figures, the bar's widths, the warning line, the period's end.
        listed = {b["id"]: b for b in (await api(http, server, "/api/v1/budgets"))["items"]}
        assert listed[whole["id"]]["spent_usd"] > 0
        for budget_id, b in listed.items():
            row = page.locator(f'tr[data-budget-id="{budget_id}"]')
            assert money(await row.locator("td.spent").inner_text()) == pytest.approx(
                b["spent_usd"], abs=1e-6
            )
            assert money(await row.locator("td.reserved").inner_text()) == pytest.approx(
                b["reserved_usd"], abs=1e-6
            )
            assert money(await row.locator("td.amount").inner_text()) == b["amount_usd"]
            await expect(row.locator("td.warn")).to_have_text(f"{b['warn_percent']}%")
            width = float(await row.locator("rect.spent").get_attribute("width") or "nan")
            assert width == pytest.approx(100 * b["spent_usd"] / b["amount_usd"], abs=1e-3)
            line = row.locator("line.warn")
            await expect(line).to_have_attribute("x1", str(b["warn_percent"]))
            ends = row.locator("td.ends")
            if b["period_end"] is None:
                await expect(ends).to_have_text("never (lifetime)")
            else:
                end = datetime.fromisoformat(b["period_end"]).astimezone(UTC)
                await expect(ends).to_have_text(end.strftime("%Y-%m-%d %H:%M UTC"))
        await expect(
            page.locator(f'tr[data-budget-id="{capped["id"]}"] th a', has_text="alpha")
        ).to_be_visible()

        # Latency: each hour's runs and percentiles, as the runs' own first-token times say.
        timed = await rows(
            server,
            sa.select(runs.c.started_at, runs.c.ttft_ms).where(runs.c.ttft_ms.is_not(None)),
        )
        hours: dict[str, list[float]] = defaultdict(list)
        for run in timed:
            hours[run.started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:00")].append(run.ttft_ms)
        assert len(hours) >= 2  # alpha's hour and beta's, three days back
        # The table lists the hours of one day, by default the range's last; the chart draws
        # them all. Each day is a link or the form's choice away.
        await check_hours(page, hours, today)
        for back in range(1, BACK.days + 1):
            await page.get_by_role("link", name="Day before").click()
            caption = page.locator("#latency-table caption")
            await expect(caption).to_contain_text((today - timedelta(days=back)).isoformat())
        await check_hours(page, hours, today - BACK)
        await expect(page.get_by_role("link", name="Day after")).to_be_visible()
        await page.locator('input[name="day"]').fill(today.isoformat())
        await page.get_by_role("button", name="Show hours").click()
        await check_hours(page, hours, today)
        await expect(page.locator("#days-table tbody tr")).to_have_count(len(days))
        await clean(page, page_errors, 403, 422)

        # Dark scheme: the charts are drawn again in its colours.
        await page.emulate_media(color_scheme="dark")
        await charts_drawn(page, "dark")

        # Another grouping and a range that leaves out beta's day.
        await page.get_by_label("Group by").select_option("model")
        await page.locator('input[type="date"][name="since"]').fill(
            (today - timedelta(days=1)).isoformat()
        )
        await page.get_by_role("button", name="Show", exact=True).click()
        await expect(page).to_have_url(re.compile(r"group=model"))
        await check_tables(page, http, server, "model")
        spend = await page.evaluate(_ROWS, "#days-table")
        assert spend and {r[3] for r in spend} == {"sim-1"}
        assert (today - BACK).isoformat() not in {r[0] for r in spend}
        await check_hours(page, hours, today)
        await clean(page, page_errors, 403, 422)

        # A bad range is the page's 422, with the form kept.
        answer = await page.goto("/costs?since=2026-12-10&until=2026-12-01")
        assert answer is not None and answer.status == 422
        await expect(page.get_by_role("alert")).to_have_text("since: must not be after until")
        answer = await page.goto("/costs?group=colour")
        assert answer is not None and answer.status == 422
        await expect(page.get_by_role("alert")).to_contain_text("group: one of agent")
        answer = await page.goto("/costs?since=2020-01-01&until=2026-01-01")
        assert answer is not None and answer.status == 422
        await expect(page.get_by_role("alert")).to_contain_text("at most 366 days")
        outside = (today + timedelta(days=1)).isoformat()
        answer = await page.goto(f"/costs?day={outside}")
        assert answer is not None and answer.status == 422
        await expect(page.get_by_role("alert")).to_contain_text("day: a day from")
        answer = await page.goto("/costs?day=someday")
        assert answer is not None and answer.status == 422
        await expect(page.get_by_role("alert")).to_contain_text("day: not a date")

    # Without JavaScript: the same tables, no chart drawn.
    ctx = await without_javascript(browser, server)
    try:
        tab = await ctx.new_page()
        await sign_in(tab, server)
        await tab.goto("/costs?group=provider")
        await expect(tab.locator("#totals tbody tr")).to_have_count(1)
        await expect(tab.locator("#totals tbody th")).to_have_text("priced")
        await expect(tab.locator("#days-table tbody tr")).to_have_count(len(days))
        await expect(tab.locator("#budgets tbody tr")).to_have_count(2)
        await expect(tab.locator(".chart canvas")).to_have_count(0)
    finally:
        await ctx.close()
