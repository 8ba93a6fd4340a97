"""BI-1, schema fuzz: schemathesis against a real server on a real socket.

Every operation that /openapi.json documents is fuzzed with every built-in check, in positive and
negative modes, through all four phases (schema examples, coverage, fuzzing, and stateful
sequences that follow the document's OpenAPI links). The run must report no failure, no error and
neither a `missing_auth` nor a `missing_test_data` warning.

schemathesis runs as its own process (its CLI, the documented interface): the server under test
lives in this test's event loop, which keeps serving while the CLI is awaited. Only the CLI
runner computes schemathesis's warnings, and it runs the coverage and stateful phases with link
inference, which the pytest integration does not. Its JSON report is what the assertions read;
its console output (failures with curl reproductions) is the assertion message.

The tenant it starts with: the bootstrap workspace, its owner's API key (the fuzzer's identity),
demo agent and a routine of it, an agent that requires approval and a pending approval of one of
its tasks, which `fuzz_hooks.py` keeps it from deleting or changing; a
cancelled task and its run, offered as path ids half of the time (cancel, retry and run reads
need one that exists), as is the routine (so firing one is reached);
and a second workspace with its own owner key, whose only use is to be deleted. MCP servers
point at a real MCP server (the SDK's, tests/support/mcp_tools.py) the test runs on loopback:
the hooks point every valid `url` the fuzzer sends there, so a server's test lists its tools.

It runs on both backends (TEST-PLAN BI-1: PostgreSQL in CI as well as SQLite); the PostgreSQL
run makes fewer examples by default (the coverage phase, which does not depend on them, is the
same on both), so the pair stays within the suite's time budget.

Knobs: `BULLPEN_FUZZ_MAX_EXAMPLES` (default 20 per operation on SQLite, 10 on PostgreSQL),
`BULLPEN_FUZZ_STATEFUL_EXAMPLES` (default 80 scenarios on SQLite, 40 on PostgreSQL),
`BULLPEN_FUZZ_SEED` (default fixed, so runs repeat), `BULLPEN_FUZZ_BACKENDS` (default
`sqlite,postgres`; one of them alone to run only that),
`BULLPEN_FUZZ_MAX_FAILURES` (default 20: the run stops there, so a bug that makes many requests
hang until the timeout still reports in time), `BULLPEN_FUZZ_TIMEOUT_S` (default 200; the test's
own pytest timeout is 60 s more) and `BULLPEN_FUZZ_ARGS` (more `schemathesis run` options, e.g.
`--phases stateful` or `--include-path-regex ^/api/v1/tasks`). A deep run:
`BULLPEN_FUZZ_MAX_EXAMPLES=200 BULLPEN_FUZZ_TIMEOUT_S=1800 uv run pytest tests/fuzz`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import schemathesis
import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.store import identity
from bullpen.store.tables import agents, api_keys, routines, users, workspaces
from tests.support.mcp_tools import serve_http
from tests.support.seed import _member, member_with_key
from tests.support.servers import RunningServer

# `import schemathesis` above is a hard import on purpose: without schemathesis this module fails
# to collect, so the run fails; it is never skipped (TEST-PLAN BI-1).
BACKENDS = os.environ.get("BULLPEN_FUZZ_BACKENDS", "sqlite,postgres").split(",")
# Per backend: (examples per operation, stateful scenarios). Stateful scenarios: enough for
# sequences to reach operations two or three links deep; 40 on both (SQLite's 80 took 4 to
# 245 s from run to run, the parallel phase's longest test). PostgreSQL's run is the second
# one: fewer examples keep the pair near 150 s; the coverage phase's boundary values (where
# the backends differ most) are all sent on both.
EXAMPLES = {"sqlite": (20, 40), "postgres": (10, 40)}


def examples(backend: str) -> tuple[int, int]:
    """(max examples per operation, stateful scenarios) for a run on `backend`."""
    default, stateful = EXAMPLES[backend]
    return (
        int(os.environ.get("BULLPEN_FUZZ_MAX_EXAMPLES", default)),
        int(os.environ.get("BULLPEN_FUZZ_STATEFUL_EXAMPLES", stateful)),
    )


# Cancelled tasks offered as path ids: a retry re-queues one and it ends `done`, which cannot be
# retried again; with one only, a run whose first accepted retry was a negative case (an
# ignored extra parameter) met nothing but 409s in its positive ones (`missing_test_data`).
SEEDED_TASKS = 6
SEEDED_PER_KIND = 4  # routines and budgets
SEED = int(os.environ.get("BULLPEN_FUZZ_SEED", "20261202"))
MAX_FAILURES = int(os.environ.get("BULLPEN_FUZZ_MAX_FAILURES", "20"))
RUN_TIMEOUT_S = float(os.environ.get("BULLPEN_FUZZ_TIMEOUT_S", "200"))
PHASES = ("examples", "coverage", "fuzzing", "stateful")
# Warnings that fail the run (TEST-PLAN BI-1), plus `unused_openapi_auth`: it would mean the
# bearer key below matched no security scheme, i.e. the harness silently fuzzed unauthenticated.
FAIL_ON_WARNINGS = ("missing_auth", "missing_test_data", "unused_openapi_auth")
HOOKS = Path(__file__).with_name("fuzz_hooks.py")
PROMPT = "Summarise the fuzzing run so far"

FUZZ_SETTINGS = {
    # One key sends hundreds of requests a second here; at the production limits most would be
    # 429s (accepted by every check, but they test nothing and trip `missing_test_data`).
    # Rate limiting has its own tests.
    "rate_limit_key_rps": 1e6,
    "rate_limit_key_burst": 1_000_000,
    "rate_limit_workspace_rps": 1e6,
    "rate_limit_workspace_burst": 1_000_000,
    # Runs last ~0.3 s, so a stateful sequence can still cancel the task it just created.
    "sim_ttft_ms": 250.0,
}

pytestmark = [
    pytest.mark.parametrize("backend", BACKENDS, indirect=True),
    pytest.mark.with_settings(**FUZZ_SETTINGS),
]


@dataclass(frozen=True)
class Tenant:
    """What the fuzzer starts with (see the module docstring)."""

    key: str
    agent_id: str
    task_ids: list[str]
    run_id: str
    doomed_workspace_id: str
    doomed_key: str
    protected_ids: list[str]
    provider_id: str
    route_id: str
    routine_ids: list[str]  # several: each DELETE consumes one, the others keep answering
    budget_ids: list[str]
    mcp_server_ids: list[str]
    workspace_id: str
    member_id: str
    user_id: str
    inviters: dict[str, str]  # by answer: the key of a workspace that invites the fuzzer
    gated_agent_id: str  # an agent that requires approval
    approval_id: str  # a pending approval (of a task of the gated agent)


async def _seed(server: RunningServer, mcp_url: str) -> Tenant:
    assert server.boot.api_key is not None
    base = f"{server.base_url}/api/v1/tasks"
    async with aiohttp.ClientSession(headers=server.auth) as http:
        body = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
        cancelled: list[dict[str, Any]] = []
        for _ in range(SEEDED_TASKS + 5):  # a stall past the run's ~0.3 s makes cancel a 409
            async with http.post(base, json=body) as resp:
                assert resp.status == 201, await resp.text()
                task = await resp.json()
            async with http.post(f"{base}/{task['id']}/cancel") as resp:
                if resp.status == 200:
                    cancelled.append(task)
                    if len(cancelled) == SEEDED_TASKS:
                        break
                else:
                    assert resp.status == 409, await resp.text()
        else:
            pytest.fail("could not cancel tasks before their runs ended")
        task = cancelled[0]
        # A provider (the built-in simulator's endpoint under another name) and a route on it.
        assert server.services.simulator is not None
        provider = {
            "name": "fuzz-sim",
            "base_url": server.services.simulator.base_url,
            "models": [{"name": "sim-1"}],
        }
        async with http.post(f"{server.base_url}/api/v1/providers", json=provider) as resp:
            assert resp.status == 201, await resp.text()
            provider_id = (await resp.json())["id"]
        route = {"name": "fuzz-route", "chain": [{"provider": "fuzz-sim", "model": "sim-1"}]}
        async with http.post(f"{server.base_url}/api/v1/model-routes", json=route) as resp:
            assert resp.status == 201, await resp.text()
            route_id = (await resp.json())["id"]
        # Routines of the seeded agent (one slot a year: they never fire during the run), and
        # budgets too large to stop anything. Several of each, so that a DELETE early in the run
        # leaves the later cases of the other operations something to find.
        routine_ids, budget_ids, mcp_server_ids = [], [], []
        for n in range(SEEDED_PER_KIND):
            mcp_body = {
                "name": f"fuzz-mcp-{n}",
                "transport": "http",
                "url": mcp_url,
                "headers": {"Authorization": "Bearer fuzz-header"},
            }
            async with http.post(f"{server.base_url}/api/v1/mcp-servers", json=mcp_body) as resp:
                assert resp.status == 201, await resp.text()
                mcp_server_ids.append((await resp.json())["id"])
            routine = {
                "name": f"fuzz-routine-{n}",
                "agent_id": str(server.boot.agent_id),
                "cron": "0 0 1 1 *",
                "prompt": PROMPT,
            }
            async with http.post(f"{server.base_url}/api/v1/routines", json=routine) as resp:
                assert resp.status == 201, await resp.text()
                routine_ids.append((await resp.json())["id"])
            budget = {"scope": "workspace", "amount_usd": 1_000_000, "hard_stop": False}
            async with http.post(f"{server.base_url}/api/v1/budgets", json=budget) as resp:
                assert resp.status == 201, await resp.text()
                budget_ids.append((await resp.json())["id"])
        # An agent that requires approval, and a pending approval of one of its tasks.
        gated = {
            "name": "fuzz-gated",
            "config": {"provider": "simulated", "model": "sim-1"},
            "requires_approval": True,
        }
        async with http.post(f"{server.base_url}/api/v1/agents", json=gated) as resp:
            assert resp.status == 201, await resp.text()
            gated_agent_id = (await resp.json())["id"]
        held = {"prompt": PROMPT, "agent_id": gated_agent_id}
        async with http.post(base, json=held) as resp:
            assert resp.status == 201, await resp.text()
        async with http.get(f"{server.base_url}/api/v1/approvals?status=pending") as resp:
            approval_id = (await resp.json())["items"][0]["id"]
    svc = server.services
    async with svc.store.write() as conn:
        doomed = await identity.create_workspace(
            conn, name="Doomed", slug="doomed", task_key="DM", now=svc.clock()
        )
        _, doomed_key = await member_with_key(
            conn,
            doomed,
            role=Role.OWNER,
            secret=svc.secret,
            email="doomed@bullpen.test",
            now=svc.clock(),
        )
    async with svc.store.read() as conn:
        ids = [
            str(row_id)
            for table in (workspaces, users, api_keys, agents, routines)
            for row_id in (await conn.execute(sa.select(table.c.id))).scalars()
        ]
    # Not protected: a member of the fuzzer's workspace for the member routes (invitations,
    # which replaced the old attach, give them no link), and the owners of two workspaces that
    # invite the fuzzer's user (the hooks have them issue invitations to accept and decline).
    async with svc.store.write() as conn:
        member_id, _, _ = await _member(
            conn,
            server.boot.workspace_id,
            role=Role.MEMBER,
            secret=svc.secret,
            email="member@bullpen.test",
            now=svc.clock(),
        )
        inviters = {}
        for verb in ("ACCEPT", "DECLINE"):
            slug = f"inviting-{verb.lower()}"
            inviting = await identity.create_workspace(
                conn, name=slug, slug=slug, task_key="IN", now=svc.clock()
            )
            _, inviter_key = await member_with_key(
                conn,
                inviting,
                role=Role.OWNER,
                secret=svc.secret,
                email=f"{slug}@bullpen.test",
                now=svc.clock(),
            )
            inviters[verb] = inviter_key
        boot_user = (
            await conn.execute(sa.select(users.c.id).where(users.c.email == server.boot.email))
        ).scalar_one()
    return Tenant(
        key=server.boot.api_key,
        agent_id=str(server.boot.agent_id),
        task_ids=[t["id"] for t in cancelled],
        run_id=task["run"]["id"],
        doomed_workspace_id=str(doomed),
        doomed_key=doomed_key,
        protected_ids=[i for i in ids if i != str(doomed)],
        provider_id=provider_id,
        route_id=route_id,
        routine_ids=routine_ids,
        budget_ids=budget_ids,
        mcp_server_ids=mcp_server_ids,
        workspace_id=str(server.boot.workspace_id),
        member_id=str(member_id),
        user_id=str(boot_user),
        inviters=inviters,
        gated_agent_id=gated_agent_id,
        approval_id=approval_id,
    )


def _quoted(ids: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in ids)


def _config(tenant: Tenant, report_dir: Path, backend: str) -> str:
    """schemathesis.toml for one run; keys come from the environment (`${VAR}`)."""
    fail_on = ", ".join(f'"{w}"' for w in FAIL_ON_WARNINGS)
    max_examples, stateful_examples = examples(backend)
    seeded_tasks = ", ".join(f'"{t}"' for t in tenant.task_ids)
    return f"""\
# Reproducible: fixed seed, one worker, no state carried between runs.
seed = {SEED}
workers = 1
max-failures = {MAX_FAILURES}
# Also how long an event stream may stay open (the `event_stream_ends` check in the hooks); the
# server's simulated runs end within a second.
request-timeout = 2
# Read every stream to its end (or the timeout): by default schemathesis stops after 20 events
# and reports the stream as cut short, which the check cannot tell from one that hung (a relay
# answer of 24 tokens is 26 events).
max-stream-events = 100000
hooks = "{HOOKS}"

[cache]
enabled = false

[generation]
mode = "all"
max-examples = {max_examples}
database = "none"

[phases.stateful.generation]
max-examples = {stateful_examples}

# Every built-in check, with schemathesis's default expected statuses (also `--checks all`),
# but for one: an invalid body can also be over the request body limit (64 KiB, docs/api.md),
# which is refused with 413 before it is read (a long string breaking a `maxLength`).
[checks]
enabled = true

[checks.negative_data_rejection]
expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx",
]

[warnings]
fail-on = [{fail_on}]

# Bearer auth for operations whose OpenAPI `security` names the `HTTPBearer` scheme; the
# `ignored_auth` check still sends them without it and expects 401.
[auth.openapi.HTTPBearer]
bearer = "${{BULLPEN_FUZZ_KEY}}"

[dictionaries.seeded_task]
values = [{seeded_tasks}]

[dictionaries.seeded_run]
values = ["{tenant.run_id}"]

[dictionaries.doomed_workspace]
values = ["{tenant.doomed_workspace_id}"]

[dictionaries.seeded_provider]
values = ["{tenant.provider_id}"]

[dictionaries.seeded_route]
values = ["{tenant.route_id}"]

[dictionaries.seeded_routine]
values = [{_quoted(tenant.routine_ids)}]

[dictionaries.seeded_budget]
values = [{_quoted(tenant.budget_ids)}]

[dictionaries.seeded_mcp_server]
values = [{_quoted(tenant.mcp_server_ids)}]

[dictionaries.own_workspace]
values = ["{tenant.workspace_id}"]

[dictionaries.seeded_member]
values = ["{tenant.member_id}"]

[dictionaries.seeded_approval]
values = ["{tenant.approval_id}"]

[dictionaries.seeded_model]
values = ["fuzz-route"]

[parameters]
# The seeded agent: without it nearly every valid task creation is a 404 (no such agent).
"body.agent_id" = "${{BULLPEN_FUZZ_AGENT}}"
# Half of the valid cases name a seeded (cancelled) task or the run of the first, the rest
# random ids.
"path.task_id" = {{ dictionary = "seeded_task", probability = 0.5 }}
"path.run_id" = {{ dictionary = "seeded_run", probability = 0.5 }}
"path.provider_id" = {{ dictionary = "seeded_provider", probability = 0.5 }}
"path.route_id" = {{ dictionary = "seeded_route", probability = 0.5 }}
"path.routine_id" = {{ dictionary = "seeded_routine", probability = 0.5 }}
"path.budget_id" = {{ dictionary = "seeded_budget", probability = 0.5 }}
"path.approval_id" = {{ dictionary = "seeded_approval", probability = 0.5 }}
"path.mcp_server_id" = {{ dictionary = "seeded_mcp_server", probability = 0.5 }}
# The fuzzer's own workspace (renaming it harms nothing; DELETE gets the doomed one, below).
"path.workspace_id" = {{ dictionary = "own_workspace", probability = 0.5 }}
# A member of the fuzzer's workspace (not protected); the workspace to switch to or make a key in.
"path.user_id" = {{ dictionary = "seeded_member", probability = 0.5 }}
"body.workspace_id" = {{ dictionary = "own_workspace", probability = 0.5 }}
# The relay's `model`: half the time the seeded route, else whatever was generated (a 404).
"body.model" = {{ dictionary = "seeded_model", probability = 0.5 }}

# A workspace can only be deleted with a key of its own: the hooks send the doomed workspace's
# key with these requests.
[[operations]]
include-path = "/api/v1/workspaces/{{workspace_id}}"
include-method = "DELETE"
parameters = {{ "path.workspace_id" = {{ dictionary = "doomed_workspace", probability = 0.5 }} }}

# A server's test connects to the real MCP server and lists its tools: on a loaded 2-core
# machine that took more than the 2 s above (CI, 2026-12-06), so it gets longer.
[[operations]]
include-path = "/api/v1/mcp-servers/{{mcp_server_id}}/test"
include-method = "POST"
request-timeout = 10

[reports]
directory = "{report_dir}"

# Reproductions show what was sent: only credentials are masked (the default also masks any
# field named like "token" or "key", such as `max_tokens` and `Idempotency-Key`), and long
# problem details are not cut.
[output.sanitization]
keys-to-sanitize = ["authorization", "cookie", "set-cookie", "password", "current_password",
                    "new_password", "key"]
sensitive-markers = ["authorization", "password", "secret", "session"]

[output.truncation]
enabled = false
"""


async def _schemathesis(server: RunningServer, workdir: Path) -> tuple[int, str, dict[str, Any]]:
    """Run the CLI against the server; returns (exit code, console output, JSON report)."""
    async with serve_http(workdir / "mcp-calls.log") as mcp:
        return await _run(server, workdir, mcp.url)


async def _run(
    server: RunningServer, workdir: Path, mcp_url: str
) -> tuple[int, str, dict[str, Any]]:
    tenant = await _seed(server, mcp_url)
    config = workdir / "schemathesis.toml"
    backend = "sqlite" if server.settings.is_sqlite else "postgres"
    config.write_text(_config(tenant, workdir / "reports", backend))
    report_path = workdir / "report.json"
    log = workdir / "schemathesis.log"
    env = {
        **os.environ,
        "BULLPEN_FUZZ_KEY": tenant.key,
        "BULLPEN_FUZZ_AGENT": tenant.agent_id,
        "BULLPEN_FUZZ_PROTECTED_IDS": ",".join(tenant.protected_ids),
        "BULLPEN_FUZZ_DOOMED_WORKSPACE": tenant.doomed_workspace_id,
        "BULLPEN_FUZZ_OWN_WORKSPACE": tenant.workspace_id,
        "BULLPEN_FUZZ_DOOMED_KEY": tenant.doomed_key,
        "BULLPEN_FUZZ_EMAIL": server.boot.email,
        "BULLPEN_FUZZ_USER": tenant.user_id,
        "BULLPEN_FUZZ_BASE_URL": server.base_url,
        "BULLPEN_FUZZ_GATED_AGENT": tenant.gated_agent_id,
        "BULLPEN_FUZZ_MCP_URL": mcp_url,  # a real MCP server (tests/support/mcp_tools.py)
        "BULLPEN_FUZZ_PROVIDER": tenant.provider_id,  # the only provider a check may call
        **{f"BULLPEN_FUZZ_{verb}_INVITER": key for verb, key in tenant.inviters.items()},
        "HYPOTHESIS_STORAGE_DIRECTORY": str(workdir / ".hypothesis"),
        "NO_COLOR": "1",
        "PYTHONUNBUFFERED": "1",  # keep the output of a run killed at the time limit
    }
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(config),
            "run",
            f"{server.base_url}/openapi.json",
            "--checks",
            "all",
            "--mode",
            "all",
            "--phases",
            ",".join(PHASES),
            "--report",
            "json",
            "--report-json-path",
            str(report_path),
            "--no-color",
            *shlex.split(os.environ.get("BULLPEN_FUZZ_ARGS", "")),
            cwd=workdir,  # anything it writes (.hypothesis, caches) stays in tmp_path
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            await asyncio.wait_for(proc.wait(), RUN_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            partial = log.read_text("utf-8", errors="replace")
            pytest.fail(f"schemathesis ran over {RUN_TIMEOUT_S} s:\n{partial}")
    output = log.read_text("utf-8", errors="replace")
    assert report_path.exists(), f"schemathesis wrote no report:\n{output}"
    assert proc.returncode is not None
    return proc.returncode, output, json.loads(report_path.read_text())


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
async def test_schemathesis_finds_no_failures(server: RunningServer, tmp_path: Path) -> None:
    """All checks, positive+negative, all phases incl. stateful: 0 failures, no bad warnings."""
    assert schemathesis.__version__.split(".")[0] == "4", schemathesis.__version__
    code, output, report = await _schemathesis(server, tmp_path)
    dropped = tmp_path / "dropped-failures.jsonl"
    if dropped.exists():  # what the hooks' filter_failure excused, for the record
        counts: dict[str, int] = {}
        for line in dropped.read_text().splitlines():
            entry = json.loads(line)
            what = f"{entry['operation']}: {', '.join(entry['fields'])}"
            counts[what] = counts.get(what, 0) + 1
        print("excused 422s:", json.dumps(counts, indent=1))
    why = f"\n--- schemathesis output ---\n{output}"

    assert report["failures"] == [], why
    assert report["errors"] == [], why
    warned = {w: report["warnings"][w] for w in FAIL_ON_WARNINGS if report["warnings"].get(w)}
    assert not warned, f"warnings {warned}{why}"
    assert report["complete"] and report["stop_reason"] == "completed", why
    ops = report["operations"]
    assert ops["total"] > 0 and ops["tested"] == ops["selected"] == ops["total"], why
    assert ops["errored"] == 0 and ops["skipped"] == 0, why
    # Every phase ran: a skipped stateful phase means no links (declared or inferred) to follow.
    statuses = {name: report["phases"][name]["status"] for name in PHASES}
    assert statuses == dict.fromkeys(PHASES, "success"), f"phases {statuses}{why}"
    assert code == 0, why


async def test_openapi_declares_links(server: RunningServer) -> None:
    """BI-1's stateful run follows OpenAPI links: each 201 links to the created resource."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/openapi.json") as resp,
    ):
        assert resp.status == 200
        doc = await resp.json()
    operation_ids = {
        op.get("operationId") for item in doc["paths"].values() for op in item.values()
    }
    creators = []
    missing = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            created = op.get("responses", {}).get("201")
            if created is None:
                continue
            creators.append(f"{method.upper()} {path}")
            links = created.get("links") or {}
            if not links:
                missing.append(f"{method.upper()} {path}")
            for name, link in links.items():
                assert link.get("operationId") in operation_ids or "operationRef" in link, (
                    f"{method.upper()} {path}: link {name} names no known operation"
                )
    assert creators, "no operation answers 201"
    assert not missing, f"these 201 responses declare no OpenAPI links: {missing}"
