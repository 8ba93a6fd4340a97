"""A `process` agent's environment through the API and the worker, on both backends: the
operator's allow-list of variable names, sealed `secret_env` (shown as hints only, kept across
config changes only while what runs stays the same), what readers without `agents:write` see,
and the server's own environment kept from the command."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.store.tables import agents, audit_events, run_events
from tests.support.db import rows
from tests.support.http import bearer, call, problem
from tests.support.seed import new_member
from tests.support.servers import RunningServer
from tests.support.sse import read_events
from tests.support.team import create_task, until_ended

SH, ENV = "/bin/sh", "/usr/bin/env"
ENV_REFUSED = "https://bullpen.dev/problems/process-env-not-allowed"
SECRETS_REQUIRED = "https://bullpen.dev/problems/process-secret-env-required"
CANARY = "canary-secret-env-7f3a9c01d2e4b5a6"
PLAIN_CANARY = "plain-env-canary-5d1e"
# Names the old deny-list let through, each of which makes some program load or run other code
# or send its traffic elsewhere.
LEAKY = [
    "OPENSSL_CONF",
    "LUA_INIT",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_PARAMETERS",
    "LESSOPEN",
    "ZDOTDIR",
    "http_proxy",
]
# Prints the SHA-256 of the secret (never the secret) and the plain variable.
SCRIPT = 'printf %s "$API_TOKEN" | sha256sum; printf "team=%s\\n" "$TEAM"'
ALLOWED = pytest.mark.with_settings(
    process_allow=f"{SH},{ENV}", process_env_allow="TEAM,API_*,LANG"
)


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def agent_body(**config: Any) -> dict[str, Any]:
    return {
        "name": "runner",
        "adapter": "process",
        "config": {"command": [SH, "-c", SCRIPT], **config},
    }


async def run_task(
    http: aiohttp.ClientSession, server: RunningServer, agent: dict[str, Any]
) -> Any:
    """Run one task on the agent; the task once ended (it must end `done`)."""
    task = await create_task(http, server, agent, "Show what you were given")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done", ended
    return ended


async def config_rows(server: RunningServer) -> list[Any]:
    return [row.config for row in await rows(server, sa.select(agents).order_by(agents.c.id))]


@pytest.mark.with_settings(process_allow=SH)
async def test_env_names_off_the_operator_allow_list_are_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # The default allow-list: locale and time zone names only.
    created = await call(http, server, "POST", "/api/v1/agents", body=agent_body(env={"LANG": "C"}))
    assert created.status == 201, created.text
    path = f"/api/v1/agents/{created.body['id']}"
    before = await config_rows(server)
    for name in LEAKY:
        for field in ("env", "secret_env"):
            config = {"command": [SH, "-c", "true"], field: {name: "/tmp/x"}}
            for method, where, body in (
                ("POST", "/api/v1/agents", {**agent_body(), "name": "other", "config": config}),
                ("PATCH", path, {"config": config}),
            ):
                reply = await call(http, server, method, where, body=body)
                refused = problem(reply, 422)
                assert refused["type"] == ENV_REFUSED, (name, field, method, refused)
                assert (
                    name in refused["detail"] and "BULLPEN_PROCESS_ENV_ALLOW" in refused["detail"]
                )
                assert refused["errors"][0]["field"] == f"config.{field}.{name}"
                assert "/tmp/x" not in reply.text
    assert await config_rows(server) == before


@ALLOWED
async def test_a_secret_env_value_reaches_the_command_and_nowhere_else(
    server: RunningServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = agent_body(env={"TEAM": "blue"}, secret_env={"API_TOKEN": CANARY})
    created = await call(
        http, server, "POST", "/api/v1/agents", {**server.auth, "Idempotency-Key": "p1"}, body
    )
    assert created.status == 201, created.text
    agent = created.body
    assert agent["config"]["env"] == {"TEAM": "blue"}
    assert agent["config"]["secret_env_hints"] == {"API_TOKEN": "…" + CANARY[-4:]}
    assert "secret_env" not in agent["config"]
    ended = await run_task(http, server, agent)
    assert ended["result"].splitlines() == [f"{digest(CANARY)}  -", "team=blue"]

    # No reader sees it, whatever its role; a replay of the create shows the hint only.
    replay = await call(
        http, server, "POST", "/api/v1/agents", {**server.auth, "Idempotency-Key": "p1"}, body
    )
    seen = [replay.text, json.dumps(ended)]
    for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
        member = await new_member(server, role, f"{role.value}@x.io")
        for path in ("/api/v1/agents", f"/api/v1/agents/{agent['id']}"):
            reply = await call(http, server, "GET", path, bearer(member.key))
            assert reply.status == 200
            seen.append(reply.text)
    seen.append((await call(http, server, "GET", f"/api/v1/agents/{agent['id']}")).text)
    # Nor the audit log, the run's events, the task's and the workspace's streams, the logs.
    audit = await rows(server, sa.select(audit_events))
    seen.append(json.dumps([dict(r._mapping) for r in audit], default=str))
    events = await rows(server, sa.select(run_events))
    seen.append(json.dumps([e.data for e in events]))
    task_stream = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{ended['id']}/events", server.auth
    )
    seen.append(json.dumps([e.data for e in task_stream]))
    feed = await read_events(
        http,
        f"{server.base_url}/api/v1/events?after=0",
        server.auth,
        until=lambda got: any(e.data.get("status") == "done" for e in got),
    )
    seen.append(json.dumps([e.data for e in feed]))
    seen.append(caplog.text)
    seen.extend(str(record.args) for record in caplog.records)
    # At rest it is sealed: not in the agent's row either.
    seen.append(json.dumps(await config_rows(server)))
    for text in seen:
        assert CANARY not in text


@ALLOWED
async def test_readers_without_agents_write_see_env_names_not_values(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = agent_body(env={"TEAM": PLAIN_CANARY}, secret_env={"API_TOKEN": CANARY})
    created = await call(http, server, "POST", "/api/v1/agents", body=body)
    assert created.status == 201, created.text
    path = f"/api/v1/agents/{created.body['id']}"
    # An admin's key narrowed to `agents:read` reads as a viewer does.
    narrowed = await call(
        http, server, "POST", "/api/v1/api-keys", body={"name": "reader", "scopes": ["agents:read"]}
    )
    assert narrowed.status == 201, narrowed.text
    readers = [bearer(narrowed.body["key"])]
    for role in (Role.MEMBER, Role.VIEWER):
        readers.append(bearer((await new_member(server, role, f"{role.value}@x.io")).key))
    for headers in readers:
        one = await call(http, server, "GET", path, headers)
        listed = await call(http, server, "GET", "/api/v1/agents", headers)
        assert one.status == listed.status == 200
        assert PLAIN_CANARY not in one.text + listed.text
        config = one.body["config"]
        assert "env" not in config and "secret_env_hints" not in config
        assert config["env_names"] == ["TEAM"] and config["secret_env_names"] == ["API_TOKEN"]
        assert config["command"] == [SH, "-c", SCRIPT]
    admin = await call(http, server, "GET", path)
    assert admin.body["config"]["env"] == {"TEAM": PLAIN_CANARY}


@ALLOWED
async def test_changing_what_runs_needs_the_secret_env_again(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = agent_body(env={"TEAM": "blue"}, secret_env={"API_TOKEN": CANARY})
    created = await call(http, server, "POST", "/api/v1/agents", body=body)
    assert created.status == 201, created.text
    agent = created.body
    path = f"/api/v1/agents/{agent['id']}"

    # The same command, arguments, directory and env: the sealed values are kept.
    plain = {k: v for k, v in body["config"].items() if k != "secret_env"}
    kept = await call(http, server, "PATCH", path, body={"config": {**plain, "timeout_s": 60.0}})
    assert kept.status == 200, kept.text
    assert kept.body["config"]["secret_env_hints"] == {"API_TOKEN": "…" + CANARY[-4:]}
    assert (await run_task(http, server, agent))["result"].startswith(digest(CANARY))

    # Anything else about what runs, without the values again: 422, nothing changed.
    before = await config_rows(server)
    for changed in (
        {**plain, "command": [SH, "-c", 'printf %s "$API_TOKEN"']},
        {**plain, "command": [ENV]},
        {**plain, "cwd": "/tmp"},
        {**plain, "env": {"TEAM": "red"}},
        {**plain, "env": {"TEAM": "blue", "API_URL": "http://127.0.0.1:9/"}},
    ):
        reply = await call(http, server, "PATCH", path, body={"config": changed})
        refused = problem(reply, 422)
        assert refused["type"] == SECRETS_REQUIRED, (changed, refused)
        assert "API_TOKEN" in refused["detail"]
        assert refused["errors"][0]["field"] == "config.secret_env"
    assert await config_rows(server) == before

    # With the values sent again the change is made, and the command gets the new ones.
    renewed = "renewed-secret-0123456789"
    moved = {
        **plain,
        "command": [SH, "-c", SCRIPT + "; true"],
        "secret_env": {"API_TOKEN": renewed},
    }
    reply = await call(http, server, "PATCH", path, body={"config": moved})
    assert reply.status == 200, reply.text
    assert (await run_task(http, server, agent))["result"].startswith(digest(renewed))
    # An empty `secret_env` drops them all.
    dropped = await call(
        http, server, "PATCH", path, body={"config": {**plain, "command": [ENV], "secret_env": {}}}
    )
    assert dropped.status == 200, dropped.text
    assert "secret_env_hints" not in dropped.body["config"]
    environment = (await run_task(http, server, agent))["result"]
    assert "API_TOKEN" not in environment and renewed not in environment


@ALLOWED
async def test_the_command_gets_nothing_of_the_servers_environment(
    server: RunningServer, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker runs in this process: what its environment holds when a run starts counts.
    canaries = {
        "BULLPEN_SECRET_KEY": "canary-server-secret-key-4f1c0000",
        "BULLPEN_DATABASE_URL": "postgresql://canary:canary-db-77aa@db/bullpen",
        "OPENAI_API_KEY": "sk-canary-openai-9e2d",
        "ANTHROPIC_API_KEY": "sk-ant-canary-31b0",
        "AWS_SECRET_ACCESS_KEY": "canary-aws-8c41",
        "API_TOKEN": "canary-inherited-api-token",  # a name agents may set, not set here
    }
    for name, value in canaries.items():
        monkeypatch.setenv(name, value)
    assert os.environ["OPENAI_API_KEY"] == canaries["OPENAI_API_KEY"]
    created = await call(
        http, server, "POST", "/api/v1/agents", body=agent_body(command=[ENV], env={"TEAM": "blue"})
    )
    assert created.status == 201, created.text
    result = (await run_task(http, server, created.body))["result"]
    environment = dict(line.split("=", 1) for line in result.splitlines())
    assert environment.keys() == {
        "PATH",
        "HOME",
        "LANG",
        "BULLPEN_RUN_ID",
        "BULLPEN_TASK_ID",
        "TEAM",
    }
    for value in (*canaries.values(), server.settings.secret_key):
        assert value and value not in result
