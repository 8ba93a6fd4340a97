"""`bullpen bench --scenario ui` at a tiny scale, on both backends: it seeds the workspace,
signs in, and measures every page of the registry (server time, CPU, first paint in
Chromium, JavaScript and CSS)."""

from __future__ import annotations

import pytest

from bullpen.bench.uipages import PAGES
from tests.support.processes import bench_report

pytestmark = [pytest.mark.browser]


@pytest.mark.timeout(400)
# What the browser measures does not depend on the backend (the same pages, the same assets):
# two loads a page on SQLite (two samples for each percentile), one on PostgreSQL, where every
# page is still loaded cold and navigated to in Chromium. Two there took 61 s, one 42 s (alone;
# the longest part is Chromium's: every page in three browser contexts at two loads, two at one).
@pytest.mark.parametrize(("store_backend", "loads"), [("sqlite", 2), ("postgres", 1)])
def test_the_ui_scenario_measures_every_page_of_a_seeded_workspace(
    store_backend: str, loads: int
) -> None:
    sizes = ["--tasks", "120", "--events", "900", "--agents", "12"]
    args = ["--scenario", "ui", "--backend", store_backend, *sizes, "--requests", "4"]
    report = bench_report([*args, "--loads", str(loads), "--json"], timeout=390)
    seed = report["seed"]
    assert seed["counts"]["tasks"] == 120 and seed["counts"]["agents"] == 12, seed
    # Every task but those awaiting approval has a run, and the events are spread over them.
    assert 114 <= seed["counts"]["runs"] <= 120 and seed["counts"]["events"] == 900, seed
    pages = {p["page"]: p for p in report["pages"]}
    assert list(pages) == [page.name for page in PAGES]
    for page in pages.values():
        assert page["requests"] == 4 and page["loads"] == loads, page
        assert 0 < page["server_p50_ms"] <= page["server_p95_ms"] <= page["server_max_ms"], page
        assert page["cpu_ms_per_request"] is not None and page["cpu_ms_per_request"] >= 0, page
        assert 0 < page["first_paint_p50_ms"] <= page["first_paint_p95_ms"], page
        assert 0 < page["cold_paint_p50_ms"] <= page["cold_paint_p95_ms"], page
        assert page["html_bytes"] > 1000, page
        # Signed in: every page loads the stylesheet and htmx, and counts their real sizes.
        assets = page["assets"]
        assert {"/static/style.css", "/static/vendor/htmx/htmx.min.js"} <= set(assets), page
        assert page["assets_bytes"] == sum(assets.values()) > 50_000, page
    assert pages["task"]["path"] == f"/tasks/{seed['task_id']}"
    assert pages["tasks-search-rare"]["path"] == "/?q=vandelay"
    # The list shows 50 tasks a page, a search for a word in none of them shows none.
    assert pages["tasks"]["html_bytes"] > pages["tasks-search-none"]["html_bytes"]


def test_a_scenario_option_is_refused_elsewhere() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bullpen", "bench", "--scenario", "create", "--loads", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "--loads applies to --scenario ui only" in done.stderr
