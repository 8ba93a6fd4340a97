"""Traces exported over OTLP/HTTP by real processes (issue 24): `bullpen up` without a worker
and a `bullpen worker`, on one PostgreSQL database, turned on by the standard `OTEL_*`
variables only, export to a receiver in this test (a real HTTP server on 127.0.0.1 that decodes
the protobuf requests as a collector would). A task created with a client's `traceparent` is
traced in both processes under that one trace id; the caller's API key is in no request, and
neither is the prompt (message capture is off by default)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from bullpen.app import open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings
from tests.support.canary import encodings
from tests.support.cluster import workers
from tests.support.processes import bullpen_up, free_port, process_env
from tests.support.servers import FAST_SIM


@dataclass
class Received:
    """One span as the receiver decoded it, with its process's resource."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class Receiver:
    """What an OTLP/HTTP traces endpoint was sent."""

    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    spans: list[Received] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 (`/v1/traces`, protobuf)."""
    got = Receiver()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        got.bodies.append(body)
        got.content_types.add(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.spans.append(
                        Received(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            resource=resource,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got.url = f"http://127.0.0.1:{port}"
    try:
        yield got
    finally:
        await runner.cleanup()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["postgres"])
async def test_api_and_worker_processes_export_one_trace_over_otlp(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    async with receiver() as rx:
        async with open_store(settings) as store:
            boot = await ensure_bootstrap(
                store, load_secret(settings.secret_key, settings.data_dir), utcnow
            )
        assert boot.api_key is not None
        env = {
            k: v for k, v in process_env(settings, **FAST_SIM).items() if not k.startswith("OTEL_")
        }
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=rx.url,  # all it takes to turn tracing on
            OTEL_BSP_SCHEDULE_DELAY="100",
            NO_PROXY="127.0.0.1",
        )
        port = free_port()
        auth = {"Authorization": f"Bearer {boot.api_key}"}
        with workers(env) as pool:
            pool.start(1)
            with bullpen_up({**env, "BULLPEN_WORKER_ENABLED": "false"}, port):
                base = f"http://127.0.0.1:{port}"
                async with http.post(
                    f"{base}/api/v1/tasks",
                    json={"prompt": "Summarise the quarter", "agent_id": str(boot.agent_id)},
                    headers={**auth, "traceparent": f"00-{trace_id}-{client_span}-01"},
                ) as made:
                    assert made.status == 201, await made.text()
                    task_id = (await made.json())["id"]
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    async with http.get(f"{base}/api/v1/tasks/{task_id}", headers=auth) as got:
                        status = (await got.json())["status"]
                    names = {s.name for s in rx.spans if s.trace_id == trace_id}
                    if status == "done" and {"POST /api/v1/tasks", "invoke_agent demo"} <= names:
                        break
                    await asyncio.sleep(0.1)
                assert status == "done"

    assert rx.content_types == {"application/x-protobuf"}
    traced = [s for s in rx.spans if s.trace_id == trace_id]
    [create] = [s for s in traced if s.name == "POST /api/v1/tasks"]
    [run] = [s for s in traced if s.name == "invoke_agent demo"]
    [chat] = [s for s in traced if s.name.startswith("chat ") and s.parent_id == run.span_id]
    assert create.parent_id == client_span
    assert run.parent_id == create.span_id
    # Two processes, one trace: the worker's spans come from the worker process.
    assert run.resource["service.instance.id"].endswith(f":{pool.procs[0].pid}")
    assert create.resource["service.instance.id"] != run.resource["service.instance.id"]
    assert create.resource["service.name"] == run.resource["service.name"] == "bullpen"
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["bullpen.run.status"] == "done"
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert chat.attributes["gen_ai.usage.output_tokens"] == FAST_SIM["sim_response_tokens"]
    sent = b"".join(rx.bodies)
    for form in encodings(boot.api_key):
        assert form.encode() not in sent
    # Message capture is off unless asked for: no prompt, no answer.
    assert b"Summarise the quarter" not in sent
    assert not any("gen_ai.input.messages" in s.attributes for s in rx.spans)
    assert not any("gen_ai.output.messages" in s.attributes for s in rx.spans)
