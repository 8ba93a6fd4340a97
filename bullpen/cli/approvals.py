"""`bullpen approvals …`: list, show, approve and deny the workspace's approvals.

Every command talks to a running server's approvals API, so each decision is authorized and
audited there like any other client's. `bullpen.cli.main` mounts `approvals_cli`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

import typer

from bullpen.cli.client import call
from bullpen.cli.options import DEFAULT_URL, ServerKey, ServerUrl
from bullpen.cli.output import AsJson, print_json, print_table, say

__all__ = ["approvals_cli"]

approvals_cli = typer.Typer(
    help="Approvals (human in the loop), through a running server's API.",
    no_args_is_help=True,
)


class Status(StrEnum):
    """Which approvals to list."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


ApprovalRef = Annotated[str, typer.Argument(metavar="APPROVAL", help="The approval's id.")]
Reason = Annotated[
    str | None, typer.Option("--reason", help="Why (a denied task's error; the model is told).")
]


def _path(ref: str, *rest: str) -> str:
    return "/".join((f"/api/v1/approvals/{quote(ref, safe='')}", *rest))


def _line(approval: dict[str, Any]) -> str:
    what = approval["kind"]
    if approval["tools"]:
        what += " " + ",".join(approval["tools"])
    return f"{approval['id']} {approval['status']} {what} task {approval['task_id']}"


@approvals_cli.command("list")
def approvals_list(
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    status: Annotated[
        Status | None, typer.Option("--status", help="Only approvals in this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="How many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """List the newest approvals (`--status pending` for those waiting)."""
    from rich.table import Table
    from rich.text import Text

    query = f"?limit={limit}" + (f"&status={status.value}" if status is not None else "")
    body = call(url, api_key, "GET", "/api/v1/approvals" + query)
    if as_json:
        print_json(body)
        return
    if not body["items"]:
        say("no approvals")
        return
    table = Table("id", "status", "kind", "tools", "task", "expires", "reason")
    for item in body["items"]:
        table.add_row(
            Text(item["id"]),
            Text(item["status"]),
            Text(item["kind"]),
            Text(",".join(item["tools"]) or "-"),
            Text(item["task_id"]),
            Text(item["expires_at"] if item["status"] == "pending" else "-"),
            Text(item["reason"] or "-"),
        )
    print_table(table)


@approvals_cli.command("show")
def approvals_show(
    ref: ApprovalRef,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    as_json: AsJson = False,
) -> None:
    """Show one approval (a tool call's shows the held calls)."""
    body = call(url, api_key, "GET", _path(ref))
    if as_json:
        print_json(body)
        return
    lines = [_line(body)]
    lines += [f"  {held['name']}({held['arguments']})" for held in body["calls"]]
    if body["status"] == "pending":
        lines.append(f"  expires {body['expires_at']} with {body['default_outcome']}")
    elif body["reason"]:
        lines.append(f"  reason: {body['reason']}")
    typer.echo("\n".join(lines))


def _decide(
    verb: str,
    ref: str,
    url: str,
    key: str,
    reason: str | None,
    as_json: bool,
    amount_usd: float | None = None,
) -> None:
    sent: dict[str, object] = {"reason": reason} if reason else {}
    if amount_usd is not None:
        sent["amount_usd"] = amount_usd
    body = call(url, key, "POST", _path(ref, verb), sent)
    if as_json:
        print_json(body)
    else:
        say(_line(body))


@approvals_cli.command("approve")
def approvals_approve(
    ref: ApprovalRef,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    reason: Reason = None,
    amount: Annotated[
        float | None,
        typer.Option(
            "--amount",
            help="A budget override: how much more (USD) the task may spend past its budgets.",
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Approve: a held task is queued, a held tool step runs, a budget override (--amount)
    lets the task go on."""
    _decide("approve", ref, url, api_key, reason, as_json, amount)


@approvals_cli.command("deny")
def approvals_deny(
    ref: ApprovalRef,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Deny: a held task is cancelled; a held tool call is not made (the model is told)."""
    _decide("deny", ref, url, api_key, reason, as_json)
