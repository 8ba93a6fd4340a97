"""`bullpen budgets …` and `bullpen costs`: the real CLI against a real `bullpen up`, each
command its own process over HTTP with the bootstrap API key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import ApiCli, served_cli


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCli]:
    """One `bullpen up` for the module, and its bootstrap API key in BULLPEN_API_KEY."""
    with served_cli(tmp_path_factory.mktemp("data")) as served:
        yield served


def test_budgets_are_created_listed_changed_and_deleted(cli: ApiCli) -> None:
    agent = cli.api("GET", "/api/v1/agents")["items"][0]["id"]
    made = cli.json("budgets", "create", "agent", agent, "--amount", "25", "--warn", "60")
    assert (made["scope"], made["agent_id"], made["amount_usd"]) == ("agent", agent, 25.0)
    assert made["warn_percent"] == 60 and made["hard_stop"] is True
    workspace = cli.json("budgets", "create", "workspace", "--amount", "100", "--warn-only")
    assert workspace["hard_stop"] is False and workspace["period"] == "month"
    table = cli.ok("budgets", "list")
    assert made["id"] in table and workspace["id"] in table and "warn only" in table
    changed = cli.json("budgets", "set", made["id"], "--amount", "30", "--warn-only")
    assert changed["amount_usd"] == 30.0 and changed["hard_stop"] is False
    assert cli("budgets", "set", made["id"]).returncode != 0  # nothing to change
    # A refusal is the API's problem detail, exit 1.
    wrong = cli("budgets", "create", "agent", "--amount", "5")
    assert wrong.returncode == 1 and "agent_id" in wrong.stderr
    deleted = cli("budgets", "delete", made["id"])
    assert deleted.returncode == 0 and made["id"] in deleted.stderr
    assert [b["id"] for b in cli.api("GET", "/api/v1/budgets")["items"]] == [workspace["id"]]


def test_costs_print_the_ledger_grouped_and_daily(cli: ApiCli) -> None:
    report = cli.json("costs", "--by", "model", "--daily")
    assert report["group_by"] == "model" and report["interval"] == "day"
    assert isinstance(report["rows"], list)
    assert "USD" in cli.ok("costs")
    bad = cli("costs", "--since", "yesterday")
    assert bad.returncode == 1 and "since" in bad.stderr
    assert cli.api_key not in "".join(cli.outputs)
