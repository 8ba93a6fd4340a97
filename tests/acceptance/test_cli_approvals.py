"""`bullpen approvals …`: the real CLI against a real `bullpen up`, each command its own
process over HTTP with the bootstrap API key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.processes import ApiCli, BullpenCli, served_cli


@dataclass
class Agents(BullpenCli):
    """`bullpen agents …` against the module's server."""

    prefix: tuple[str, ...] = ("agents",)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCli]:
    """One `bullpen up` for the module, and its bootstrap API key in BULLPEN_API_KEY."""
    with served_cli(tmp_path_factory.mktemp("data"), ("approvals",)) as served:
        yield served


def test_approvals_are_listed_shown_approved_and_denied(cli: ApiCli) -> None:
    agents = Agents(cli.env, cli.api_key)
    made = agents("create", "gated", "--model", "sim-1", "--requires-approval", "--json")
    assert made.returncode == 0, made.stderr
    agent = json.loads(made.stdout)
    assert agent["requires_approval"] is True
    assert agents("set", "gated", "--no-approval").returncode == 0
    assert cli.api("GET", f"/api/v1/agents/{agent['id']}")["requires_approval"] is False
    assert agents("set", "gated", "--requires-approval").returncode == 0
    tasks = [
        cli.api(
            "POST", "/api/v1/tasks", {"prompt": f"Analyze dataset {n}", "agent_id": agent["id"]}
        )
        for n in range(2)
    ]
    assert {t["status"] for t in tasks} == {"awaiting_approval"}
    pending = cli.json("list", "--status", "pending")["items"]
    by_task = {a["task_id"]: a["id"] for a in pending}
    first, second = by_task[tasks[0]["id"]], by_task[tasks[1]["id"]]
    table = cli.ok("list", "--status", "pending")
    assert first in table and second in table and "task" in table
    shown = cli.ok("show", first)
    assert "pending" in shown and "expires" in shown and "with deny" in shown

    denied = cli.json("deny", first, "--reason", "not now")
    assert denied["status"] == "denied" and denied["reason"] == "not now"
    assert cli.api("GET", f"/api/v1/tasks/{tasks[0]['id']}")["status"] == "cancelled"
    approved = cli("approve", second)
    assert approved.returncode == 0 and second in approved.stderr and "approved" in approved.stderr
    assert cli.api("GET", f"/api/v1/tasks/{tasks[1]['id']}")["status"] != "awaiting_approval"

    again = cli("approve", first)
    assert again.returncode == 1 and again.stderr.startswith("error: the approval was decided")
    assert cli("show", "00000000-0000-4000-8000-000000000000").returncode == 1
    assert cli("list", "--status", "pending").stderr.strip() == "no approvals"
    assert cli.api_key not in "".join(cli.outputs)
