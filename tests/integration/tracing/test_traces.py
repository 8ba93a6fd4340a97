"""Traces across an API and a worker (issue 24): two Bullpen services on one PostgreSQL
database, each with its own tracer provider and in-memory exporter, as two processes would be.

One task, created with a client's `traceparent`, runs an `llm` agent on a route whose first
provider fails (503), so each LLM call falls back; the scripted model calls `comment` and an
MCP server's `add` (a real SDK server over streamable HTTP), then `finish`. Its spans must
form one tree in the client's trace: the API's request span, the worker's run span under it,
and under that each LLM call with its two provider attempts and each tool call, with the
GenAI attributes; with message capture turned on, each LLM call's messages and answer. A
relayed call carries the caller's key id. The provider's key, the caller's API key and the
MCP server's header (canaries) appear in no span of either service.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from bullpen.app import Services, build, open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings
from bullpen.simulator.provider import SimConfig, SimulatedProvider
from bullpen.store.tables import runs
from tests.support.canary import encodings
from tests.support.db import rows
from tests.support.http import call
from tests.support.mcp_tools import serve_http
from tests.support.servers import RunningServer, start_server

CANARY = "sk-canary-" + secrets.token_hex(16)
TRACE_ID = secrets.token_hex(16)
CLIENT_SPAN = secrets.token_hex(8)
MCP_CANARY = "Bearer mcp-canary-" + secrets.token_hex(16)
SCRIPT = [
    {
        "tool_calls": [
            {"name": "comment", "arguments": {"body": "looking into it"}},
            {"name": "web__add", "arguments": {"a": 2, "b": 3}},  # an MCP server's tool
        ]
    },
    {"tool_calls": [{"name": "finish", "arguments": {"result": "three metrics"}}]},
]
SYSTEM = f"You analyse.\n<sim-script>{json.dumps(SCRIPT)}</sim-script>"
PROMPT = "Analyze this dataset and extract key metrics"


@asynccontextmanager
async def api_and_worker(
    settings: Settings,
) -> AsyncIterator[tuple[RunningServer, InMemorySpanExporter, Services, InMemorySpanExporter]]:
    """An API without a worker on a socket, and a worker without an API, each traced."""
    async with open_store(settings) as store:
        boot = await ensure_bootstrap(
            store, load_secret(settings.secret_key, settings.data_dir), utcnow
        )
    api_spans, worker_spans = InMemorySpanExporter(), InMemorySpanExporter()
    capture = {"otel_capture_message_content": True}  # prompts and answers in LLM call spans
    api_settings = settings.model_copy(update={"worker_enabled": False, **capture})
    worker_settings = settings.model_copy(
        update={"worker_enabled": True, "poll_interval_s": 0.1, **capture}
    )
    async with build(worker_settings, span_exporter=worker_spans) as worker:
        srv, task, base_url = await start_server(api_settings, span_exporter=api_spans)
        try:
            api = RunningServer(base_url, srv.config.app.state.services, boot, api_settings)
            assert api.services.worker is None and worker.worker is not None
            yield api, api_spans, worker, worker_spans
        finally:
            srv.should_exit = True
            await asyncio.wait_for(task, 15)


@pytest.fixture
async def sims() -> AsyncIterator[list[SimulatedProvider]]:
    """`primary` (it requires the canary key, and fails with 503) and `backup`."""
    base = {"ttft_ms": 5, "tokens_per_second": 2000, "response_tokens": 8, "models": ("m",)}
    started = [
        SimulatedProvider(SimConfig(**base, api_key=CANARY, fault="503")),  # type: ignore[arg-type]
        SimulatedProvider(SimConfig(**base)),  # type: ignore[arg-type]
    ]
    for sim in started:
        await sim.__aenter__()
    try:
        yield started
    finally:
        for sim in started:
            await sim.__aexit__(None, None, None)


async def configure(
    http: aiohttp.ClientSession, api: RunningServer, sims: list[SimulatedProvider], mcp_url: str
) -> str:
    """Providers `primary` and `backup`, route `smart` over both, MCP server `web` (its
    header a canary), a scripted agent on the route allowed `web`'s `add`."""
    server = {
        "name": "web",
        "transport": "http",
        "url": mcp_url,
        "headers": {"Authorization": MCP_CANARY},
        "timeout_s": 5.0,
    }
    assert (await call(http, api, "POST", "/api/v1/mcp-servers", body=server)).status == 201
    for name, sim, key in (("primary", sims[0], CANARY), ("backup", sims[1], None)):
        body: dict[str, Any] = {
            "name": name,
            "base_url": sim.base_url,
            "models": [{"name": "m", "input_per_mtok": 3.0, "output_per_mtok": 15.0}],
        }
        if key:
            body["api_key"] = key
        assert (await call(http, api, "POST", "/api/v1/providers", body=body)).status == 201
    chain = [{"provider": "primary", "model": "m"}, {"provider": "backup", "model": "m"}]
    made = await call(
        http, api, "POST", "/api/v1/model-routes", body={"name": "smart", "chain": chain}
    )
    assert made.status == 201, made.text
    agent = await call(
        http,
        api,
        "POST",
        "/api/v1/agents",
        body={
            "name": "analyst",
            "title": "Analyst",
            "config": {
                "model": "smart",
                "system_prompt": SYSTEM,
                "mcp": [{"server": "web", "tools": ["add"]}],
            },
        },
    )
    assert agent.status == 201, agent.text
    return str(agent.body["id"])


async def wait_done(http: aiohttp.ClientSession, api: RunningServer, task_id: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        task = (await call(http, api, "GET", f"/api/v1/tasks/{task_id}")).body
        if task["status"] in ("done", "failed") or time.monotonic() > deadline:
            assert task["status"] == "done", task
            return
        await asyncio.sleep(0.05)


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    own = parent.get_span_context().span_id
    return sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == own),
        key=lambda s: s.start_time or 0,
    )


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_run_is_one_trace_across_api_and_worker(
    settings: Settings,
    http: aiohttp.ClientSession,
    sims: list[SimulatedProvider],
    tmp_path: Path,
) -> None:
    async with (
        serve_http(tmp_path / "mcp-calls.log") as mcp,
        api_and_worker(settings) as (api, api_spans, worker, worker_spans),
    ):
        key_id = str((await api.services.auth.authenticate_key(api.boot.api_key or "")).api_key_id)
        agent_id = await configure(http, api, sims, mcp.url)
        traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
        created = await call(
            http,
            api,
            "POST",
            "/api/v1/tasks",
            headers={**api.auth, "traceparent": traceparent},
            body={"prompt": PROMPT, "agent_id": agent_id},
        )
        assert created.status == 201, created.text
        await wait_done(http, api, created.body["id"])
        shown = await call(http, api, "GET", f"/api/v1/tasks/{created.body['id']}")
        assert shown.body["run"]["trace_id"] == TRACE_ID
        relay = {
            "model": "smart",
            "messages": [{"role": "user", "content": "Hello"}],
            "stream": True,
        }
        async with http.post(
            api.base_url + "/v1/chat/completions", json=relay, headers=api.auth
        ) as resp:
            assert resp.status == 200
            frames = await resp.text()
        assert frames.endswith("data: [DONE]\n\n")
        relay_text = "".join(
            choice["delta"].get("content") or ""
            for line in frames.splitlines()
            if line.startswith("data: {")
            for choice in json.loads(line[6:])["choices"]
        )
        assert relay_text
        assert api.services.tracing is not None and worker.tracing is not None
        api.services.tracing.flush()
        worker.tracing.flush()
    from_api, from_worker = api_spans.get_finished_spans(), worker_spans.get_finished_spans()

    # The API: the client's trace continues in the request's span.
    create = one(from_api, "POST /api/v1/tasks")
    assert create.kind is SpanKind.SERVER
    assert f"{create.context.trace_id:032x}" == TRACE_ID
    assert create.parent is not None and f"{create.parent.span_id:016x}" == CLIENT_SPAN
    assert create.parent.is_remote
    assert create.attributes is not None
    assert create.attributes["http.route"] == "/api/v1/tasks"
    assert create.attributes["http.response.status_code"] == 201
    assert create.attributes["bullpen.api_key.id"] == key_id
    routed = [s for s in from_api if s.name == "GET /api/v1/tasks/{task_id}"]
    assert routed and all(s.context.trace_id != create.context.trace_id for s in routed)

    # The worker: one delivery, under the request that created the run, in the same trace.
    run = one(from_worker, "invoke_agent analyst")
    assert run.parent is not None and run.parent.span_id == create.context.span_id
    assert {s.context.trace_id for s in from_worker} == {create.context.trace_id}
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.id"] == agent_id
    assert run.attributes["bullpen.task.id"] == created.body["id"]
    assert run.attributes["bullpen.run.status"] == "done"
    assert run.attributes["gen_ai.provider.name"] == "backup"
    assert run.attributes["bullpen.cost_usd"] > 0
    assert run.status.status_code is StatusCode.UNSET

    steps = children(from_worker, run)
    assert [s.name for s in steps][:1] == ["chat smart"]
    assert {s.name for s in steps[1:3]} == {"execute_tool comment", "execute_tool web__add"}
    steps = [steps[0], *sorted(steps[1:3], key=lambda s: s.name), *steps[3:]]
    assert [s.name for s in steps] == [
        "chat smart",
        "execute_tool comment",
        "execute_tool web__add",
        "chat smart",
        "execute_tool finish",
    ]
    mcp_call = steps[2].attributes
    assert mcp_call is not None
    assert (mcp_call["bullpen.tool.source"], mcp_call["gen_ai.tool.type"]) == ("mcp", "extension")
    assert steps[2].status.status_code is StatusCode.UNSET
    steps = [steps[0], steps[1], steps[3], steps[4]]  # the LLM calls and the built-in tools
    for chat in (steps[0], steps[2]):
        attrs = chat.attributes
        assert attrs is not None
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "smart"
        assert attrs["gen_ai.response.model"] == "m"
        assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "backup"
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["gen_ai.response.finish_reasons"] == ("tool_calls",)
        assert attrs["bullpen.ttft_ms"] > 0
        assert attrs["bullpen.cost_usd"] == pytest.approx(
            (attrs["gen_ai.usage.input_tokens"] * 3 + attrs["gen_ai.usage.output_tokens"] * 15)
            / 1e6
        )
        sent = json.loads(attrs["gen_ai.input.messages"])
        assert sent[:2] == [
            {"role": "system", "parts": [{"type": "text", "content": SYSTEM}]},
            {"role": "user", "parts": [{"type": "text", "content": PROMPT}]},
        ]
        failed, served = children(from_worker, chat)
        assert (failed.name, failed.kind, served.name, served.kind) == (
            "chat m",
            SpanKind.CLIENT,
            "chat m",
            SpanKind.CLIENT,
        )
        assert failed.attributes is not None and served.attributes is not None
        assert failed.attributes["gen_ai.provider.name"] == "primary"
        assert failed.attributes["error.type"] == "http-503"
        assert failed.status.status_code is StatusCode.ERROR
        assert served.attributes["gen_ai.provider.name"] == "backup"
        assert served.attributes["bullpen.gateway.outcome"] == "ok"
        assert failed.end_time is not None and served.start_time is not None
        assert failed.end_time <= served.start_time
    assert steps[0].attributes is not None and steps[2].attributes is not None
    [answered] = json.loads(steps[0].attributes["gen_ai.output.messages"])
    assert answered["role"] == "assistant" and answered["finish_reason"] == "tool_calls"
    called, added = answered["parts"]
    assert (called["type"], called["name"], added["name"]) == ("tool_call", "comment", "web__add")
    assert json.loads(called["arguments"]) == {"body": "looking into it"}
    # The second call was sent the first step's tool calls and their results.
    later = json.loads(steps[2].attributes["gen_ai.input.messages"])
    assert later[-2:] == [
        {
            "role": "tool",
            "parts": [
                {"type": "tool_call_response", "id": called["id"], "response": "comment added"}
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": added["id"], "response": "5"}],
        },
    ]
    for tool, name in ((steps[1], "comment"), (steps[3], "finish")):
        assert tool.attributes is not None
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.attributes["gen_ai.tool.name"] == name
        assert str(tool.attributes["gen_ai.tool.call.id"])
        assert tool.status.status_code is StatusCode.UNSET

    # The relay: its call under its request, with the caller's key id.
    request = one(from_api, "POST /v1/chat/completions")
    [relayed] = children(from_api, request)
    assert relayed.name == "chat smart"
    assert relayed.attributes is not None and request.attributes is not None
    assert relayed.attributes["bullpen.api_key.id"] == key_id
    assert request.attributes["bullpen.api_key.id"] == key_id
    assert relayed.attributes["gen_ai.provider.name"] == "backup"
    assert [s.attributes["gen_ai.provider.name"] for s in children(from_api, relayed)] == [
        "primary",
        "backup",
    ]
    [streamed] = json.loads(relayed.attributes["gen_ai.output.messages"])
    assert streamed["parts"] == [{"type": "text", "content": relay_text}]

    # No secret in any span, prompts and answers recorded: the provider's key, the caller's key.
    assert api.boot.api_key
    dumped = "".join(s.to_json() for s in (*from_api, *from_worker))
    for secret in (CANARY, api.boot.api_key, MCP_CANARY):
        for form in encodings(secret):
            assert form not in dumped


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_with_tracing_off_a_traceparent_is_neither_followed_nor_stored(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert server.services.tracing is None
    assert server.services.worker is not None
    created = await call(
        http,
        server,
        "POST",
        "/api/v1/tasks",
        headers={**server.auth, "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
        body={"prompt": "Analyze this", "agent_id": str(server.boot.agent_id)},
    )
    assert created.status == 201, created.text
    [run] = await rows(server, sa.select(runs.c.trace_parent, runs.c.status))
    assert run.trace_parent is None
    shown = await call(http, server, "GET", f"/api/v1/tasks/{created.body['id']}")
    assert shown.body["run"]["trace_id"] is None
