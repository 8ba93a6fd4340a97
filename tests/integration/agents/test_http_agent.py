"""The `http` (webhook) adapter against real aiohttp servers on 127.0.0.1 sockets.

The servers check each request's signature themselves, stream NDJSON, SSE or JSON answers,
fail, stall and redirect. DNS is the one stubbed edge: a stub resolver makes test names
resolve to loopback. Only loopback is ever a connect target here; refusals of other private
ranges (metadata, 10/8, ...) are covered without a connect in tests/unit/test_outbound.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import SecretStr, ValidationError

from bullpen.agents.base import Related, RunContext, TaskBrief
from bullpen.agents.http import (
    HttpAdapter,
    HttpAgentConfig,
    WebhookFailed,
    WebhookTimeout,
    public_config,
    stored_config,
)
from bullpen.domain.events import EventKind
from bullpen.domain.runs import ClaimedRun
from bullpen.domain.status import RunStatus
from bullpen.domain.trace import TRACE_PARENT
from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.outbound import OutboundAllow, OutboundRefused
from bullpen.security.secrets import SecretBox

CANARY = "whsec-canary-7Qx2vLm9Rt4Kp8Zb"  # the signing secret; must never leak
BOX = SecretBox(b"m" * 40)
LOCAL = OutboundAllow.parse("127.0.0.1/32")
NOBODY = OutboundAllow()
AGENT = uuid.uuid4()
TASK = uuid.uuid4()
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    """One request as the webhook server saw it."""

    path: str
    headers: dict[str, str]
    body: bytes
    signed: bool  # the signature matched the server's own HMAC of timestamp and body


@dataclass
class Webhook:
    """A webhook server: records every request, then runs the handler set for its path."""

    port: int = 0
    handlers: dict[str, Handler] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        stamp = request.headers.get("Bullpen-Timestamp", "")
        expected = hmac.new(CANARY.encode(), stamp.encode() + b"." + body, hashlib.sha256)
        signed = hmac.compare_digest(
            request.headers.get("Bullpen-Signature", ""), "v1=" + expected.hexdigest()
        )
        self.received.append(Received(request.path, dict(request.headers), body, signed))
        try:
            return await self.handlers[request.path](request)
        except asyncio.CancelledError:  # the client went away mid-answer
            self.disconnected.set()
            raise


@pytest.fixture
async def hook() -> AsyncIterator[Webhook]:
    server = Webhook()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def adapter() -> AsyncIterator[HttpAdapter]:
    async with HttpAdapter(BOX, LOCAL) as adapter:
        yield adapter


class Recorder:
    """The run's event sink, as the adapter sees it."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.emitted: list[tuple[EventKind, dict[str, Any]]] = []
        self.first_text = asyncio.Event()

    def text(self, delta: str) -> None:
        self.texts.append(delta)
        self.first_text.set()

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        self.emitted.append((kind, data))


class StubDns(AbstractResolver):
    """DNS from a table (names only it knows); remembers what it was asked."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        address = self.table[host]
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        pass


def config(url: str, *, allow: OutboundAllow = LOCAL, **options: Any) -> dict[str, Any]:
    """A stored config, made the way the API makes it."""
    body = HttpAgentConfig(url=url, secret=SecretStr(CANARY), **options)
    return stored_config(body, box=BOX, agent_id=AGENT, allow=allow)


def context(agent_config: dict[str, Any], events: Recorder) -> RunContext:
    run = ClaimedRun(
        id=uuid.uuid4(),
        task_id=TASK,
        workspace_id=uuid.uuid4(),
        agent_id=AGENT,
        attempt=1,
        failures=0,
        prompt="Summarise the quarterly report",
        agent_adapter="http",
        agent_config=agent_config,
    )
    child = Related(uuid.uuid4(), "T-2", "Fetch data", "fetcher", "done", "42 rows", None)
    task = TaskBrief(TASK, "T-1", "Summarise", run.prompt, None, children=(child,))
    return RunContext(run, task, "summariser", events, datetime.now(UTC))


def line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event) + b"\n"


async def stream(
    request: web.Request, content_type: str, *chunks: bytes, status: int = 200
) -> web.StreamResponse:
    response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return response


def answer(content_type: str, *chunks: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, content_type, *chunks)

    return handler


async def test_the_request_is_signed_and_ndjson_events_reach_the_run(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    hook.handlers["/agent"] = answer(
        NDJSON,
        line({"type": "text", "text": "Revenue "}),
        line({"type": "log", "message": "read 42 rows"}) + b"\n",  # a blank line is skipped
        line({"type": "text", "text": "grew.", "at": 3}),  # other keys are ignored
        line({"type": "result", "result": "Revenue grew 12%."}),
    )
    events = Recorder()
    ctx = context(config(hook.url("/agent")), events)
    started = time.time()
    outcome = await adapter.run(ctx)

    assert outcome.status is RunStatus.DONE and outcome.result == "Revenue grew 12%."
    assert events.texts == ["Revenue ", "grew."]
    assert events.emitted == [(EventKind.LOG, {"message": "read 42 rows", "source": "webhook"})]
    [seen] = hook.received
    assert seen.signed
    assert orjson.loads(seen.body) == ctx.as_dict()
    assert orjson.loads(seen.body)["task"]["children"][0]["result"] == "42 rows"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Bullpen-Run-Id"] == str(ctx.run.id)
    assert seen.headers["Accept"] == "application/x-ndjson, text/event-stream, application/json"
    assert abs(int(seen.headers["Bullpen-Timestamp"]) - started) <= 5
    assert "traceparent" not in seen.headers  # tracing is off


async def test_a_traced_run_passes_its_trace_context_to_the_agent(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    """With tracing on, the run's span is current (`TRACE_PARENT`) while the adapter runs."""
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "ok"}))
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    token = TRACE_PARENT.set(traceparent)
    try:
        outcome = await adapter.run(context(config(hook.url("/agent")), Recorder()))
    finally:
        TRACE_PARENT.reset(token)
    assert outcome.status is RunStatus.DONE
    [seen] = hook.received
    assert seen.signed and seen.headers["traceparent"] == traceparent


async def test_a_signature_made_with_another_secret_does_not_verify(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "ok"}))
    other = stored_config(
        HttpAgentConfig(url=hook.url("/agent"), secret=SecretStr("another-secret-0123456789")),
        box=BOX,
        agent_id=AGENT,
        allow=LOCAL,
    )
    await adapter.run(context(other, Recorder()))
    assert [r.signed for r in hook.received] == [False]


async def test_an_sse_answer_without_a_result_event_gives_its_text(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    hook.handlers["/sse"] = answer(
        SSE,
        b": a comment\r\nevent: whatever\r\nid: 1\r\n",
        b'data: {"type": "text",\r\ndata: "text": "Hello, "}\r\n\r\n',  # data over two lines
        b'data: {"type": "log", "message": "half way"}\n\n',
        b'data: {"type": "text", "text": "world"}\n\n',
    )
    events = Recorder()
    outcome = await adapter.run(context(config(hook.url("/sse")), events))
    assert outcome.result == "Hello, world"
    assert events.texts == ["Hello, ", "world"]
    assert [data["message"] for _, data in events.emitted] == ["half way"]


async def test_a_single_json_answer_is_one_event(hook: Webhook, adapter: HttpAdapter) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"type": "result", "result": "done at once"})

    hook.handlers["/json"] = handler
    outcome = await adapter.run(context(config(hook.url("/json")), Recorder()))
    assert outcome.result == "done at once"


async def test_events_reach_the_sink_while_the_answer_is_still_streaming(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    events = Recorder()
    seen_by_server: list[list[str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(line({"type": "text", "text": "first"}))
        # The answer is not over: the text must already be in the run's events.
        await asyncio.wait_for(events.first_text.wait(), 5)
        seen_by_server.append(list(events.texts))
        await response.write(line({"type": "result", "result": "all"}))
        await response.write_eof()
        return response

    hook.handlers["/slow"] = handler
    outcome = await adapter.run(context(config(hook.url("/slow")), events))
    assert seen_by_server == [["first"]]
    assert outcome.result == "all"


@pytest.mark.parametrize("content_type", [NDJSON, SSE])
async def test_events_split_across_reads_are_joined(
    hook: Webhook, adapter: HttpAdapter, content_type: str
) -> None:
    sent = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
    if content_type == SSE:
        body = b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in sent)
    else:
        body = b"".join(line(e) for e in sent)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        for start in range(0, len(body), 3):
            await response.write(body[start : start + 3])
            await asyncio.sleep(0.001)  # each piece its own read
        await response.write_eof()
        return response

    hook.handlers["/trickle"] = handler
    events = Recorder()
    outcome = await adapter.run(context(config(hook.url("/trickle")), events))
    assert events.texts == ["ab", "cd"] and outcome.result == "abcd"


async def test_the_answer_is_not_read_after_the_result(hook: Webhook, adapter: HttpAdapter) -> None:
    hook.handlers["/agent"] = answer(
        NDJSON,
        line({"type": "result", "result": "first"}),
        line({"type": "text", "text": "late"}),
        line({"type": "bogus"}),
    )
    events = Recorder()
    outcome = await adapter.run(context(config(hook.url("/agent")), events))
    assert outcome.result == "first" and events.texts == []


async def test_an_error_event_fails_the_run_with_its_message(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    message = "quota exceeded: " + "x" * 5000
    hook.handlers["/agent"] = answer(
        NDJSON,
        line({"type": "text", "text": "working"}),
        line({"type": "error", "error": message}),
        line({"type": "result", "result": "never read"}),
    )
    events = Recorder()
    with pytest.raises(WebhookFailed) as caught:
        await adapter.run(context(config(hook.url("/agent")), events))
    assert caught.value.detail == message[:2000]
    assert not caught.value.transient and caught.value.slug == "webhook-failed"
    assert events.texts == ["working"]


@pytest.mark.parametrize(
    ("status", "transient"),
    [(500, True), (502, True), (503, True), (429, True), (400, False), (404, False)],
)
async def test_http_error_statuses(
    hook: Webhook, adapter: HttpAdapter, status: int, transient: bool
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text="bad\nthing " + "y" * 10_000)

    hook.handlers["/agent"] = handler
    with pytest.raises(WebhookFailed) as caught:
        await adapter.run(context(config(hook.url("/agent")), Recorder()))
    detail = caught.value.detail
    assert detail.startswith(f"the webhook answered HTTP {status}: bad thing yyy")
    assert len(detail) <= len(f"the webhook answered HTTP {status}: ") + 500
    assert caught.value.transient is transient


async def test_other_redirects_are_not_followed(hook: Webhook, adapter: HttpAdapter) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(hook.url("/ok"))

    hook.handlers["/moved"] = handler
    with pytest.raises(WebhookFailed, match=r"answered HTTP 302.*307 and 308") as caught:
        await adapter.run(context(config(hook.url("/moved")), Recorder()))
    assert not caught.value.transient
    assert [r.path for r in hook.received] == ["/moved"]


@pytest.mark.parametrize(
    ("content_type", "body", "says"),
    [
        (NDJSON, b"{not json}\n", "event 1 of the webhook's answer is not JSON"),
        (NDJSON, line({"type": "text", "text": "a"}) + b"[1, 2]\n", "event 2 .* not an object"),
        (NDJSON, line({"kind": "text"}), "not an object with a `type`"),
        (NDJSON, line({"type": "text", "text": 5}), r"\(text\) needs a string `text`"),
        (NDJSON, line({"type": "result", "result": None}), "needs a string `result`"),
        (NDJSON, line({"type": "usage", "tokens": 3}), "unknown type 'usage'"),
        (NDJSON, b"", "ended without a result"),
        (NDJSON, line({"type": "log", "message": "only a log"}), "ended without a result"),
        (SSE, b'data: {"type": "txt"}\n\n', "unknown type 'txt'"),
        ("text/html", b"<html>hi</html>", "Content-Type 'text/html'"),
    ],
)
async def test_malformed_answers_fail_the_run(
    hook: Webhook, adapter: HttpAdapter, content_type: str, body: bytes, says: str
) -> None:
    hook.handlers["/agent"] = answer(content_type, body)
    with pytest.raises(WebhookFailed, match=says) as caught:
        await adapter.run(context(config(hook.url("/agent")), Recorder()))
    assert not caught.value.transient


async def test_events_before_a_malformed_one_are_kept(hook: Webhook, adapter: HttpAdapter) -> None:
    hook.handlers["/agent"] = answer(
        NDJSON, line({"type": "text", "text": "kept"}), line({"type": "nope"})
    )
    events = Recorder()
    with pytest.raises(WebhookFailed, match="unknown type 'nope'"):
        await adapter.run(context(config(hook.url("/agent")), events))
    assert events.texts == ["kept"]


@pytest.mark.parametrize("content_type", [NDJSON, SSE, "application/json"])
async def test_an_event_over_one_mib_fails_the_run(
    hook: Webhook, adapter: HttpAdapter, content_type: str
) -> None:
    text = "z" * (1 << 20)
    payload = orjson.dumps({"type": "text", "text": text})
    framed = b"data: " + payload + b"\n\n" if content_type == SSE else payload + b"\n"
    hook.handlers["/agent"] = answer(content_type, framed)
    events = Recorder()
    with pytest.raises(WebhookFailed, match="over 1 MiB") as caught:
        await adapter.run(context(config(hook.url("/agent")), events))
    assert not caught.value.transient and events.texts == []


async def test_an_event_just_under_the_limit_passes(hook: Webhook, adapter: HttpAdapter) -> None:
    envelope = len(orjson.dumps({"type": "result", "result": ""}))
    result = "r" * ((1 << 20) - envelope)
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": result}))
    outcome = await adapter.run(context(config(hook.url("/agent")), Recorder()))
    assert outcome.result == result


async def test_an_answer_over_its_limit_fails_the_run(hook: Webhook) -> None:
    chunk = line({"type": "text", "text": "t" * 1000})
    hook.handlers["/agent"] = answer(NDJSON, *([chunk] * 100))  # about 100 KB in all
    events = Recorder()
    async with HttpAdapter(BOX, LOCAL, max_answer_bytes=64 * 1024) as small:
        with pytest.raises(WebhookFailed, match="answer is over 65536 bytes") as caught:
            await small.run(context(config(hook.url("/agent")), events))
    assert 0 < len(events.texts) < 100
    assert not caught.value.transient  # text reached the run: not retried


async def test_the_overall_timeout_fails_the_run_and_closes_the_call(hook: Webhook) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(line({"type": "text", "text": "thinking"}))
        await asyncio.sleep(30)
        return response

    hook.handlers["/stall"] = handler
    events = Recorder()
    started = time.monotonic()
    async with HttpAdapter(BOX, LOCAL) as adapter:
        with pytest.raises(WebhookTimeout, match=r"within 0\.5 s") as caught:
            await adapter.run(context(config(hook.url("/stall"), timeout_s=0.5), events))
    assert 0.5 <= time.monotonic() - started < 5
    assert not caught.value.transient and caught.value.slug == "webhook-timeout"
    assert events.texts == ["thinking"]
    await asyncio.wait_for(hook.disconnected.wait(), 5)


async def test_cancelling_the_run_closes_the_upstream_call(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(line({"type": "text", "text": "started"}))
        await asyncio.sleep(30)
        return response

    hook.handlers["/long"] = handler
    events = Recorder()
    running = asyncio.create_task(adapter.run(context(config(hook.url("/long")), events)))
    await asyncio.wait_for(events.first_text.wait(), 5)
    assert not hook.disconnected.is_set()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait_for(hook.disconnected.wait(), 5)


async def test_no_connection_is_transient(adapter: HttpAdapter) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(
        WebhookFailed, match=r"could not reach the webhook at 127\.0\.0\.1"
    ) as caught:
        await adapter.run(context(config(f"http://127.0.0.1:{port}/"), Recorder()))
    assert caught.value.transient


@pytest.mark.parametrize(("before", "transient"), [(b"", True), (b"text", False)])
async def test_a_connection_lost_mid_answer_is_transient_only_before_any_event(
    hook: Webhook, adapter: HttpAdapter, before: bytes, transient: bool
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        if before:
            await response.write(line({"type": "text", "text": "partial"}))
        await response.write(b'{"type": "te')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # no end of the chunked body
        return response

    hook.handlers["/cut"] = handler
    with pytest.raises(
        WebhookFailed, match=r"connection to the webhook at 127\.0\.0\.1 broke"
    ) as c:
        await adapter.run(context(config(hook.url("/cut")), Recorder()))
    assert c.value.transient is transient


async def test_the_secret_never_leaks(
    hook: Webhook, adapter: HttpAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def refuse(request: web.Request) -> web.StreamResponse:
        text = "headers: " + repr(dict(request.headers))  # echoes what it was sent
        return web.Response(status=401, text=text)

    async def stall(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    hook.handlers["/ok"] = answer(
        NDJSON, line({"type": "log", "message": "hello"}), line({"type": "text", "text": "t"})
    )
    hook.handlers["/refuse"] = refuse
    hook.handlers["/fail"] = answer(NDJSON, line({"type": "error", "error": "failed"}))
    hook.handlers["/stall"] = stall
    events = Recorder()
    stored = config(hook.url("/ok"))
    outcomes: list[Any] = [await adapter.run(context(stored, events))]
    for path in ("/refuse", "/fail", "/stall", "/missing"):
        with pytest.raises(BullpenError) as caught:
            await adapter.run(context(config(hook.url(path), timeout_s=0.3), events))
        outcomes.append(caught.value)
    async with HttpAdapter(BOX, NOBODY) as guarded:
        with pytest.raises(OutboundRefused) as refused:
            await guarded.run(context(stored, events))
        outcomes.append(refused.value)

    assert len(hook.received) == 5 and all(r.signed for r in hook.received)
    sinks = {
        "events": repr(events.texts) + repr(events.emitted),
        "outcomes and errors": " ".join(f"{o!r} {o}" for o in outcomes),
        "error details": " ".join(getattr(o, "detail", "") for o in outcomes),
        "logs": caplog.text,
        "stored config": orjson.dumps(stored).decode(),
        "public view": orjson.dumps(public_config(stored)).decode(),
        "api model": repr(HttpAgentConfig(url="https://a.example", secret=SecretStr(CANARY)))
        + HttpAgentConfig(url="https://a.example", secret=SecretStr(CANARY)).model_dump_json(),
        "sent": " ".join(repr(r.headers) + r.body.decode() for r in hook.received),
    }
    assert {name: CANARY in text for name, text in sinks.items()} == dict.fromkeys(sinks, False)
    assert "401" in outcomes[1].detail  # the failures above are the ones meant


# SSRF: every refusal below would otherwise reach the webhook server on loopback.


async def test_a_loopback_literal_is_refused_without_the_allow_list(hook: Webhook) -> None:
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "reached"}))
    async with HttpAdapter(BOX, NOBODY) as adapter:
        for host in ("127.0.0.1", "[::ffff:127.0.0.1]"):
            with pytest.raises(OutboundRefused, match=r"loopback.*BULLPEN_OUTBOUND_ALLOW"):
                await adapter.run(context(config(hook.url("/agent", host)), Recorder()))
    assert hook.received == []


async def test_localhost_is_refused_without_the_allow_list(hook: Webhook) -> None:
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "reached"}))
    url = hook.url("/agent", "localhost")
    with pytest.raises(OutboundRefused, match="localhost"):
        config(url, allow=NOBODY)  # at config time
    async with HttpAdapter(BOX, NOBODY) as adapter:
        with pytest.raises(OutboundRefused, match="localhost"):  # and at run time
            await adapter.run(
                context(config(url, allow=OutboundAllow.parse("localhost")), Recorder())
            )
    async with HttpAdapter(BOX, OutboundAllow.parse("localhost")) as adapter:
        outcome = await adapter.run(
            context(config(url, allow=OutboundAllow.parse("localhost")), Recorder())
        )
    assert outcome.result == "reached"
    assert [r.path for r in hook.received] == ["/agent"]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::ffff:127.0.0.1"])
async def test_a_name_resolving_to_loopback_is_refused_when_connecting(
    hook: Webhook, address: str
) -> None:
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "reached"}))
    dns = StubDns({"rebind.test": address})
    url = hook.url("/agent", "rebind.test")
    stored = config(url, allow=NOBODY)  # a name passes at config time: it is checked on use
    async with HttpAdapter(BOX, NOBODY, resolver=dns) as adapter:
        with pytest.raises(OutboundRefused, match=r"rebind\.test.*loopback"):
            await adapter.run(context(stored, Recorder()))
    assert dns.asked == ["rebind.test"]
    assert hook.received == []


async def test_an_allowed_name_connects_whatever_it_resolves_to(hook: Webhook) -> None:
    hook.handlers["/agent"] = answer(NDJSON, line({"type": "result", "result": "reached"}))
    dns = StubDns({"agent.test": "127.0.0.1"})
    allow = OutboundAllow.parse("agent.test")
    async with HttpAdapter(BOX, allow, resolver=dns) as adapter:
        stored = config(hook.url("/agent", "agent.test"), allow=allow)
        outcome = await adapter.run(context(stored, Recorder()))
    assert outcome.result == "reached" and dns.asked == ["agent.test"]


def redirect(status: int, location: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": location})

    return handler


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/ok",
        "http://[::ffff:127.0.0.1]:{port}/ok",
        "http://localhost:{port}/ok",
        "http://rebind.test:{port}/ok",
        "http://2130706433:{port}/ok",
    ],
)
@pytest.mark.parametrize("status", [307, 308])
async def test_a_redirect_to_loopback_is_refused(hook: Webhook, status: int, target: str) -> None:
    """An allowed server (by name) redirects to a target nobody allowed."""
    hook.handlers["/redirect"] = redirect(status, target.format(port=hook.port))
    hook.handlers["/ok"] = answer(NDJSON, line({"type": "result", "result": "reached"}))
    dns = StubDns({"agent.test": "127.0.0.1", "rebind.test": "127.0.0.1"})
    allow = OutboundAllow.parse("agent.test")
    async with HttpAdapter(BOX, allow, resolver=dns) as adapter:
        stored = config(hook.url("/redirect", "agent.test"), allow=allow)
        with pytest.raises(InvalidInput) as caught:
            await adapter.run(context(stored, Recorder()))
    assert [r.path for r in hook.received] == ["/redirect"]
    assert not caught.value.transient
    if "2130706433" not in target:
        assert isinstance(caught.value, OutboundRefused)


@pytest.mark.parametrize("status", [307, 308])
async def test_allowed_redirects_resend_the_signed_request(hook: Webhook, status: int) -> None:
    hook.handlers["/redirect"] = redirect(status, "/ok")  # relative to the first hop
    hook.handlers["/ok"] = answer(NDJSON, line({"type": "result", "result": "moved"}))
    async with HttpAdapter(BOX, LOCAL) as adapter:
        outcome = await adapter.run(context(config(hook.url("/redirect")), Recorder()))
    assert outcome.result == "moved"
    first, second = hook.received
    assert (first.path, second.path) == ("/redirect", "/ok")
    assert second.signed and second.body == first.body


async def test_redirects_stop_after_five(hook: Webhook, adapter: HttpAdapter) -> None:
    hook.handlers["/loop"] = redirect(307, "/loop")
    with pytest.raises(WebhookFailed, match="more than 5 times") as caught:
        await adapter.run(context(config(hook.url("/loop")), Recorder()))
    assert len(hook.received) == 6 and not caught.value.transient


# The stored config.


def test_the_metadata_address_is_refused_at_config_time() -> None:
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/"):
        with pytest.raises(OutboundRefused, match="BULLPEN_OUTBOUND_ALLOW"):
            config(url, allow=NOBODY)


def test_the_stored_config_seals_the_secret_and_the_public_view_hides_it() -> None:
    stored = config("https://agents.example.com/hook", timeout_s=60)
    assert set(stored) == {"url", "timeout_s", "connect_timeout_s", "secret_sealed", "secret_hint"}
    assert stored["timeout_s"] == 60 and stored["connect_timeout_s"] == 10
    assert CANARY not in orjson.dumps(stored).decode()
    assert stored["secret_hint"] == "whs…p8Zb"
    assert public_config(stored) == {
        "url": "https://agents.example.com/hook",
        "timeout_s": 60,
        "connect_timeout_s": 10,
        "secret_hint": stored["secret_hint"],
    }


def test_updating_without_a_secret_keeps_the_sealed_one() -> None:
    before = config("https://agents.example.com/hook")
    change = HttpAgentConfig(url="https://agents.example.com/v2", timeout_s=30)
    after = stored_config(change, box=BOX, agent_id=AGENT, allow=NOBODY, previous=before)
    assert after["url"] == "https://agents.example.com/v2" and after["timeout_s"] == 30
    assert after["secret_sealed"] == before["secret_sealed"]
    assert after["secret_hint"] == before["secret_hint"]
    with pytest.raises(InvalidInput, match="needs a `secret`"):
        stored_config(change, box=BOX, agent_id=AGENT, allow=NOBODY)
    new = HttpAgentConfig(url="https://agents.example.com/v2", secret=SecretStr("x" * 16))
    rotated = stored_config(new, box=BOX, agent_id=AGENT, allow=NOBODY, previous=before)
    assert rotated["secret_sealed"] != before["secret_sealed"]


async def test_a_secret_sealed_for_another_agent_does_not_open(
    hook: Webhook, adapter: HttpAdapter
) -> None:
    stored = stored_config(
        HttpAgentConfig(url=hook.url("/agent"), secret=SecretStr(CANARY)),
        box=BOX,
        agent_id=uuid.uuid4(),
        allow=LOCAL,
    )
    with pytest.raises(BullpenError, match="does not open"):
        await adapter.run(context(stored, Recorder()))
    assert hook.received == []


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        ({}, "secret_sealed, url"),
        ({"url": "http://127.0.0.1/", "secret_sealed": "***"}, "damaged secret_sealed"),
        ({"url": "http://127.0.0.1/", "secret_sealed": "AA==", "timeout_s": 0}, "timeout_s"),
    ],
)
async def test_a_broken_stored_config_fails_permanently(
    adapter: HttpAdapter, broken: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidInput, match=says) as caught:
        await adapter.run(context(broken, Recorder()))
    assert not caught.value.transient


@pytest.mark.parametrize(
    "body",
    [
        {"url": "https://a.example"},  # valid: the secret may be kept from before
        {"url": "https://a.example", "secret": "s" * 16, "timeout_s": 3600},
    ],
)
def test_the_api_model_accepts(body: dict[str, Any]) -> None:
    assert HttpAgentConfig.model_validate(body).url == "https://a.example"


@pytest.mark.parametrize(
    "body",
    [
        {"url": "https://a.example", "secret": "s" * 15},
        {"url": "https://a.example", "secret": "s" * 513},
        {"url": "https://a.example/" + "p" * 2048},
        {"url": "https://a.example/with space"},
        {"url": "https://a.example", "timeout_s": 3601},
        {"url": "https://a.example", "timeout_s": 0},
        {"url": "https://a.example", "timeout_s": "30"},
        {"url": "https://a.example", "connect_timeout_s": 61},
        {"url": "https://a.example", "secret_sealed": "AA=="},  # no mass assignment
        {"secret": "s" * 16},
    ],
)
def test_the_api_model_refuses(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        HttpAgentConfig.model_validate(body)
