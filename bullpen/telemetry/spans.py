"""Bullpen's spans, named and attributed after the OpenTelemetry GenAI semantic conventions.

    {METHOD} {route}             SERVER    every HTTP request (`bullpen.api.tracing`)
    invoke_agent {agent}         INTERNAL  one delivery of a run, in its worker
      chat {requested model}     INTERNAL  one LLM call through the gateway (agents and relay)
        chat {provider model}    CLIENT    each provider attempt within it (fallback)
      execute_tool {tool}        INTERNAL  each tool call of a step

A span holds ids, names, counts, timings and error types: never a header or an error's text
(which may quote what a provider was sent); an LLM call's messages and answer (the tool calls
and tool results in them included) only when the operator asks for them (`capture`:
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true). LLM call spans are made when the
call has ended, from the gateway's own record of it (`Call` and its `Attempt`s): the router's
per-chunk path does no tracing work at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bullpen.domain.runs import ClaimedRun, RunOutcome
from bullpen.domain.trace import TRACE_PARENT, TRACE_PARENT_MAX
from bullpen.gateway.router import Attempt, Call

__all__ = ["Attrs", "Tracing"]

Attrs = dict[str, Any]

# The GenAI semantic conventions' attributes (gen_ai.*), and Bullpen's own.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the name older backends know the provider attribute by
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHED_TOKENS = "gen_ai.usage.cache_read.input_tokens"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TTFT_MS = "bullpen.ttft_ms"  # time to the first content token, from the call's start
COST_USD = "bullpen.cost_usd"

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Makes Bullpen's spans; one per process, built by `bullpen.telemetry.setup`."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        capture: bool = False,
        flush: Callable[[], bool] = lambda: True,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self.tracer = tracer
        self.capture = capture  # prompts and completions go into LLM call spans
        self.flush = flush  # export what has ended now (tests, shutdown)
        self.close = close

    # Context ---------------------------------------------------------------------------------

    @staticmethod
    def extract(carrier: Mapping[str, str]) -> otel_context.Context | None:
        """The remote parent a W3C `traceparent` (and `tracestate`) names; None if none is valid."""
        if not carrier.get("traceparent"):
            return None
        ctx = _PROPAGATOR.extract(carrier)
        return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None

    @staticmethod
    def traceparent(span: Span) -> str | None:
        """The W3C `traceparent` that continues `span`'s trace as its child."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        value = carrier.get("traceparent")
        return value if value is not None and len(value) <= TRACE_PARENT_MAX else None

    @contextmanager
    def current(self, span: Span) -> Iterator[None]:
        """`span` is the parent of what starts in this block, and of runs it enqueues."""
        token = otel_context.attach(trace.set_span_in_context(span))
        parent = TRACE_PARENT.set(self.traceparent(span))
        try:
            yield
        finally:
            TRACE_PARENT.reset(parent)
            otel_context.detach(token)

    # Runs ------------------------------------------------------------------------------------

    def start_run(self, run: ClaimedRun) -> Span:
        """The span of one delivery of `run`, continuing the trace it was enqueued under."""
        parent = self.extract({"traceparent": run.trace_parent}) if run.trace_parent else None
        return self.tracer.start_span(
            f"invoke_agent {run.agent_name}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                OPERATION: "invoke_agent",
                AGENT_NAME: run.agent_name,
                AGENT_ID: str(run.agent_id),
                "bullpen.agent.adapter": run.agent_adapter,
                "bullpen.workspace.id": str(run.workspace_id),
                "bullpen.task.id": str(run.task_id),
                "bullpen.task.key": run.task_key,
                "bullpen.run.id": str(run.id),
                "bullpen.run.attempt": run.attempt,
            },
        )

    @staticmethod
    def end_run(span: Span, outcome: RunOutcome | None) -> None:
        """Record how the delivery ended (None: released or its lease lost) and end its span."""
        if outcome is None:
            span.set_attribute("bullpen.run.status", "interrupted")
        else:
            attrs: Attrs = {"bullpen.run.status": outcome.status.value}
            if outcome.transient:
                attrs["bullpen.run.retried"] = True
            _put(attrs, PROVIDER, outcome.provider)
            _put(attrs, RESPONSE_MODEL, outcome.model)
            _put(attrs, INPUT_TOKENS, outcome.input_tokens)
            _put(attrs, OUTPUT_TOKENS, outcome.output_tokens)
            _put(attrs, TTFT_MS, outcome.ttft_ms)
            _put(attrs, COST_USD, outcome.cost_usd)
            span.set_attributes(attrs)
            if outcome.error is not None:
                kind = outcome.error_code or "error"
                span.set_attribute(ERROR_TYPE, kind)
                span.set_status(Status(StatusCode.ERROR, kind))
        span.end()

    # LLM calls -------------------------------------------------------------------------------

    def llm_call(
        self,
        call: Call,
        *,
        requested: str,
        started_ns: int,
        request: Mapping[str, Any] | None = None,
        output: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
        attributes: Attrs | None = None,
        parent: otel_context.Context | None = None,
    ) -> None:
        """Record an ended gateway call: its span and one child span per provider attempt.
        With `capture`, its messages (`request`'s) and its answer (`output`, an assistant
        message in OpenAI's shape) too."""
        now_ns = time.time_ns()
        to_ns = _loop_clock(now_ns)
        attrs: Attrs = {OPERATION: "chat", REQUEST_MODEL: requested, **(attributes or {})}
        if request is not None and isinstance(request.get("max_tokens"), int):
            attrs[REQUEST_MAX_TOKENS] = request["max_tokens"]
        attrs["bullpen.gateway.attempts"] = len(call.attempts)
        served = call.served_by
        if served is not None:
            attrs[PROVIDER] = attrs[SYSTEM] = served.provider.name
            attrs[RESPONSE_MODEL] = call.model or served.model
            attrs[INPUT_TOKENS] = call.input_tokens
            attrs[OUTPUT_TOKENS] = call.output_tokens
            if call.cached_input_tokens:
                attrs[CACHED_TOKENS] = call.cached_input_tokens
            if call.usage_estimated:
                attrs["bullpen.usage.estimated"] = True
            _put(attrs, COST_USD, call.cost_usd)
            if call.ttft_s is not None:
                attrs[TTFT_MS] = round(call.ttft_s * 1000, 3)
            if call.finish_reason:
                attrs[FINISH_REASONS] = (call.finish_reason,)
        if self.capture:
            messages = request.get("messages") if request is not None else None
            if isinstance(messages, list):
                attrs[INPUT_MESSAGES] = _messages(messages)
            if output is not None:
                attrs[OUTPUT_MESSAGES] = _messages([output], call.finish_reason or "error")
        span = self.tracer.start_span(
            f"chat {requested}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=started_ns,
        )
        kind = _error_type(error)
        last = call.attempts[-1] if call.attempts else None
        if kind is None and last is not None and last.outcome != "ok":
            kind = last.reason or last.outcome  # no provider served it, or it broke off
        if kind is not None:
            span.set_attribute(ERROR_TYPE, kind)
            span.set_status(Status(StatusCode.ERROR, kind))
        inside = trace.set_span_in_context(span)
        for attempt in call.attempts:
            self._attempt(attempt, inside, to_ns, now_ns)
        span.end(end_time=now_ns)

    def observer(
        self,
        requested: str,
        attributes: Attrs,
        request: Mapping[str, Any] | None = None,
        output: Callable[[], Mapping[str, Any]] | None = None,
    ) -> Callable[[Call], None]:
        """What records a relayed call when it ends, under the span current now (its request);
        `output` gives the answer as it ended (read only with `capture`)."""
        parent = otel_context.get_current()
        started_ns = time.time_ns()

        def observe(call: Call) -> None:
            self.llm_call(
                call,
                requested=requested,
                started_ns=started_ns,
                request=request,
                output=output() if output is not None and self.capture else None,
                attributes=attributes,
                parent=parent,
            )

        return observe

    def _attempt(
        self,
        attempt: Attempt,
        parent: otel_context.Context,
        to_ns: Callable[[float], int],
        now_ns: int,
    ) -> None:
        start = to_ns(attempt.started) if attempt.started else now_ns
        end = start + int((attempt.duration_ms or 0.0) * 1e6)
        attrs: Attrs = {
            OPERATION: "chat",
            PROVIDER: attempt.provider,
            SYSTEM: attempt.provider,
            REQUEST_MODEL: attempt.model,
            "bullpen.gateway.outcome": attempt.outcome,
        }
        _put(attrs, INPUT_TOKENS, attempt.input_tokens)
        _put(attrs, OUTPUT_TOKENS, attempt.output_tokens)
        _put(attrs, TTFT_MS, attempt.ttft_ms)
        span = self.tracer.start_span(
            f"chat {attempt.model}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=start,
        )
        if attempt.outcome != "ok":
            reason = attempt.reason or attempt.outcome
            span.set_attribute(ERROR_TYPE, reason)
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end(end_time=min(max(end, start), now_ns))

    # Tools -----------------------------------------------------------------------------------

    def start_tools(self, step: int, calls: Iterable[tuple[str, str, bool]]) -> list[Span]:
        """One span per tool call (id, name, whether an MCP server's) of a step, started
        together."""
        return [
            self.tracer.start_span(
                f"execute_tool {name}",
                kind=SpanKind.INTERNAL,
                attributes={
                    OPERATION: "execute_tool",
                    TOOL_NAME: name,
                    TOOL_CALL_ID: call_id,
                    # Built-in tools are functions Bullpen runs; MCP tools reach other systems.
                    TOOL_TYPE: "extension" if mcp else "function",
                    "bullpen.tool.source": "mcp" if mcp else "builtin",
                    "bullpen.tool.step": step,
                },
            )
            for call_id, name, mcp in calls
        ]

    @staticmethod
    def end_tools(
        spans: Sequence[Span], results: Sequence[str] | None, error: BaseException | None = None
    ) -> None:
        """End a step's tool spans: a result starting `error:` is the model's tool error."""
        kind = _error_type(error)
        for index, span in enumerate(spans):
            result = results[index] if results is not None and index < len(results) else None
            failed = kind or (
                "tool_error" if result is None or result.startswith("error:") else None
            )
            if failed is not None:
                span.set_attribute(ERROR_TYPE, failed)
                span.set_status(Status(StatusCode.ERROR, failed))
            span.end()


def _messages(messages: Iterable[Any], finish_reason: str | None = None) -> str:
    """OpenAI chat messages as the GenAI conventions' message list (JSON): a role and parts
    (`text`, `tool_call`, `tool_call_response`); an output message has its finish reason."""
    shaped: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        parts: list[dict[str, Any]] = []
        content = message.get("content")
        if message.get("role") == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": content,
                }
            )
        elif isinstance(content, str):
            if content:
                parts.append({"type": "text", "content": content})
        elif isinstance(content, list):  # content parts: their text
            for piece in content:
                if isinstance(piece, Mapping) and isinstance(piece.get("text"), str):
                    parts.append({"type": "text", "content": piece["text"]})
        for tool_call in message.get("tool_calls") or ():
            function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(
                    {
                        "type": "tool_call",
                        "id": tool_call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                    }
                )
        item: dict[str, Any] = {"role": message.get("role"), "parts": parts}
        if finish_reason is not None:
            item["finish_reason"] = finish_reason
        shaped.append(item)
    return orjson.dumps(shaped).decode()


def _put(attrs: Attrs, key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def _error_type(error: BaseException | None) -> str | None:
    """A failure's type for `error.type`: a Bullpen error's slug, else the class name."""
    if error is None:
        return None
    slug = getattr(error, "slug", None)
    return slug if isinstance(slug, str) else type(error).__qualname__


def _loop_clock(now_ns: int) -> Callable[[float], int]:
    """Turns the event loop's clock (what the gateway times attempts with) into epoch ns."""
    try:
        now_loop = asyncio.get_running_loop().time()
    except RuntimeError:
        now_loop = time.monotonic()
    return lambda t: now_ns - int((now_loop - t) * 1e9)
