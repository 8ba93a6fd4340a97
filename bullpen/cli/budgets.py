"""`bullpen budgets …` and `bullpen costs`: spend caps and the cost ledger, through the API.

Every command talks to a running server's API, so changes are authorized and audited there
like any other client's. `bullpen.cli.main` mounts `budgets_cli` and `costs`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

from bullpen.cli.client import call
from bullpen.cli.options import DEFAULT_URL, ServerKey, ServerUrl
from bullpen.cli.output import AsJson, print_json, print_table, say

__all__ = ["budgets_cli", "costs"]

budgets_cli = typer.Typer(
    help="Budgets (spend caps per period), through a running server's API.",
    no_args_is_help=True,
)


class Scope(StrEnum):
    """What a budget covers."""

    WORKSPACE = "workspace"
    AGENT = "agent"
    API_KEY = "api_key"  # pragma: allowlist secret
    TASK = "task"


class Period(StrEnum):
    """How often a budget starts over."""

    MONTH = "month"
    LIFETIME = "lifetime"


class Group(StrEnum):
    """What `bullpen costs` groups by."""

    AGENT = "agent"
    MODEL = "model"
    PROVIDER = "provider"
    API_KEY = "api_key"  # pragma: allowlist secret
    SOURCE = "source"


BudgetRef = Annotated[str, typer.Argument(metavar="BUDGET", help="The budget's id.")]
Amount = Annotated[float | None, typer.Option("--amount", min=0.0, help="USD per period.")]
Warn = Annotated[
    int | None, typer.Option("--warn", min=1, max=100, help="Warn at this percent of the amount.")
]
TimeZone = Annotated[str | None, typer.Option("--timezone", help="IANA name (month budgets).")]


def _path(ref: str) -> str:
    return f"/api/v1/budgets/{quote(ref, safe='')}"


def _line(budget: dict[str, Any]) -> str:
    target = budget["agent_id"] or budget["api_key_id"] or budget["task_id"]
    scope = budget["scope"] + (f" {target}" if target else "")
    return (
        f"{budget['id']} {scope}: ${budget['spent_usd']:.4f} spent + "
        f"${budget['reserved_usd']:.4f} reserved of ${budget['amount_usd']:.2f} "
        f"({budget['period']})"
    )


@budgets_cli.command("list")
def budgets_list(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """List the workspace's budgets with this period's spend."""
    from rich.table import Table
    from rich.text import Text

    body = call(url, api_key, "GET", "/api/v1/budgets")
    if as_json:
        print_json(body)
        return
    if not body["items"]:
        say("no budgets")
        return
    table = Table("id", "scope", "target", "amount", "spent", "reserved", "period ends", "stop")
    for b in body["items"]:
        table.add_row(
            Text(b["id"]),
            Text(b["scope"]),
            Text(b["agent_id"] or b["api_key_id"] or b["task_id"] or "-"),
            Text(f"{b['amount_usd']:.2f}"),
            Text(f"{b['spent_usd']:.4f}"),
            Text(f"{b['reserved_usd']:.4f}"),
            Text(b["period_end"] or "never"),
            Text("yes" if b["hard_stop"] else "warn only"),
        )
    print_table(table)


@budgets_cli.command("create")
def budgets_create(
    scope: Annotated[Scope, typer.Argument(help="What the budget covers.")],
    target: Annotated[
        str | None,
        typer.Argument(help="The agent, API key or task id (not for a workspace budget)."),
    ] = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    amount: Annotated[float, typer.Option("--amount", min=0.0, help="USD per period.")],
    period: Annotated[Period, typer.Option("--period", help="month or lifetime.")] = Period.MONTH,
    timezone: TimeZone = None,
    warn: Warn = None,
    warn_only: Annotated[
        bool, typer.Option("--warn-only", help="Warn and record, never stop calls.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Create a budget: `bullpen budgets create agent AGENT_ID --amount 50`."""
    body: dict[str, Any] = {"scope": scope.value, "amount_usd": amount, "period": period.value}
    if target is not None:
        body[f"{scope.value}_id"] = target
    if timezone is not None:
        body["timezone"] = timezone
    if warn is not None:
        body["warn_percent"] = warn
    if warn_only:
        body["hard_stop"] = False
    made = call(url, api_key, "POST", "/api/v1/budgets", body, create=True)
    print_json(made) if as_json else say(_line(made))


@budgets_cli.command("set")
def budgets_set(
    ref: BudgetRef,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    amount: Amount = None,
    warn: Warn = None,
    timezone: TimeZone = None,
    hard_stop: Annotated[
        bool | None, typer.Option("--hard-stop/--warn-only", help="Stop calls, or only warn.")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Change a budget's amount, warning threshold, time zone or hard stop."""
    body: dict[str, Any] = {}
    if amount is not None:
        body["amount_usd"] = amount
    if warn is not None:
        body["warn_percent"] = warn
    if timezone is not None:
        body["timezone"] = timezone
    if hard_stop is not None:
        body["hard_stop"] = hard_stop
    if not body:
        raise typer.BadParameter("nothing to change; give at least one option")
    changed = call(url, api_key, "PATCH", _path(ref), body)
    print_json(changed) if as_json else say(_line(changed))


@budgets_cli.command("delete")
def budgets_delete(ref: BudgetRef, url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey) -> None:
    """Delete a budget (the ledger keeps every call)."""
    call(url, api_key, "DELETE", _path(ref))
    say(f"deleted budget {ref}")


def costs(
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    since: Annotated[str | None, typer.Option("--since", help="RFC 3339 start.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="RFC 3339 end.")] = None,
    group_by: Annotated[Group | None, typer.Option("--by", help="Group by this.")] = None,
    daily: Annotated[bool, typer.Option("--daily", help="A row per UTC day.")] = False,
    as_json: AsJson = False,
) -> None:
    """What LLM calls cost: totals of the cost ledger (last 30 days unless given a range)."""
    from rich.table import Table
    from rich.text import Text

    query = {
        k: v
        for k, v in (
            ("since", since),
            ("until", until),
            ("group_by", group_by.value if group_by else None),
            ("interval", "day" if daily else None),
        )
        if v is not None
    }
    body = call(url, api_key, "GET", "/api/v1/costs" + ("?" + urlencode(query) if query else ""))
    if as_json:
        print_json(body)
        return
    table = Table("day", group_by.value if group_by else "", "calls", "in", "out", "USD")
    for row in body["rows"]:
        table.add_row(
            Text(row["day"] or "-"),
            Text(row["key"] or "-"),
            Text(str(row["calls"])),
            Text(str(row["input_tokens"])),
            Text(str(row["output_tokens"])),
            Text(f"{row['cost_usd']:.4f}"),
        )
    print_table(table)
