"""`bullpen providers …` and `bullpen routes …`: the real CLI against a real `bullpen up`.

Every command runs as its own process over HTTP with the bootstrap API key; none of them may
print the provider's key, or the Bullpen key, or a traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bullpen.settings import Settings
from tests.support.mcp_tools import calls_in, stdio_command
from tests.support.processes import (
    BullpenCli,
    bootstrap_key,
    bullpen_up,
    free_port,
    process_env,
)

PROVIDER_KEY = f"sk-clitest-{uuid.uuid4().hex}"
MCP_HEADER = f"Bearer mcp-clitest-{uuid.uuid4().hex}"


@dataclass
class Cli(BullpenCli):
    """`bullpen …` against the module's server."""

    def listed(self, what: str) -> dict[str, dict[str, Any]]:
        """`bullpen <what> list --json`, by name."""
        items = json.loads(self.ok(what, "list", "--json"))["items"]
        return {item["name"]: item for item in items}


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One `bullpen up` for the module, and its bootstrap API key in BULLPEN_API_KEY."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), secret_key="t" * 40)
    # The MCP test's stdio server runs this interpreter.
    env = process_env(settings, process_allow=sys.executable)
    api_key = asyncio.run(bootstrap_key(settings))
    port = free_port()
    with bullpen_up(env, port):
        yield Cli(
            {
                **env,
                "BULLPEN_URL": f"http://127.0.0.1:{port}",
                "BULLPEN_API_KEY": api_key,
                "OPENAI_TEST_KEY": PROVIDER_KEY,
                "MCP_TEST_HEADER": MCP_HEADER,
            },
            api_key,
        )


def test_providers_and_routes_round_trip_without_showing_a_key(cli: Cli) -> None:
    added = cli.ok(
        "providers",
        "add",
        "openai",
        "--base-url",
        "https://api.openai.com/v1",
        "--api-key-env",
        "OPENAI_TEST_KEY",
        "--model",
        "gpt-4o-mini:0.15:0.6",
        "--model",
        "meta/llama-3.1-8b:0.05:0.1:0.01",
        "--ttft-timeout",
        "20",
    )
    assert added == ""  # confirmations go to stderr, so stdout stays parseable
    provider = cli.listed("providers")["openai"]
    assert provider["api_key_hint"] == f"sk-…{PROVIDER_KEY[-4:]}"
    assert provider["models"] == [
        {
            "name": "gpt-4o-mini",
            "input_per_mtok": 0.15,
            "cached_input_per_mtok": 0.15,
            "output_per_mtok": 0.6,
        },
        {
            "name": "meta/llama-3.1-8b",
            "input_per_mtok": 0.05,
            "cached_input_per_mtok": 0.01,
            "output_per_mtok": 0.1,
        },
    ]
    assert provider["timeouts"]["ttft_s"] == 20
    table = cli.ok("providers", "list")
    assert "openai" in table and provider["api_key_hint"] in table

    cli.ok("providers", "update", "openai", "--connect-timeout", "3", "--deadline", "120")
    updated = cli.listed("providers")["openai"]
    assert updated["timeouts"] == {**provider["timeouts"], "connect_s": 3, "deadline_s": 120}
    assert updated["models"] == provider["models"]
    assert updated["api_key_hint"] == provider["api_key_hint"]

    cli.ok("routes", "set", "smart", "openai/gpt-4o-mini")
    created = cli.listed("routes")["smart"]
    assert created["chain"] == [{"provider": "openai", "model": "gpt-4o-mini"}]
    # Split at the first `/`: the model's own name holds one.
    cli.ok("routes", "set", "smart", "openai/meta/llama-3.1-8b", "openai/gpt-4o-mini")
    route = cli.listed("routes")["smart"]
    assert route["id"] == created["id"]
    assert route["chain"] == [
        {"provider": "openai", "model": "meta/llama-3.1-8b"},
        {"provider": "openai", "model": "gpt-4o-mini"},
    ]

    refused = cli("providers", "remove", "openai")
    assert refused.returncode == 1
    assert "error: provider 'openai' is used by model routes smart" in refused.stderr

    cli.ok("routes", "remove", "smart")
    cli.ok("providers", "remove", "openai")  # would be refused if the route were still there
    gone = cli("providers", "remove", "openai")
    assert gone.returncode == 1 and "error: no provider named 'openai'" in gone.stderr

    printed = "".join(cli.outputs)
    assert PROVIDER_KEY not in printed and PROVIDER_KEY[4:20] not in printed
    assert cli.api_key not in printed


def test_a_key_from_stdin_replaces_the_old_one_and_can_be_removed(cli: Cli) -> None:
    cli.ok("providers", "add", "local", "--base-url", "https://llm.example.test/v1", "--model", "m")
    cli.ok("providers", "update", "local", "--api-key-stdin", stdin=PROVIDER_KEY + "\n")
    local = cli.listed("providers")["local"]
    assert local["api_key_hint"] == f"sk-…{PROVIDER_KEY[-4:]}"
    assert local["models"][0]["output_per_mtok"] == 0  # a bare model name costs nothing
    cli.ok("providers", "update", "local", "--remove-api-key")
    assert cli.listed("providers")["local"]["api_key_hint"] is None
    cli.ok("providers", "remove", "local")
    assert PROVIDER_KEY not in "".join(cli.outputs)


def test_the_servers_field_problems_are_printed(cli: Cli) -> None:
    done = cli("providers", "add", "slow", "--base-url", "http://x.test/v1", "--idle-timeout", "0")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ")
    assert "timeouts.idle_s: " in done.stderr


def test_a_bad_api_key_is_a_clear_error(cli: Cli) -> None:
    wrong = "bp_not-a-real-key-0123456789"
    done = cli("providers", "list", "--api-key", wrong)
    assert done.returncode == 1
    assert done.stderr.startswith("error: invalid API key")
    assert done.stdout == "" and wrong not in done.stderr


def test_an_unreachable_server_is_a_clear_error(cli: Cli) -> None:
    done = cli("routes", "list", "--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach the Bullpen server at http://127.0.0.1:")
    assert len(done.stderr.strip().splitlines()) == 1
    assert cli.api_key not in done.stderr


def test_mcp_servers_round_trip_and_test_lists_tools(cli: Cli, tmp_path: Path) -> None:
    cli.ok(
        "mcp",
        "add",
        "remote",
        "--endpoint",
        "https://mcp.example.test/mcp",
        "--header-env",
        "Authorization=MCP_TEST_HEADER",
        "--timeout",
        "5",
    )
    remote = cli.listed("mcp")["remote"]
    assert remote["header_hints"] == {"Authorization": f"Bea…{MCP_HEADER[-4:]}"}
    assert remote["timeout_s"] == 5
    # Another origin needs the headers again; a loopback address is refused.
    moved = cli("mcp", "update", "remote", "--endpoint", "https://elsewhere.example.test/mcp")
    assert moved.returncode == 1 and "headers" in moved.stderr
    cli.ok("mcp", "update", "remote", "--endpoint", "https://b.example.test/", "--remove-headers")
    assert cli.listed("mcp")["remote"]["header_hints"] == {}
    refused = cli("mcp", "add", "near", "--endpoint", "http://127.0.0.1:9/mcp")
    assert refused.returncode == 1 and "not a public address" in refused.stderr
    # A stdio server: `test` starts it and lists its tools.
    log = tmp_path / "calls.log"
    cli.ok("mcp", "add", "local", "--timeout", "20", "--", *stdio_command(log))
    listed = cli.ok("mcp", "test", "local", "--json")
    tools = {t["wire_name"] for t in json.loads(listed)["items"]}
    assert {"local__add", "local__note", "local__hang"} <= tools
    assert calls_in(log) == []
    cli.ok("mcp", "remove", "remote")
    cli.ok("mcp", "remove", "local")
    assert cli.listed("mcp") == {}
    assert all(MCP_HEADER not in out for out in cli.outputs)
