"""`bullpen agents …`: the real CLI against a real `bullpen up`.

Every command runs as its own process over HTTP with the bootstrap API key; the audit log is
read back through the API. No output may hold a webhook secret, the Bullpen key or a traceback.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bullpen.cli.client import request
from bullpen.settings import Settings
from tests.support.processes import (
    BullpenCli,
    bootstrap_key,
    bullpen_up,
    free_port,
    process_env,
)

WEBHOOK_SECRET = f"whsec-clitest-{uuid.uuid4().hex}"
PROCESS_SECRET = f"procenv-clitest-{uuid.uuid4().hex}"


@dataclass
class Cli(BullpenCli):
    """`bullpen agents …` against the module's server."""

    url: str = ""
    prefix: tuple[str, ...] = ("agents",)

    def json(self, *args: str) -> Any:
        """Run with --json, expect exit 0, return the parsed stdout."""
        return json.loads(self.ok(*args, "--json"))

    def api(self, path: str) -> Any:
        """GET an API path directly (to check what the CLI did, without the CLI)."""
        return request("GET", self.url, path, api_key=self.api_key)[1]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One `bullpen up` for the module, and its bootstrap API key in BULLPEN_API_KEY."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), secret_key="t" * 40)
    env = process_env(
        settings,
        outbound_allow="127.0.0.1/32",
        process_allow="/bin/sh",
        process_env_allow="TEAM,API_TOKEN",
    )
    api_key = asyncio.run(bootstrap_key(settings))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with bullpen_up(env, port):
        yield Cli(
            {
                **env,
                "BULLPEN_URL": url,
                "BULLPEN_API_KEY": api_key,
                "HOOK_SECRET": WEBHOOK_SECRET,
                "MY_TOKEN": PROCESS_SECRET,
                "COLUMNS": "200",  # usage errors come in a box that wraps at the width
            },
            api_key,
            url=url,
        )


def _at(lines: list[str], name: str) -> tuple[int, int]:
    """The line and column of agent `name` in a drawn tree."""
    label = f"{name} "  # a name is followed by its title or its adapter
    (found,) = [(row, line.index(label)) for row, line in enumerate(lines) if label in line]
    return found


def test_an_org_is_built_drawn_and_rearranged(cli: Cli, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You lead research.\nBe brief.\n", encoding="utf-8")
    lead = cli.json(
        "create",
        "lead",
        "--model",
        "sim-1",
        "--provider",
        "simulated",
        "--title",
        "Head of research",
        "--max-runs",
        "3",
        "--system-prompt-file",
        str(prompt),
    )
    assert lead["config"] == {
        "model": "sim-1",
        "provider": "simulated",
        "system_prompt": "You lead research.\nBe brief.\n",
    }
    assert lead["max_concurrent_runs"] == 3 and lead["reports_to"] is None
    cli.ok("create", "analyst-a", "--model", "sim-1", "--reports-to", "lead")
    cli.ok("create", "analyst-b", "--model", "sim-1", "--reports-to", lead["id"])  # by id
    intern = cli.json("create", "intern", "--model", "sim-1", "--reports-to", "analyst-a")

    lines = cli.ok("tree").splitlines()
    names = ["lead", "analyst-a", "intern", "analyst-b"]
    rows, columns = zip(*(_at(lines, name) for name in names), strict=True)
    assert list(rows) == sorted(rows), lines  # each agent under its manager, reports by name
    assert columns[0] < columns[1] == columns[3] < columns[2], lines
    assert _at(lines, "demo")[1] == columns[0]  # the bootstrap agent is another root
    assert "lead · Head of research (llm, active)" in lines[rows[0]]
    chart = cli.json("tree")
    (root,) = [node for node in chart["roots"] if node["name"] == "lead"]
    assert [node["name"] for node in root["reports"]] == ["analyst-a", "analyst-b"]
    assert [node["name"] for node in root["reports"][0]["reports"]] == ["intern"]

    table = cli.ok("list").splitlines()
    (intern_row,) = [line for line in table if "intern" in line]
    cells = [cell.strip() for cell in intern_row.strip("│ ").split("│")]
    assert cells == ["intern", "-", "llm", "active", "analyst-a", "10"], table

    cycle = cli("set", "lead", "--reports-to", "intern")
    assert cycle.returncode == 1
    assert cycle.stderr.startswith("error: reporting to 'intern' would make a cycle"), cycle.stderr
    assert cli.api(f"/api/v1/agents/{lead['id']}")["reports_to"] is None

    moved = cli.json("set", "intern", "--no-manager", "--title", "Summer intern")
    assert moved["reports_to"] is None and moved["title"] == "Summer intern"
    shown = cli.ok("show", intern["id"])
    assert "Summer intern" in shown and "sim-1" in shown
    assert "analyst-a" not in shown  # no longer its manager

    refused = cli("delete", "lead")
    assert refused.returncode == 1
    assert "has reports (analyst-a, analyst-b)" in refused.stderr, refused.stderr
    for report in ("analyst-a", "analyst-b"):
        cli.ok("set", report, "--no-manager")
    deleted = cli("delete", "lead")
    assert deleted.returncode == 0
    assert deleted.stderr.strip() == "deleted agent lead"
    roots = [node["name"] for node in cli.api("/api/v1/agents/tree")["roots"]]
    assert roots == ["analyst-a", "analyst-b", "demo", "intern"]


def test_pause_resume_and_terminate_are_audited(cli: Cli) -> None:
    agent = cli.json("create", "worker", "--model", "sim-1")
    paused = cli("pause", "worker")
    assert paused.returncode == 0 and paused.stderr.strip() == "agent worker is paused"
    assert cli.json("resume", "worker")["status"] == "active"

    declined = cli("terminate", "worker", stdin="n\n")
    assert declined.returncode == 1
    assert "Terminate agent worker?" in declined.stderr
    assert "agent worker was not terminated" in declined.stderr
    assert cli.api(f"/api/v1/agents/{agent['id']}")["status"] == "active"

    terminated = cli("terminate", "worker", stdin="y\n")
    assert terminated.returncode == 0 and "agent worker is terminated" in terminated.stderr
    again = cli("resume", "worker")
    assert again.returncode == 1
    assert again.stderr.startswith("error: agent 'worker' is terminated"), again.stderr

    events = cli.api(f"/api/v1/audit-events?target_id={agent['id']}")["items"]
    actions = [event["action"] for event in reversed(events)]  # the API lists newest first
    assert actions == ["agent.create", "agent.pause", "agent.resume", "agent.terminate"]
    assert events[0]["data"] == {"before": {"status": "active"}, "after": {"status": "terminated"}}


def test_an_http_agent_takes_its_secret_from_the_environment_only(cli: Cli) -> None:
    config = {"url": "http://127.0.0.1:9/hook", "timeout_s": 5.0}
    in_argv = cli(
        "create",
        "hook",
        "--adapter",
        "http",
        "--config-json",
        json.dumps({**config, "secret": WEBHOOK_SECRET}),
    )
    assert in_argv.returncode == 2 and "--secret-env or --secret-stdin" in in_argv.stderr
    made = cli.json(
        "create",
        "hook",
        "--adapter",
        "http",
        "--config-json",
        json.dumps(config),
        "--secret-env",
        "HOOK_SECRET",
    )
    assert made["adapter"] == "http"
    assert made["config"]["url"] == config["url"]
    assert made["config"]["secret_hint"].endswith(WEBHOOK_SECRET[-4:])
    assert "hook" in cli.ok("show", "hook")
    cli.ok("delete", "hook")
    gone = cli("show", "hook")
    assert gone.returncode == 1 and "error: no agent named 'hook'" in gone.stderr
    printed = "".join(cli.outputs)
    assert WEBHOOK_SECRET not in printed and WEBHOOK_SECRET[:20] not in printed
    assert cli.api_key not in printed


def test_a_process_agent_takes_its_secret_env_from_the_environment_only(cli: Cli) -> None:
    config = {"command": ["/bin/sh", "-c", "true"], "env": {"TEAM": "blue"}}
    in_argv = cli(
        "create",
        "runner",
        "--adapter",
        "process",
        "--config-json",
        json.dumps({**config, "secret_env": {"API_TOKEN": PROCESS_SECRET}}),
    )
    assert in_argv.returncode == 2 and "--secret-env NAME[=VAR]" in in_argv.stderr
    unset = cli(
        "create",
        "runner",
        "--adapter",
        "process",
        "--config-json",
        json.dumps(config),
        "--secret-env",
        "API_TOKEN=NOT_SET_ANYWHERE",
    )
    assert unset.returncode == 1 and "NOT_SET_ANYWHERE is not set" in unset.stderr
    made = cli.json(
        "create",
        "runner",
        "--adapter",
        "process",
        "--config-json",
        json.dumps(config),
        "--secret-env",
        "API_TOKEN=MY_TOKEN",
    )
    assert made["config"]["env"] == {"TEAM": "blue"}
    assert made["config"]["secret_env_hints"] == {"API_TOKEN": "…" + PROCESS_SECRET[-4:]}
    cli.ok("delete", "runner")
    assert PROCESS_SECRET not in "".join(cli.outputs)


def test_an_unknown_agent_is_a_clear_error_and_no_question(cli: Cli) -> None:
    done = cli("terminate", "nobody")
    assert done.returncode == 1
    assert done.stderr.strip() == "error: no agent named 'nobody'"
    assert done.stdout == ""


def test_breaker_overrides_are_set_and_shown(cli: Cli) -> None:
    cli.json("create", "guarded", "--model", "sim-1")
    changed = cli.json(
        "set", "guarded", "--breakers-json", '{"runs_per_hour": 200, "usd_per_hour": null}'
    )
    assert changed["breakers"] == {"runs_per_hour": 200, "usd_per_hour": None}
    assert changed["breaker_limits"] == {
        "runs_per_hour": 200,
        "failures_in_a_row": 10,
        "usd_per_hour": None,
    }
    shown = cli.ok("show", "guarded")
    assert "runs/h 200, failures in a row 10, USD/h none" in shown
    refused = cli("set", "guarded", "--breakers-json", '{"runs_per_hour": 0}')
    assert refused.returncode == 1 and "breakers.runs_per_hour" in refused.stderr, refused.stderr
    bad = cli("set", "guarded", "--breakers-json", "[1]")
    assert bad.returncode == 2 and "JSON object" in bad.stderr
