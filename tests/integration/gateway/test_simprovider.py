"""The simulated OpenAI-compatible provider, driven over real sockets."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from bullpen.simulator.provider import (
    SimConfig,
    SimulatedProvider,
    completion_tokens,
    serve_forever,
)

FAST = SimConfig(ttft_ms=20, tokens_per_second=5_000, response_tokens=16, models=("sim-1", "sim-2"))
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there friend"},
]
# Words per message plus 3 per message: (2 + 3) + (3 + 3).
MESSAGES_PROMPT_TOKENS = 11
ENVELOPE_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices"}
CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def sim() -> AsyncIterator[SimulatedProvider]:
    async with SimulatedProvider(FAST) as provider:
        yield provider


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "sim-1", "messages": MESSAGES, **fields}


def parse_sse(raw: bytes) -> list[Any]:
    """Split an SSE body into decoded `data:` payloads, with "[DONE]" kept as a string."""
    assert raw.endswith(b"\n\n")
    events: list[Any] = []
    for frame in raw[:-2].split(b"\n\n"):
        assert frame.startswith(b"data: "), frame
        data = frame.removeprefix(b"data: ")
        events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


async def stream(
    http: aiohttp.ClientSession,
    sim: SimulatedProvider,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> list[Any]:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/event-stream"
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        return parse_sse(await resp.read())


def content_of(events: list[Any]) -> str:
    return "".join(
        choice["delta"].get("content", "")
        for event in events
        if isinstance(event, dict)
        for choice in event["choices"]
    )


async def test_stream_wire_format_chunk_by_chunk(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    events = await stream(http, sim, chat(stream=True))

    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 1 + 16 + 1
    first_id = chunks[0]["id"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]+", first_id)
    for chunk in chunks:
        assert set(chunk) == ENVELOPE_KEYS  # no "usage" key unless include_usage
        assert chunk["id"] == first_id
        assert chunk["object"] == "chat.completion.chunk"
        assert isinstance(chunk["created"], int)
        assert abs(chunk["created"] - time.time()) < 60
        assert chunk["model"] == "sim-1"
        assert isinstance(chunk["system_fingerprint"], str)
        [choice] = chunk["choices"]
        assert set(choice) == CHOICE_KEYS
        assert choice["index"] == 0
        assert choice["logprobs"] is None

    role, *contents, finish = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["choices"][0]["finish_reason"] is None
    expected = completion_tokens(MESSAGES, 16)
    assert [c["choices"][0]["delta"] for c in contents] == [{"content": t} for t in expected]
    assert all(c["choices"][0]["finish_reason"] is None for c in contents)
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] == "stop"


async def test_stream_with_include_usage_ends_with_a_usage_chunk(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    events = await stream(http, sim, body)

    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert len(chunks) == 1 + 16 + 1
    for chunk in chunks:
        assert set(chunk) == ENVELOPE_KEYS | {"usage"}
        assert chunk["usage"] is None
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert set(usage_chunk) == ENVELOPE_KEYS | {"usage"}
    assert usage_chunk["id"] == chunks[0]["id"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": MESSAGES_PROMPT_TOKENS,
        "completion_tokens": 16,
        "total_tokens": MESSAGES_PROMPT_TOKENS + 16,
    }


async def test_include_usage_false_sends_no_usage(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    events = await stream(http, sim, chat(stream=True, stream_options={"include_usage": False}))

    assert all("usage" not in e for e in events[:-1])
    assert all(e["choices"] for e in events[:-1])


async def test_streamed_content_is_the_computed_completion(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    events = await stream(http, sim, chat(stream=True))

    tokens = completion_tokens(MESSAGES, 16)
    assert content_of(events) == "".join(tokens)
    assert len(tokens) == 16
    assert not tokens[0].startswith(" ")
    assert all(t.startswith(" ") and t[1:].isalpha() for t in tokens[1:])


async def test_same_prompt_same_text_different_prompt_different_text(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    other = [{"role": "user", "content": "hello there friends"}]

    first = content_of(await stream(http, sim, chat(stream=True)))
    second = content_of(await stream(http, sim, chat(stream=True)))
    third = content_of(await stream(http, sim, chat(stream=True, messages=other)))

    assert first == second
    assert first != third
    assert third == "".join(completion_tokens(other, 16))


def test_completion_tokens_depend_on_roles_and_contents() -> None:
    as_user = [{"role": "user", "content": "same words"}]
    as_system = [{"role": "system", "content": "same words"}]
    split = [{"role": "user", "content": "same"}, {"role": "user", "content": " words"}]

    assert completion_tokens(as_user, 40) == completion_tokens(as_user, 40)
    assert completion_tokens(as_user, 40) != completion_tokens(as_system, 40)
    assert completion_tokens(as_user, 40) != completion_tokens(split, 40)
    assert completion_tokens(as_user, 7) == completion_tokens(as_user, 40)[:7]
    assert completion_tokens(as_user, 0) == []
    with pytest.raises(ValueError, match="n must be"):
        completion_tokens(as_user, -1)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_token_cap_shortens_the_stream_with_finish_reason_length(
    http: aiohttp.ClientSession, sim: SimulatedProvider, field: str
) -> None:
    events = await stream(http, sim, chat(stream=True, **{field: 5}))

    assert len(events[1:-2]) == 5
    assert content_of(events) == "".join(completion_tokens(MESSAGES, 5))
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_cap_at_or_above_response_tokens_finishes_with_stop(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    events = await stream(http, sim, chat(stream=True, max_tokens=16, max_completion_tokens=500))

    assert content_of(events) == "".join(completion_tokens(MESSAGES, 16))
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_both_caps_take_the_smaller(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    events = await stream(http, sim, chat(stream=True, max_tokens=9, max_completion_tokens=4))

    assert content_of(events) == "".join(completion_tokens(MESSAGES, 4))


async def test_non_streaming_completion(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    body = chat(max_tokens=3, temperature=0.7, top_p=0.1, n=2, seed=1, stop=["x"])
    async with http.post(f"{sim.base_url}/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        payload = await resp.json()

    assert payload["id"].startswith("chatcmpl-")
    assert payload["object"] == "chat.completion"
    assert isinstance(payload["created"], int)
    assert payload["model"] == "sim-1"
    assert payload["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(completion_tokens(MESSAGES, 3))},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert payload["usage"] == {
        "prompt_tokens": MESSAGES_PROMPT_TOKENS,
        "completion_tokens": 3,
        "total_tokens": MESSAGES_PROMPT_TOKENS + 3,
    }


async def test_non_streaming_full_length_finishes_with_stop(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    async with http.post(f"{sim.base_url}/chat/completions", json=chat(stream=False)) as resp:
        payload = await resp.json()

    assert payload["choices"][0]["finish_reason"] == "stop"
    assert payload["choices"][0]["message"]["content"] == "".join(completion_tokens(MESSAGES, 16))
    assert payload["usage"]["completion_tokens"] == 16


async def test_list_models(http: aiohttp.ClientSession, sim: SimulatedProvider) -> None:
    async with http.get(f"{sim.base_url}/models") as resp:
        assert resp.status == 200
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        payload = await resp.json()

    assert payload["object"] == "list"
    assert [m["id"] for m in payload["data"]] == ["sim-1", "sim-2"]
    for model in payload["data"]:
        assert set(model) == {"id", "object", "created", "owned_by"}
        assert model["object"] == "model"
        assert isinstance(model["created"], int)
        assert model["owned_by"] == "bullpen-simulator"


def assert_openai_error(payload: Any, *, param: str | None, code: str | None = None) -> None:
    assert set(payload) == {"error"}
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


BAD_BODIES = [
    pytest.param(b"{not json", None, id="malformed-json"),
    pytest.param(b"", None, id="empty-body"),
    pytest.param(b"[1, 2]", None, id="not-an-object"),
    pytest.param({"messages": MESSAGES}, "model", id="model-missing"),
    pytest.param({"model": 3, "messages": MESSAGES}, "model", id="model-not-string"),
    pytest.param({"model": "sim-1"}, "messages", id="messages-missing"),
    pytest.param(chat(messages="hi"), "messages", id="messages-not-list"),
    pytest.param(chat(messages=[]), "messages", id="messages-empty"),
    pytest.param(chat(messages=["hi"]), "messages[0]", id="message-not-object"),
    pytest.param(chat(messages=[{"content": "hi"}]), "messages[0].role", id="role-missing"),
    pytest.param(chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", id="role"),
    pytest.param(
        chat(messages=[*MESSAGES, {"role": "user", "content": None}]),
        "messages[2].content",
        id="content-null",
    ),
    pytest.param(
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        "messages[0].content",
        id="content-parts",
    ),
    pytest.param(chat(stream="yes"), "stream", id="stream-not-bool"),
    pytest.param(chat(stream_options={"include_usage": True}), "stream_options", id="opts-alone"),
    pytest.param(chat(stream=True, stream_options=[]), "stream_options", id="opts-not-object"),
    pytest.param(
        chat(stream=True, stream_options={"include_usage": 1}),
        "stream_options.include_usage",
        id="include-usage-not-bool",
    ),
    pytest.param(chat(max_tokens=0), "max_tokens", id="max-tokens-zero"),
    pytest.param(chat(max_tokens="5"), "max_tokens", id="max-tokens-string"),
    pytest.param(chat(max_tokens=True), "max_tokens", id="max-tokens-bool"),
    pytest.param(chat(max_tokens=2.5), "max_tokens", id="max-tokens-float"),
    pytest.param(chat(max_completion_tokens=-1), "max_completion_tokens", id="max-completion"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
async def test_bad_requests_get_400_in_openai_error_shape(
    http: aiohttp.ClientSession, sim: SimulatedProvider, body: Any, param: str | None
) -> None:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, data=data, headers=headers) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json"
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        assert_openai_error(await resp.json(), param=param)


async def test_unknown_model_is_404_model_not_found(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model="gpt-4o", stream=True)) as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json(), param="model", code="model_not_found")


async def test_unknown_route_is_404_in_openai_error_shape(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    async with http.post(f"{sim.base_url}/completions", json={}) as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json(), param=None)


@pytest.mark.parametrize(
    "size", [pytest.param(None, id="content-length"), pytest.param(64 * 1024, id="chunked")]
)
async def test_body_over_one_mebibyte_is_413(
    http: aiohttp.ClientSession, sim: SimulatedProvider, size: int | None
) -> None:
    padding = "word " * (1024 * 1024 // 5 + 10)
    data = orjson.dumps(chat(messages=[{"role": "user", "content": padding}]))
    assert len(data) > 1024 * 1024
    payload: Any = data
    if size is not None:  # an async generator body is sent chunked, with no Content-Length

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), size):
                yield data[start : start + size]

        payload = chunks()
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, data=payload) as resp:
        assert resp.status == 413
        assert_openai_error(await resp.json(), param=None)


async def test_body_just_under_the_limit_is_accepted(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    skeleton = len(orjson.dumps(chat(messages=[{"role": "user", "content": ""}])))
    content = "a" * (1024 * 1024 - skeleton)
    data = orjson.dumps(chat(messages=[{"role": "user", "content": content}]))
    assert len(data) == 1024 * 1024
    async with http.post(f"{sim.base_url}/chat/completions", data=data) as resp:
        assert resp.status == 200


@pytest.fixture
async def keyed() -> AsyncIterator[SimulatedProvider]:
    async with SimulatedProvider(SimConfig(ttft_ms=0, api_key="sk-sim-secret")) as provider:
        yield provider


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="missing"),
        pytest.param("Bearer sk-sim-wrong", id="wrong-key"),
        pytest.param("Bearer sk-sim-secre", id="prefix-of-key"),
        pytest.param("Basic sk-sim-secret", id="wrong-scheme"),
        pytest.param("Bearer ", id="empty-token"),
        pytest.param("sk-sim-secret", id="no-scheme"),
    ],
)
@pytest.mark.parametrize("route", ["GET /models", "POST /chat/completions"])
async def test_api_key_is_required_when_configured(
    http: aiohttp.ClientSession, keyed: SimulatedProvider, authorization: str | None, route: str
) -> None:
    method, path = route.split()
    headers = {} if authorization is None else {"Authorization": authorization}
    url = f"{keyed.base_url}{path}"
    async with http.request(method, url, json=chat(), headers=headers) as resp:
        assert resp.status == 401
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        assert_openai_error(await resp.json(), param=None, code="invalid_api_key")


async def test_right_api_key_is_let_in(
    http: aiohttp.ClientSession, keyed: SimulatedProvider
) -> None:
    headers = {"Authorization": "Bearer sk-sim-secret"}
    url = f"{keyed.base_url}/chat/completions"
    async with http.post(url, json=chat(max_tokens=2), headers=headers) as resp:
        assert resp.status == 200
    async with http.get(f"{keyed.base_url}/models", headers=headers) as resp:
        assert resp.status == 200


async def test_no_key_configured_means_no_auth(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    headers = {"Authorization": "Bearer anything"}
    async with http.get(f"{sim.base_url}/models", headers=headers) as resp:
        assert resp.status == 200


async def test_first_token_waits_for_ttft_and_tokens_follow_the_rate(
    http: aiohttp.ClientSession,
) -> None:
    config = SimConfig(ttft_ms=80, tokens_per_second=100, response_tokens=5)
    async with SimulatedProvider(config) as provider:
        arrivals: list[tuple[float, Any]] = []
        started = time.monotonic()
        body = chat(stream=True)
        async with http.post(f"{provider.base_url}/chat/completions", json=body) as resp:
            while frame := await resp.content.readuntil(b"\n\n"):
                arrivals.append((time.monotonic() - started, parse_sse(frame)[0]))
                if arrivals[-1][1] == "[DONE]":
                    break

    role_at, role = arrivals[0]
    assert role["choices"][0]["delta"]["role"] == "assistant"
    content_times = [
        at for at, e in arrivals if e != "[DONE]" and e["choices"][0]["delta"].get("content")
    ]
    assert len(content_times) == 5
    assert role_at >= 0.080 - 0.005
    assert content_times[0] >= 0.080 - 0.005
    # Token i is due at ttft + i / tps, so the last of five lands no earlier than 80 + 40 ms.
    assert content_times[-1] >= 0.120 - 0.005
    assert content_times[-1] - content_times[0] >= 0.040 - 0.005


async def test_non_streaming_waits_for_the_whole_generation(http: aiohttp.ClientSession) -> None:
    config = SimConfig(ttft_ms=50, tokens_per_second=100, response_tokens=6)
    async with SimulatedProvider(config) as provider:
        started = time.monotonic()
        async with http.post(f"{provider.base_url}/chat/completions", json=chat()) as resp:
            await resp.json()
        elapsed = time.monotonic() - started

    assert elapsed >= 0.050 + 0.050 - 0.005


async def test_client_disconnect_mid_stream_leaves_the_server_serving(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    config = SimConfig(ttft_ms=10, tokens_per_second=50, response_tokens=64)
    caplog.set_level(logging.DEBUG)
    async with SimulatedProvider(config) as provider:
        url = f"{provider.base_url}/chat/completions"
        async with http.post(url, json=chat(stream=True)) as resp:
            await resp.content.readuntil(b"\n\n")  # the role chunk
            await resp.content.readuntil(b"\n\n")  # the first token
            resp.close()  # drop the connection with 60-odd tokens still to come
        await asyncio.sleep(0.1)  # let the server notice and write into the closed socket

        body = chat(stream=True, max_tokens=3)
        async with http.post(url, json=body) as resp:
            events = parse_sse(await resp.read())
        exit_started = time.monotonic()
    exit_took = time.monotonic() - exit_started

    assert content_of(events) == "".join(completion_tokens(MESSAGES, 3))
    assert events[-1] == "[DONE]"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("bullpen"))
    # Had the abandoned stream kept running, shutdown would wait on it for the grace period.
    assert exit_took < 0.5


async def test_provider_binds_an_ephemeral_port_and_releases_it(
    http: aiohttp.ClientSession,
) -> None:
    provider = SimulatedProvider(FAST)
    async with provider as entered:
        assert entered is provider
        assert provider.port > 0
        assert provider.base_url == f"http://127.0.0.1:{provider.port}/v1"
        async with http.get(f"{provider.base_url}/models") as resp:
            assert resp.status == 200

    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh, fresh.get(f"{provider.base_url}/models"):
            pass


async def test_serve_forever_serves_until_cancelled(http: aiohttp.ClientSession) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/models"
    server = asyncio.create_task(serve_forever(FAST, "127.0.0.1", port))
    try:
        for _ in range(100):
            try:
                async with http.get(url) as resp:
                    assert resp.status == 200
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)
        else:
            pytest.fail("serve_forever never started listening")
        assert not server.done()
    finally:
        server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server

    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh, fresh.get(url):
            pass


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ttft_ms": -1}, "ttft_ms"),
        ({"ttft_ms": float("nan")}, "ttft_ms"),
        ({"tokens_per_second": 0}, "tokens_per_second"),
        ({"tokens_per_second": -5.0}, "tokens_per_second"),
        ({"tokens_per_second": float("inf")}, "tokens_per_second"),
        ({"response_tokens": 0}, "response_tokens"),
        ({"response_tokens": 100_001}, "response_tokens"),
        ({"response_tokens": 2.5}, "response_tokens"),
        ({"models": ()}, "models"),
        ({"models": ("",)}, "models"),
        ({"api_key": ""}, "api_key"),
        ({"fault": "nope"}, "fault"),
        ({"fault": ""}, "fault"),
        ({"fault": "slow:0"}, "fault"),
        ({"fault": 503}, "fault"),
    ],
)
def test_sim_config_rejects_bad_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**fields)


def test_sim_config_accepts_the_edges() -> None:
    SimConfig(ttft_ms=0, tokens_per_second=0.001, response_tokens=1)
    SimConfig(response_tokens=100_000, api_key="k", models=("a", "b"))
    SimConfig(fault="cut-after:0")
    SimConfig(fault="429:0.2")


# Faults.

FAULT = "X-Bullpen-Sim-Fault"


def faulted(spec: str) -> dict[str, str]:
    return {FAULT: spec}


def content_deltas(events: list[Any]) -> list[str]:
    """The content of every chunk after the role chunk, in order."""
    return [
        choice["delta"]["content"]
        for event in events
        if isinstance(event, dict) and "choices" in event
        for choice in event["choices"]
        if "content" in choice["delta"] and "role" not in choice["delta"]
    ]


def assert_error_shape(payload: Any, *, kind: str, code: str | None) -> None:
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]
    assert payload["error"]["type"] == kind
    assert payload["error"]["code"] == code


async def raw_post(sim: SimulatedProvider, body: dict[str, Any]) -> tuple[bytes, bool]:
    """POST over a bare socket; return the de-chunked body and whether its terminator came."""
    reader, writer = await asyncio.open_connection(sim.host, sim.port)
    data = orjson.dumps(body)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    try:
        raw = await asyncio.wait_for(reader.read(), 2)
    finally:
        writer.close()
        await writer.wait_closed()
    status_and_headers, _, chunked = raw.partition(b"\r\n\r\n")
    assert status_and_headers.startswith(b"HTTP/1.1 200 "), status_and_headers
    assert b"transfer-encoding: chunked" in status_and_headers.lower()
    body_bytes = b""
    while chunked:
        size_line, _, chunked = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body_bytes, True
        body_bytes += chunked[:size]
        chunked = chunked[size + 2 :]
    return body_bytes, False


STATUS_FAULTS = [
    pytest.param("500", 500, "server_error", None, id="500"),
    pytest.param("502", 502, "server_error", None, id="502"),
    pytest.param("503", 503, "server_error", None, id="503"),
    pytest.param("400", 400, "invalid_request_error", None, id="400"),
    pytest.param("401", 401, "invalid_request_error", "invalid_api_key", id="401"),
    pytest.param("429", 429, "requests", "rate_limit_exceeded", id="429"),
    pytest.param("spend-limit", 429, "insufficient_quota", "insufficient_quota", id="spend"),
]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("spec", "status", "kind", "code"), STATUS_FAULTS)
async def test_status_faults_answer_in_openai_error_shape(
    http: aiohttp.ClientSession,
    sim: SimulatedProvider,
    spec: str,
    status: int,
    kind: str,
    code: str | None,
    streamed: bool,
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(stream=streamed), headers=faulted(spec)) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        assert resp.headers["X-Bullpen-Simulated"] == "true"
        assert_error_shape(await resp.json(), kind=kind, code=code)


@pytest.mark.parametrize(
    ("spec", "retry_after"), [("429", "1"), ("429:0.2", "0.2"), ("429:3", "3")]
)
async def test_429_sends_retry_after_as_given(
    http: aiohttp.ClientSession, sim: SimulatedProvider, spec: str, retry_after: str
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(), headers=faulted(spec)) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == retry_after
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"


async def test_spend_limit_is_openais_quota_error_without_retry_after(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(), headers=faulted("spend-limit")) as resp:
        assert resp.status == 429
        assert "Retry-After" not in resp.headers
        assert await resp.json() == {
            "error": {
                "message": "You exceeded your current quota, please check your plan and "
                "billing details.",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }


async def test_529_is_anthropics_overloaded_error(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(stream=True), headers=faulted("529")) as resp:
        assert resp.status == 529
        assert await resp.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
        }


async def test_echo_error_quotes_the_authorization_header(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    headers = {**faulted("echo-error"), "Authorization": "Bearer sk-live-leak-me-42"}
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(), headers=headers) as resp:
        assert resp.status == 401
        payload = await resp.json()

    assert payload["error"]["message"] == "Incorrect API key provided: Bearer sk-live-leak-me-42."
    assert payload["error"]["code"] == "invalid_api_key"


async def test_hang_sends_sse_headers_then_nothing_and_frees_the_server(
    http: aiohttp.ClientSession,
) -> None:
    async with SimulatedProvider(FAST) as provider:
        url = f"{provider.base_url}/chat/completions"
        async with http.post(url, json=chat(stream=True), headers=faulted("hang")) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/event-stream"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(resp.content.readany(), 0.15)
            resp.close()
        with pytest.raises(TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.15)
            async with http.post(url, json=chat(), headers=faulted("hang"), timeout=timeout):
                pass
        events = await stream(http, provider, chat(stream=True, max_tokens=2))
        exit_started = time.monotonic()
    exit_took = time.monotonic() - exit_started

    assert events[-1] == "[DONE]"
    # A hang still running at exit would hold shutdown for its whole grace period.
    assert exit_took < 0.5


@pytest.mark.parametrize("n", [0, 2])
async def test_hang_after_streams_n_tokens_then_nothing(
    http: aiohttp.ClientSession, sim: SimulatedProvider, n: int
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(stream=True), headers=faulted(f"hang-after:{n}")) as resp:
        assert resp.status == 200
        events = [parse_sse(await resp.content.readuntil(b"\n\n"))[0] for _ in range(1 + n)]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 0.15)
        resp.close()

    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content_deltas(events) == completion_tokens(MESSAGES, n)


async def test_hang_after_unstreamed_never_answers(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    timeout = aiohttp.ClientTimeout(total=0.15)
    url = f"{sim.base_url}/chat/completions"
    with pytest.raises(TimeoutError):
        async with http.post(url, json=chat(), headers=faulted("hang-after:1"), timeout=timeout):
            pass


@pytest.mark.parametrize("n", [0, 3])
async def test_error_after_sends_n_tokens_then_an_error_frame_and_ends_cleanly(
    http: aiohttp.ClientSession, sim: SimulatedProvider, n: int
) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    events = await stream(http, sim, body, headers=faulted(f"error-after:{n}"))

    role, *contents, error = events
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert content_deltas(contents) == completion_tokens(MESSAGES, n)
    assert all(c["choices"][0]["finish_reason"] is None for c in contents)
    assert_error_shape(error, kind="server_error", code=None)


async def test_error_after_unstreamed_is_a_500(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(), headers=faulted("error-after:2")) as resp:
        assert resp.status == 500
        assert_error_shape(await resp.json(), kind="server_error", code=None)


@pytest.mark.parametrize("n", [0, 3])
async def test_cut_after_closes_the_connection_after_exactly_n_tokens(
    http: aiohttp.ClientSession, sim: SimulatedProvider, n: int
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(stream=True), headers=faulted(f"cut-after:{n}")) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()

    # The bytes on the wire, which aiohttp drops once it has seen the error.
    healthy, healthy_terminated = await raw_post(sim, chat(stream=True, max_tokens=3))
    cut, cut_terminated = await raw_post(sim, chat(model=f"sim-1@cut-after:{n}", stream=True))
    assert healthy_terminated
    assert parse_sse(healthy)[-1] == "[DONE]"
    assert not cut_terminated
    role, *contents = parse_sse(cut)
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert content_deltas(contents) == completion_tokens(MESSAGES, n)
    assert len(contents) == n


async def test_cut_after_unstreamed_closes_before_answering(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with http.post(url, json=chat(), headers=faulted("cut-after:2")):
            pass
    async with http.post(url, json=chat()) as resp:
        assert resp.status == 200


async def test_no_finish_streams_every_token_then_just_ends(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    events = await stream(http, sim, body, headers=faulted("no-finish"))

    assert "[DONE]" not in events
    assert content_deltas(events) == completion_tokens(MESSAGES, 16)
    assert len(events) == 1 + 16
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    assert all(e["usage"] is None for e in events)


async def test_no_finish_unstreamed_has_a_null_finish_reason(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(), headers=faulted("no-finish")) as resp:
        payload = await resp.json()

    assert payload["choices"][0]["finish_reason"] is None
    assert payload["choices"][0]["message"]["content"] == "".join(completion_tokens(MESSAGES, 16))


async def test_slow_streams_at_the_given_rate(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    started = time.monotonic()
    events = await stream(http, sim, chat(stream=True, max_tokens=5), headers=faulted("slow:100"))
    took = time.monotonic() - started

    assert content_of(events) == "".join(completion_tokens(MESSAGES, 5))
    assert events[-1] == "[DONE]"
    # TTFT 20 ms, then 4 more tokens 10 ms apart; FAST's own rate would take 21 ms in all.
    assert took >= 0.060 - 0.005


async def test_echo_streams_the_request_back_in_seven_character_chunks(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    probe = "probe-0123456789abcdef"
    body = chat(stream=True, stream_options={"include_usage": True}, max_tokens=2)
    headers = {**faulted("echo"), "X-Echo-Probe": probe}
    events = await stream(http, sim, body, headers=headers)

    chunks = content_deltas(events)
    echoed = orjson.loads("".join(chunks))
    assert echoed["headers"]["X-Echo-Probe"] == probe
    assert echoed["headers"][FAULT] == "echo"
    assert echoed["body"] == body
    assert all(len(c) == 7 for c in chunks[:-1]) and 1 <= len(chunks[-1]) <= 7
    assert len(chunks) > 2  # the token cap does not clip the echo
    assert not any(probe in c for c in chunks)  # the value spans several chunks
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == len(chunks)


async def test_echo_unstreamed_is_the_message_content(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model="sim-2@echo")) as resp:
        payload = await resp.json()

    content = payload["choices"][0]["message"]["content"]
    assert orjson.loads(content)["body"] == chat(model="sim-2@echo")
    assert payload["usage"]["completion_tokens"] == math.ceil(len(content) / 7)


async def test_fault_by_model_suffix_reports_the_whole_name(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model="sim-2@503")) as resp:
        assert resp.status == 503
    events = await stream(http, sim, chat(model="sim-1@no-finish", stream=True))
    async with http.get(f"{sim.base_url}/models") as resp:
        listed = [m["id"] for m in (await resp.json())["data"]]

    assert {e["model"] for e in events} == {"sim-1@no-finish"}
    assert "[DONE]" not in events
    assert listed == ["sim-1", "sim-2"]


@pytest.mark.parametrize("model", ["gpt-4o@503", "sim-3@503", "@503", "sim-1503"])
async def test_fault_suffix_on_an_unknown_model_is_still_404(
    http: aiohttp.ClientSession, sim: SimulatedProvider, model: str
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model=model)) as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json(), param="model", code="model_not_found")


async def test_fault_from_config_applies_to_every_request(http: aiohttp.ClientSession) -> None:
    async with SimulatedProvider(SimConfig(ttft_ms=0, fault="429:0.2")) as provider:
        assert provider.fault == "429:0.2"
        async with http.post(f"{provider.base_url}/chat/completions", json=chat()) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "0.2"


async def test_runtime_fault_can_be_set_and_cleared_while_serving(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    assert sim.fault is None
    sim.fault = "503"
    async with http.post(url, json=chat()) as resp:
        assert resp.status == 503
    with pytest.raises(ValueError, match="fault"):
        sim.fault = "nope"
    assert sim.fault == "503"
    sim.fault = None
    async with http.post(url, json=chat()) as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    ("model", "header", "status"),
    [
        pytest.param("sim-1", None, 503, id="runtime"),
        pytest.param("sim-1@502", None, 502, id="model-over-runtime"),
        pytest.param("sim-1@502", "500", 500, id="header-over-model"),
        pytest.param("sim-1", "500", 500, id="header-over-runtime"),
    ],
)
async def test_fault_precedence_header_then_model_then_runtime(
    http: aiohttp.ClientSession,
    sim: SimulatedProvider,
    model: str,
    header: str | None,
    status: int,
) -> None:
    sim.fault = "503"
    headers = None if header is None else faulted(header)
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model=model), headers=headers) as resp:
        assert resp.status == status


BAD_SPECS = [
    "nope",
    "",
    "hang:1",
    "echo:7",
    "cut-after",
    "cut-after:",
    "cut-after:x",
    "cut-after:-1",
    "error-after:1.5",
    "hang-after:",
    "slow",
    "slow:0",
    "slow:fast",
    "429:",
    "429:-1",
    "429:soon",
    "503:1",
]


@pytest.mark.parametrize("spec", BAD_SPECS)
async def test_bad_fault_in_a_header_is_400_invalid_fault(
    http: aiohttp.ClientSession, sim: SimulatedProvider, spec: str
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(stream=True), headers=faulted(spec)) as resp:
        assert resp.status == 400
        assert_openai_error(await resp.json(), param=None, code="invalid_fault")


@pytest.mark.parametrize("spec", ["nope", "", "cut-after:x", "slow:0"])
async def test_bad_fault_in_a_model_name_is_400_invalid_fault(
    http: aiohttp.ClientSession, sim: SimulatedProvider, spec: str
) -> None:
    url = f"{sim.base_url}/chat/completions"
    async with http.post(url, json=chat(model=f"sim-1@{spec}"), headers=faulted("503")) as resp:
        assert resp.status == 400
        assert_openai_error(await resp.json(), param="model", code="invalid_fault")


async def test_requests_are_counted_by_requested_model_failures_included(
    http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    url = f"{sim.base_url}/chat/completions"
    sent = [
        (chat(), None, 200),
        (chat(stream=True), None, 200),
        (chat(model="sim-1@503"), None, 503),
        (chat(model="sim-2"), faulted("500"), 500),
        (chat(model="gpt-4o"), None, 404),
        (chat(model="sim-1@nope"), None, 400),
        ({"messages": MESSAGES}, None, 400),
    ]
    for body, headers, status in sent:
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == status
    async with http.post(url, data=b"{not json") as resp:
        assert resp.status == 400
    async with http.get(f"{sim.base_url}/models") as resp:
        assert resp.status == 200

    assert sim.requests == Counter(
        {"sim-1": 2, "sim-1@503": 1, "sim-2": 1, "gpt-4o": 1, "sim-1@nope": 1, "": 2}
    )
    assert sim.total_requests == 8


async def test_requests_refused_for_the_key_are_counted(
    http: aiohttp.ClientSession, keyed: SimulatedProvider
) -> None:
    url = f"{keyed.base_url}/chat/completions"
    for authorization in ("Bearer sk-sim-wrong", "Bearer sk-sim-secret"):
        headers = {"Authorization": authorization}
        async with http.post(url, json=chat(model="sim-1@503"), headers=headers) as resp:
            assert resp.status in (401, 503)
    async with http.get(f"{keyed.base_url}/models") as resp:
        assert resp.status == 401

    assert keyed.requests == Counter({"sim-1@503": 2})
    assert keyed.total_requests == 2
