"""The simulated OpenAI-compatible provider, driven over real sockets."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from bullpen.bench.simprovider import (
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
    http: aiohttp.ClientSession, sim: SimulatedProvider, body: dict[str, Any]
) -> list[Any]:
    async with http.post(f"{sim.base_url}/chat/completions", json=body) as resp:
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
    ],
)
def test_sim_config_rejects_bad_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**fields)


def test_sim_config_accepts_the_edges() -> None:
    SimConfig(ttft_ms=0, tokens_per_second=0.001, response_tokens=1)
    SimConfig(response_tokens=100_000, api_key="k", models=("a", "b"))
