"""/api/v1/budgets and /api/v1/costs over a real socket, on both backends: validation, figures,
audit, and the ledger aggregated by the database (issue 22)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import sqlalchemy as sa

from bullpen.store import gateway as gateway_store
from bullpen.store.tables import audit_events, budgets
from tests.support.db import count, rows
from tests.support.http import call, problem
from tests.support.seed import finished_run, workspace_with_agent
from tests.support.servers import RunningServer


async def test_a_budget_is_created_listed_changed_and_deleted_with_audit(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = str(server.boot.agent_id)
    body = {
        "scope": "agent",
        "agent_id": agent,
        "amount_usd": 20,
        "timezone": "America/New_York",
        "warn_percent": 75,
    }
    made = await call(http, server, "POST", "/api/v1/budgets", body=body)
    assert made.status == 201, made.text
    budget: dict[str, Any] = made.body
    assert made.headers["Location"] == f"/api/v1/budgets/{budget['id']}"
    assert budget["period"] == "month" and budget["hard_stop"] is True
    assert (budget["spent_usd"], budget["reserved_usd"], budget["remaining_usd"]) == (0, 0, 20)
    start = datetime.fromisoformat(budget["period_start"])
    end = datetime.fromisoformat(budget["period_end"])
    assert start.astimezone(UTC).hour in (4, 5)  # midnight in New York
    assert timedelta(days=28) <= end - start <= timedelta(days=31)

    listed = await call(http, server, "GET", "/api/v1/budgets")
    assert [b["id"] for b in listed.body["items"]] == [budget["id"]]
    changed = await call(
        http, server, "PATCH", f"/api/v1/budgets/{budget['id']}", body={"amount_usd": 5.5}
    )
    assert changed.status == 200 and changed.body["amount_usd"] == 5.5
    gone = await call(http, server, "DELETE", f"/api/v1/budgets/{budget['id']}")
    assert gone.status == 204
    problem(await call(http, server, "GET", f"/api/v1/budgets/{budget['id']}"), 404)
    actions = [
        r.action
        for r in await rows(
            server, sa.select(audit_events.c.action).where(audit_events.c.target_type == "budget")
        )
    ]
    assert sorted(actions) == ["budget.create", "budget.delete", "budget.update"]


async def test_bad_budgets_are_refused_with_problems_and_nothing_stored(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = str(server.boot.agent_id)
    _, foreign_agent = await workspace_with_agent(server.services.store, slug="elsewhere")
    cases: list[tuple[dict[str, Any], int]] = [
        ({"scope": "agent", "amount_usd": 1}, 422),  # no agent_id
        ({"scope": "workspace", "agent_id": agent, "amount_usd": 1}, 422),  # target not scope's
        ({"scope": "agent", "agent_id": str(foreign_agent), "amount_usd": 1}, 404),
        ({"scope": "workspace", "amount_usd": 0}, 422),
        ({"scope": "workspace", "amount_usd": -3}, 422),
        ({"scope": "workspace", "amount_usd": 1, "timezone": "Mars/Olympus"}, 422),
        ({"scope": "workspace", "amount_usd": 1, "warn_percent": 0}, 422),
        ({"scope": "workspace", "amount_usd": 1, "period": "week"}, 422),
        ({"scope": "planet", "amount_usd": 1}, 422),
        ({"scope": "workspace", "amount_usd": 1, "spent_usd": 0}, 422),  # not settable
    ]
    for body, status in cases:
        problem(await call(http, server, "POST", "/api/v1/budgets", body=body), status)
    assert await count(server, budgets) == 0


async def test_costs_are_totalled_grouped_and_put_in_series_by_the_database(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    ws, agent = server.boot.workspace_id, server.boot.agent_id
    day = datetime(2026, 11, 3, 12, tzinfo=UTC)

    def row(model: str, cost: float, when: datetime) -> dict[str, Any]:
        return {
            "workspace_id": ws,
            "run_id": None,
            "agent_id": agent,
            "user_id": None,
            "api_key_id": None,
            "provider": "p",
            "model": model,
            "input_tokens": 10,
            "cached_input_tokens": 0,
            "output_tokens": 5,
            "cost_usd": cost,
            "created_at": when,
        }

    async with server.services.store.write() as conn:
        await gateway_store.record_costs(
            conn,
            [
                row("big", 0.5, day),
                row("big", 0.25, day + timedelta(days=1)),
                row("small", 0.125, day + timedelta(days=1)),
                row("small", 9.0, day - timedelta(days=40)),  # outside the range
            ],
        )
    since, until = "2026-11-01T00:00:00Z", "2026-11-10T00:00:00Z"
    query = f"/api/v1/costs?since={since}&until={until}"
    total = await call(http, server, "GET", query)
    assert total.status == 200, total.text
    [all_rows] = total.body["rows"]
    assert (all_rows["calls"], all_rows["cost_usd"], all_rows["output_tokens"]) == (3, 0.875, 15)
    by_model = await call(http, server, "GET", query + "&group_by=model")
    assert {(r["key"], r["cost_usd"]) for r in by_model.body["rows"]} == {
        ("big", 0.75),
        ("small", 0.125),
    }
    series = await call(http, server, "GET", query + "&group_by=model&interval=day")
    assert [(r["day"], r["key"], r["calls"]) for r in series.body["rows"]] == [
        ("2026-11-03", "big", 1),
        ("2026-11-04", "big", 1),
        ("2026-11-04", "small", 1),
    ]
    problem(await call(http, server, "GET", query + "&group_by=colour"), 422)
    backwards = await call(http, server, "GET", f"/api/v1/costs?since={until}&until={since}")
    assert backwards.status == 200 and backwards.body["rows"] == []
    problem(await call(http, server, "GET", "/api/v1/costs?until=0.5"), 422)  # not seconds


async def test_latency_per_hour_is_answered_and_its_range_is_bounded(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    ws, agent = server.boot.workspace_id, server.boot.agent_id
    hour = datetime(2026, 11, 3, 12, tzinfo=UTC)
    for i, ttft in enumerate([100.0, 200.0, 300.0]):
        await finished_run(server.services.store, ws, agent, hour + timedelta(minutes=i), ttft)
    await finished_run(server.services.store, ws, agent, hour + timedelta(hours=2), 50.0)
    query = "/api/v1/costs/latency?since=2026-11-03T00:00:00Z&until=2026-11-04T00:00:00Z"
    reply = await call(http, server, "GET", query)
    assert reply.status == 200, reply.text
    got = reply.body["rows"]
    assert [(r["hour"], r["runs"]) for r in got] == [
        ("2026-11-03T12:00:00Z", 3),
        ("2026-11-03T14:00:00Z", 1),
    ]
    assert abs(got[0]["p50_ms"] - 200.0) < 0.05 * 200.0
    assert abs(got[0]["p95_ms"] - 290.0) < 0.05 * 290.0
    # A range cutting the hour is exact there; the whole hour after it is the histogram's.
    cut = await call(
        http, server, "GET", "/api/v1/costs/latency?since=2026-11-03T12:00:30Z&until=2026-11-04"
    )
    cut_rows = cut.body["rows"]
    assert [(r["runs"], r["p50_ms"]) for r in cut_rows[:1]] == [(2, 250.0)]
    assert cut_rows[1]["runs"] == 1 and abs(cut_rows[1]["p50_ms"] - 50.0) < 0.05 * 50.0
    backwards = await call(
        http, server, "GET", "/api/v1/costs/latency?since=2026-11-04T00:00:00Z&until=2026-11-03"
    )
    assert backwards.status == 200 and backwards.body["rows"] == []
    longest = "/api/v1/costs/latency?since=2025-01-01T00:00:00Z&until=2026-01-02T00:00:00Z"
    assert (await call(http, server, "GET", longest)).status == 200  # 366 days
    longer = "/api/v1/costs/latency?since=2025-01-01T00:00:00Z&until=2026-01-02T00:00:01Z"
    assert problem(await call(http, server, "GET", longer), 422)["type"].endswith("/validation")
    problem(await call(http, server, "GET", "/api/v1/costs/latency?until=0.5"), 422)
    problem(await call(http, server, "GET", "/api/v1/costs/latency?since=yesterday"), 422)
    # The default: the last 30 days to now.
    recent = await call(http, server, "GET", "/api/v1/costs/latency")
    assert recent.status == 200 and isinstance(recent.body["rows"], list)


async def test_instants_at_the_edges_of_time_are_refused_or_answered_never_a_500(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """Year 1 east of UTC leaves datetime's range once moved to UTC (it was a 500), and a
    default `since` 30 days before an `until` in year 1 would too."""
    for path in ("/api/v1/costs", "/api/v1/costs/latency"):
        for name in ("since", "until"):
            reply = await call(http, server, "GET", f"{path}?{name}=0001-01-01T00:00:00%2B14:00")
            body = problem(reply, 422)
            assert body["errors"][0]["field"] == name and "Traceback" not in reply.text
        early = await call(http, server, "GET", f"{path}?until=0001-01-05T00:00:00Z")
        assert early.status == 200, early.text
        assert early.body["since"].startswith("0001-01-01")
        assert sum(row.get("calls", row.get("runs", 0)) for row in early.body["rows"]) == 0
