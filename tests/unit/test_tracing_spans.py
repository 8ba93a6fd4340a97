"""The request span's edge cases (a bad `traceparent`, a 5xx, a crash, who called) and the
LLM call span of a call no provider served, on an in-memory exporter (no socket)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import Message, Receive, Scope, Send

from bullpen.api.tracing import traced
from bullpen.domain.access import Role
from bullpen.domain.principal import Principal
from bullpen.domain.trace import TRACE_PARENT
from bullpen.gateway.router import Attempt, Call
from bullpen.telemetry.spans import Tracing

SECRET = "bp_live_" + "s" * 32  # pragma: allowlist secret


@pytest.fixture
def spans() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Tracing(provider.get_tracer("test")), exporter
    provider.shutdown()


def scope(path: str = "/api/v1/tasks", **headers: str) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"token=" + SECRET.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def app(status: int, *, principal: Principal | None = None, crash: bool = False) -> object:
    async def serve(scope: Scope, _receive: Receive, send: Send) -> None:
        assert TRACE_PARENT.get() is not None  # runs enqueued here continue the trace
        if principal is not None:
            scope["state"]["principal"] = principal
        if crash:
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return serve


async def sent(message: Message) -> None:
    pass


async def test_a_malformed_traceparent_starts_a_trace_of_its_own(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    key = Principal(uuid.uuid4(), None, uuid.uuid4(), Role.MEMBER, "api_key")
    await traced(
        tracing,
        app(201, principal=key),  # type: ignore[arg-type]
        scope(traceparent="00-zz-not-a-trace", authorization=f"Bearer {SECRET}"),
        receive,
        sent,
    )
    [span] = exporter.get_finished_spans()
    assert span.parent is None and span.kind is SpanKind.SERVER
    assert span.name == "POST"  # no route matched in this bare app: the method only
    assert span.attributes is not None
    assert span.attributes["http.response.status_code"] == 201
    assert span.attributes["bullpen.api_key.id"] == str(key.api_key_id)
    assert span.attributes["bullpen.workspace.id"] == str(key.workspace_id)
    assert span.status.status_code is StatusCode.UNSET
    assert SECRET not in span.to_json()  # neither the header nor the query string
    assert TRACE_PARENT.get() is None  # reset after the request


async def test_a_5xx_and_a_crash_are_errors(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    parent = f"00-{'a' * 32}-{'b' * 16}-01"
    await traced(tracing, app(503), scope(traceparent=parent), receive, sent)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await traced(tracing, app(200, crash=True), scope(), receive, sent)  # type: ignore[arg-type]
    unavailable, crashed = exporter.get_finished_spans()
    assert f"{unavailable.context.trace_id:032x}" == "a" * 32
    assert unavailable.status.status_code is StatusCode.ERROR
    assert unavailable.attributes is not None
    assert unavailable.attributes["error.type"] == "503"
    assert crashed.status.status_code is StatusCode.ERROR
    assert crashed.attributes is not None
    assert crashed.attributes["error.type"] == "RuntimeError"
    assert "boom" not in crashed.to_json()  # an error's text stays out


def test_a_call_no_provider_served_is_an_error_with_every_attempt(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    call = Call(
        attempts=[
            Attempt("a", "m", "skipped", "breaker-open", started=1.0),
            Attempt("b", "m", "failed", "ttft-timeout", detail=SECRET, duration_ms=5, started=2.0),
        ]
    )
    tracing.llm_call(call, requested="smart", started_ns=1)
    finished: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    by_name = {s.name: s for s in finished}
    chat = by_name["chat smart"]
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == "ttft-timeout"
    assert "gen_ai.provider.name" not in chat.attributes  # nobody served it
    attempts = [s for s in finished if s is not chat]
    assert [(s.attributes or {}).get("error.type") for s in attempts] == [
        "breaker-open",
        "ttft-timeout",
    ]
    assert all(s.parent is not None and s.parent.span_id == chat.context.span_id for s in attempts)
    assert SECRET not in "".join(s.to_json() for s in finished)  # an attempt's detail stays out
