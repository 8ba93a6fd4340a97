"""`bullpen bench --scenario ui`: the dashboard on a large workspace.

A fresh server (SQLite, or a scratch PostgreSQL database) is seeded before it starts by
`bullpen seed-demo` (default 100,000 tasks, 1,000,000 run events, 200 agents, written straight
into the tables), with no worker and no simulator (nothing runs: the pages alone are
measured) and no rate limit in the way. Signed in as the first admin, for each page of
`uipages.PAGES`:

- **server time**: `--requests` GETs one after another on one keep-alive connection over
  loopback (after 5 unmeasured), timed from the request's start to its body's last byte;
  p50, p95, max. **CPU**: the server process's user + system CPU over them, per request;
- **first paint**: in Debian's Chromium (Playwright), `first-contentful-paint` from the Paint
  Timing API, p50 and p95 of `--loads` navigations to the page in one tab, each from another
  dashboard page (`/account`), as a user moves through the dashboard (scripts and stylesheet
  in the browser's cache, revalidated); and of `--loads` cold loads, each in a new browser
  context (a new tab, an empty cache, the session cookie set);
- **JavaScript + CSS**: the uncompressed bytes of the same-origin scripts and stylesheets
  the page loaded.

The issue's targets (server p95 ≤ 50 ms, the task list's first paint p95 ≤ 300 ms, JS + CSS
≤ 150 KB a page) are reported beside each figure.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bullpen.bench.createload import process_cpu_s
from bullpen.bench.report import percentile
from bullpen.bench.spawn import UNLIMITED, Backend, SpawnError, spawn_server
from bullpen.bench.uipages import PAGES, UiPage

CHROMIUM = Path("/usr/bin/chromium")  # Debian's, as the browser tests use
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
SERVER_P95_MS = 50.0
FIRST_PAINT_P95_MS = 300.0
ASSETS_MAX_BYTES = 150_000
WARMUP_REQUESTS = 5
SEED_TIMEOUT_S = 3_600.0
FIRST_PAINT_JS = """() => new Promise((resolve) => {
  const seen = performance.getEntriesByName("first-contentful-paint");
  if (seen.length) { resolve(seen[0].startTime); return; }
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      if (e.name === "first-contentful-paint") resolve(e.startTime);
    }
  }).observe({type: "paint", buffered: true});
  setTimeout(() => resolve(null), 5000);
})"""
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass(slots=True)
class PageFigures:
    """What was measured of one page."""

    name: str
    path: str
    server_ms: list[float] = field(default_factory=list)
    cpu_ms_per_request: float | None = None
    html_bytes: int = 0
    first_paint_ms: list[float] = field(default_factory=list)  # navigated to, in one tab
    cold_paint_ms: list[float] = field(default_factory=list)  # a new tab, an empty cache
    assets_bytes: int | None = None
    assets: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The figures, rounded, with the targets they are held to."""
        server, paint = sorted(self.server_ms), sorted(self.first_paint_ms)
        cold = sorted(self.cold_paint_ms)

        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        p95 = percentile(server, 95)
        paint_p95 = percentile(paint, 95)
        return {
            "page": self.name,
            "path": self.path,
            "requests": len(server),
            "server_p50_ms": r(percentile(server, 50)),
            "server_p95_ms": r(p95),
            "server_max_ms": r(server[-1] if server else None),
            "cpu_ms_per_request": r(self.cpu_ms_per_request),
            "html_bytes": self.html_bytes,
            "loads": len(paint),
            "first_paint_p50_ms": r(percentile(paint, 50)),
            "first_paint_p95_ms": r(paint_p95),
            "cold_paint_p50_ms": r(percentile(cold, 50)),
            "cold_paint_p95_ms": r(percentile(cold, 95)),
            "assets_bytes": self.assets_bytes,
            "assets": self.assets,
            "server_ok": p95 is not None and p95 <= SERVER_P95_MS,
            "first_paint_ok": paint_p95 is not None and paint_p95 <= FIRST_PAINT_P95_MS,
            "assets_ok": self.assets_bytes is not None and self.assets_bytes <= ASSETS_MAX_BYTES,
        }


async def sign_in(http: aiohttp.ClientSession, base_url: str, email: str, password: str) -> None:
    """Sign in through the login form, as a browser does; the session cookie stays in `http`."""
    async with http.get(f"{base_url}/login") as resp:
        page = await resp.text()
    found = _CSRF.search(page)
    if found is None:
        raise SpawnError("the sign-in page has no CSRF token")
    form = {"email": email, "password": password, "csrf": found.group(1)}
    headers = {"Sec-Fetch-Site": "same-origin", "Origin": base_url}
    async with http.post(
        f"{base_url}/login", data=form, headers=headers, allow_redirects=False
    ) as resp:
        if resp.status != 303 or resp.headers.get("Location") != "/":
            raise SpawnError(f"sign-in refused: HTTP {resp.status} {(await resp.text())[:300]}")


async def server_times(
    http: aiohttp.ClientSession,
    base_url: str,
    page: UiPage,
    seeded: Mapping[str, Any],
    *,
    requests: int,
    pid: int | None,
) -> PageFigures:
    """`requests` GETs of the page one after another; the server's CPU over them."""
    path = page.url_path(seeded)
    figures = PageFigures(page.name, path)
    url = base_url + path

    async def get() -> float:
        began = time.perf_counter()
        async with http.get(url, allow_redirects=False) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise SpawnError(f"{page.name} ({path}): HTTP {resp.status} {body[:300]!r}")
        figures.html_bytes = len(body)
        return (time.perf_counter() - began) * 1000

    for _ in range(WARMUP_REQUESTS):
        await get()
    cpu_before = await process_cpu_s(pid)
    for _ in range(requests):
        figures.server_ms.append(await get())
    cpu_after = await process_cpu_s(pid)
    if cpu_before is not None and cpu_after is not None and requests:
        figures.cpu_ms_per_request = (cpu_after - cpu_before) * 1000 / requests
    return figures


async def browser_figures(
    base_url: str,
    cookies: list[dict[str, Any]],
    pages: list[tuple[UiPage, PageFigures]],
    *,
    loads: int,
    chromium: Path = CHROMIUM,
) -> None:
    """First paint of each page over `loads` cold loads, and its same-origin JS and CSS."""
    try:
        from playwright.async_api import async_playwright
    except ImportError as err:  # a dev dependency: `uv sync` installs it
        raise SpawnError(
            "the ui scenario drives Chromium with Playwright: install the dev dependencies "
            "(./scripts/deps.sh --browser)"
        ) from err
    if not await asyncio.to_thread(chromium.exists):
        raise SpawnError(f"no Chromium at {chromium} (./scripts/deps.sh --browser installs it)")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            for page, figures in pages:
                for load in range(loads):
                    paint, assets = await _load(
                        browser, base_url, cookies, page, figures.path, load == 0
                    )
                    figures.cold_paint_ms.append(paint)
                    if assets is not None:
                        figures.assets = dict(sorted(assets.items()))
                        figures.assets_bytes = sum(assets.values())
                figures.first_paint_ms = await _navigations(
                    browser, base_url, cookies, page, figures.path, loads
                )
        finally:
            await browser.close()


async def _navigations(
    browser: Any,
    base_url: str,
    cookies: list[dict[str, Any]],
    page: UiPage,
    path: str,
    loads: int,
) -> list[float]:
    """First paint of `loads` navigations to the page in one tab, each from another page of
    the dashboard (`/account`), as a user moves through it: the browser's cache holds the
    page's scripts and stylesheet (revalidated), its renderer is running."""
    context = await browser.new_context()
    try:
        await context.add_cookies(cookies)
        tab = await context.new_page()
        await tab.goto(base_url + path, wait_until="load")  # fills the cache, unmeasured
        paints = []
        for _ in range(loads):
            await tab.goto(base_url + "/account", wait_until="load")
            paints.append(await _paint(tab, page, await tab.goto(base_url + path)))
        return paints
    finally:
        await context.close()


async def _paint(tab: Any, page: UiPage, answer: Any) -> float:
    """The first-contentful-paint of the page `tab` just loaded (`answer`: its response)."""
    if answer is None or answer.status != 200 or tab.url.endswith("/login"):
        raise SpawnError(f"{page.name}: the browser did not get the page")
    paint = await tab.evaluate(FIRST_PAINT_JS)
    if paint is None:
        raise SpawnError(f"{page.name}: no first-contentful-paint entry")
    return float(paint)


async def _load(
    browser: Any,
    base_url: str,
    cookies: list[dict[str, Any]],
    page: UiPage,
    path: str,
    with_assets: bool,
) -> tuple[float, dict[str, int] | None]:
    """One load in a fresh context: its first paint, and (`with_assets`) the bytes of each
    same-origin script and stylesheet it loaded."""
    origin = urlsplit(base_url).netloc
    context = await browser.new_context()
    try:
        await context.add_cookies(cookies)
        tab = await context.new_page()
        assets: dict[str, int] = {}
        pending: list[asyncio.Future[None]] = []

        async def keep(response: Any) -> None:
            assets[urlsplit(response.url).path] = len(await response.body())

        def seen(response: Any) -> None:
            kind = response.request.resource_type
            if kind in ("script", "stylesheet") and urlsplit(response.url).netloc == origin:
                pending.append(asyncio.ensure_future(keep(response)))

        if with_assets:
            tab.on("response", seen)
        paint = await _paint(tab, page, await tab.goto(base_url + path, wait_until="load"))
        await asyncio.gather(*pending)
        return paint, assets if with_assets else None
    finally:
        await context.close()


async def measure(
    base_url: str,
    *,
    email: str,
    password: str,
    seeded: Mapping[str, Any],
    requests: int,
    loads: int,
    pid: int | None,
    pages: tuple[UiPage, ...] = PAGES,
    on_step: Callable[[str], None] = lambda _: None,
) -> list[PageFigures]:
    """Every page's server time and CPU, then (with `loads`) its first paint and assets."""
    jar = aiohttp.CookieJar(unsafe=True)  # keep cookies of 127.0.0.1
    connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection, as one tab
    async with aiohttp.ClientSession(cookie_jar=jar, connector=connector) as http:
        await sign_in(http, base_url, email, password)
        measured = []
        for page in pages:
            on_step(f"server time: {page.name} ({requests} requests)")
            measured.append(
                await server_times(http, base_url, page, seeded, requests=requests, pid=pid)
            )
        host = urlsplit(base_url).hostname or "127.0.0.1"
        cookies = [
            {"name": c.key, "value": c.value, "domain": host, "path": c["path"] or "/"}
            for c in jar
            if c.key.endswith("bullpen_session")
        ]
    if loads:
        on_step(f"first paint and assets in Chromium ({loads} loads a page)")
        await browser_figures(
            base_url, cookies, list(zip(pages, measured, strict=True)), loads=loads
        )
    return measured


async def run_ui_bench(
    backend: Backend,
    *,
    pg_admin_url: str,
    tasks: int,
    events: int,
    agents: int,
    requests: int,
    loads: int,
    on_step: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Seed a fresh server, measure every page; the report as JSON."""
    seed = ("seed-demo", "--tasks", str(tasks), "--events", str(events), "--agents", str(agents))
    on_step(f"{backend}: seeding {tasks} tasks, {events} run events, {agents} agents")
    env = {**UNLIMITED, "BULLPEN_WORKER_ENABLED": "false"}
    async with spawn_server(
        backend,
        pg_admin_url=pg_admin_url,
        sim="none",
        env=env,
        prepare=[(*seed, "--json")],
        prepare_timeout_s=SEED_TIMEOUT_S,
    ) as server:
        seeded = server.prepared[0]
        on_step(f"seeded in {seeded['seconds']} s: {seeded['counts']}")
        measured = await measure(
            server.base_url,
            email=server.admin_email,
            password=server.admin_password,
            seeded=seeded,
            requests=requests,
            loads=loads,
            pid=server.pid,
            on_step=on_step,
        )
    return {
        "backend": backend,
        "seed": {"tasks": tasks, "events": events, "agents": agents, **seeded},
        "targets": {
            "server_p95_ms": SERVER_P95_MS,
            "first_paint_p95_ms": FIRST_PAINT_P95_MS,
            "assets_bytes": ASSETS_MAX_BYTES,
        },
        "pages": [figures.summary() for figures in measured],
    }


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as text, one line a page."""
    seed = report["seed"]
    lines = [
        f"{report['backend']}: {seed['tasks']} tasks, {seed['events']} run events, "
        f"{seed['agents']} agents (seeded in {seed['seconds']} s); targets: server p95 <= "
        f"{SERVER_P95_MS:g} ms, first paint p95 <= {FIRST_PAINT_P95_MS:g} ms, JS+CSS <= "
        f"{ASSETS_MAX_BYTES // 1000} KB",
    ]
    for p in report["pages"]:

        def mark(ok: bool) -> str:
            return "" if ok else " (over)"

        paint = (
            f"first paint p50 {p['first_paint_p50_ms']} ms, p95 {p['first_paint_p95_ms']} ms"
            f"{mark(p['first_paint_ok'])} (new tab, empty cache: {p['cold_paint_p50_ms']} / "
            f"{p['cold_paint_p95_ms']} ms)"
            if p["loads"]
            else "first paint not measured"
        )
        assets = (
            f"JS+CSS {p['assets_bytes'] / 1000:.1f} KB{mark(p['assets_ok'])}"
            if p["assets_bytes"] is not None
            else ""
        )
        lines.append(
            f"  {p['page']:<20} {p['path']:<28} server p50 {p['server_p50_ms']} ms, p95 "
            f"{p['server_p95_ms']} ms{mark(p['server_ok'])}, CPU {p['cpu_ms_per_request']} ms; "
            f"{paint}; {assets}"
        )
    return lines
