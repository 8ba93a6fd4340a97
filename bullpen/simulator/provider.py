"""A simulated OpenAI-compatible provider: deterministic text at a configured TTFT and token rate.

It serves `POST /v1/chat/completions` (streaming and not) and `GET /v1/models` in OpenAI's wire
format, so the gateway and the benchmarks can run against real sockets without a real LLM.
The completion for a prompt is a pure function of its messages (`completion_tokens`), so tests
can compute the exact expected text. Every response carries `X-Bullpen-Simulated: true`.

Sampling fields (`temperature`, `top_p`, `n`, `seed`, `stop`, `tools`, ...) are accepted and
ignored: the text depends only on the messages and on the token cap.

Faults make it misbehave the way real providers do, so timeouts, retries and fallbacks can be
tested over real sockets. A request's fault comes from, highest precedence first: the header
`X-Bullpen-Sim-Fault: <spec>`; a model named `<model>@<spec>` (e.g. `sim-1@503`, answered under
that whole name, while `/v1/models` lists only the plain names); the provider's `fault`, which
starts as `SimConfig.fault` and may be changed while it runs. Faults apply to valid requests: a
malformed body or an unknown base model is refused as usual, and a bad spec is a 400 with code
`invalid_fault`. The spec grammar and what each fault does are in `bullpen.simulator.faults`, and
how a request body is read and checked is in `bullpen.simulator.request`.
`SimulatedProvider.requests` counts every chat completion request by the model it named, faulted
and refused ones included.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from bullpen import gcpolicy
from bullpen.simulator.faults import (
    ERROR_FRAME,
    NO_FAULT,
    End,
    Fault,
    cut,
    echo_tokens,
    hang,
    internal_error,
    parse_fault,
)
from bullpen.simulator.request import (
    MAX_BODY_BYTES,
    ApiError,
    ChatRequest,
    error_response,
    parse_chat,
    read_json,
)
from bullpen.simulator.script import ScriptError, ToolCall, scripted_turn

__all__ = ["SimConfig", "SimulatedProvider", "build_app", "completion_tokens", "serve_forever"]

_MAX_RESPONSE_TOKENS: Final = 100_000
_FINGERPRINT: Final = "fp_bullpen_sim"
_OWNER: Final = "bullpen-simulator"
# A fixed date (2025-01-01) rather than the start time, so /v1/models is byte-for-byte stable.
_MODEL_CREATED: Final = 1_735_689_600
# Streams still open at shutdown are cut after this grace; a simulator owes them nothing more.
_SHUTDOWN_GRACE_S: Final = 1.0
# aiohttp's default of 128 overflows when a benchmark opens thousands of streams at once, and
# the dropped SYNs come back as whole seconds of retransmission delay in the measured TTFT.
_LISTEN_BACKLOG: Final = 4096
_DONE_FRAME: Final = b"data: [DONE]\n\n"
_CHAT_PATH: Final = "/v1/chat/completions"
_FAULT_HEADER: Final = "X-Bullpen-Sim-Fault"
_VOCABULARY: Final = tuple(
    """
    the of and to in is it that was for on are with as his they be at one have this from or
    had by word but what some we can out other were all there when up use your how said an
    each she which do their time if will way about many then them write would like so these
    her long make thing see him two has look more day could go come did number sound no most
    people my over know water than call first who may down side been now find any new work
    part take get place made live where after back little only round man year came show every
    good me give our under name very through just form sentence great think say help low line
    differ turn cause much mean before move right boy old too same tell does set three want air
    well also play small end put home read hand port large spell add even land here must big
    high such follow act why ask men change went light kind off need house picture try us again
    animal point mother world near build self earth father head stand own page should country
    found answer school grow study still learn plant cover food sun four between state keep eye
    never last let thought city tree cross farm hard start might story saw far sea draw left
    """.split()
)


@dataclass(frozen=True)
class SimConfig:
    """How the simulated provider behaves: latency, speed, length, models, key and fault."""

    ttft_ms: float = 380.0  # the time to first token the reference benchmark reported
    tokens_per_second: float = 50.0
    response_tokens: int = 64
    models: tuple[str, ...] = ("sim-1",)
    api_key: str | None = None
    fault: str | None = None  # a fault spec (see bullpen.simulator.faults) for every request

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttft_ms) and self.ttft_ms >= 0):
            raise ValueError(f"ttft_ms must be a finite number >= 0, got {self.ttft_ms!r}")
        if not (math.isfinite(self.tokens_per_second) and self.tokens_per_second > 0):
            raise ValueError(
                f"tokens_per_second must be a finite number > 0, got {self.tokens_per_second!r}"
            )
        if (
            isinstance(self.response_tokens, bool)
            or not isinstance(self.response_tokens, int)
            or not 1 <= self.response_tokens <= _MAX_RESPONSE_TOKENS
        ):
            raise ValueError(
                f"response_tokens must be an integer between 1 and {_MAX_RESPONSE_TOKENS}, "
                f"got {self.response_tokens!r}"
            )
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError(
                f"models must be a non-empty tuple of model names, got {self.models!r}"
            )
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be a non-empty string, or None for no authentication")
        if self.fault is not None:
            if not isinstance(self.fault, str):
                raise ValueError(f"fault must be a fault spec or None, got {self.fault!r}")
            parse_fault(self.fault)


def completion_tokens(messages: Sequence[Mapping[str, Any]], n: int) -> list[str]:
    """Return the first `n` tokens the simulator answers `messages` with."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # JSON of [role, content] pairs is unambiguous, so distinct conversations get distinct seeds.
    transcript = orjson.dumps([[m["role"], m.get("content")] for m in messages])
    seed = int.from_bytes(hashlib.blake2b(transcript, digest_size=16).digest(), "big")
    # Deterministic filler text, not a secret, so a seeded PRNG is exactly right.
    words = random.Random(seed).choices(_VOCABULARY, k=n)  # noqa: S311
    return [word if i == 0 else " " + word for i, word in enumerate(words)]


def _words(text: str) -> list[str]:
    """A scripted text as the tokens it streams in (one per word, spaces kept)."""
    words = text.split(" ")
    return [word if i == 0 else " " + word for i, word in enumerate(words)] if text else []


def _prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    # An approximation of a real tokenizer: words plus OpenAI's per-message framing overhead.
    return sum(len((m.get("content") or "").split()) + 3 for m in messages)


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status in (404, 405):
            message = f"Invalid URL ({request.method} {request.path})"
        else:
            message = exc.text or exc.reason
        return error_response(exc.status, message)


def _require_api_key(
    api_key: str, on_refusal: Callable[[web.Request], Awaitable[None]]
) -> Middleware:
    expected = api_key.encode()

    @web.middleware
    async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            message = "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
        # surrogateescape round-trips whatever bytes aiohttp decoded the header from.
        elif not hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), expected):
            message = "Incorrect API key provided."
        else:
            return await handler(request)
        await on_refusal(request)
        raise ApiError(401, message, code="invalid_api_key")

    return require_api_key


async def _label_simulated(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Bullpen-Simulated"] = "true"


async def _sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def _request_fault(spec: str, param: str | None) -> Fault:
    try:
        return parse_fault(spec)
    except ValueError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_fault") from exc


class _StreamFrames:
    """The SSE frames of one streamed completion, with the constant parts serialised once."""

    __slots__ = ("_envelope", "content_head", "content_tail", "include_usage")

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self._envelope: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": _FINGERPRINT,
        }
        self.include_usage = include_usage
        # A JSON string cannot contain this unescaped, so it splits the frame exactly once.
        marker = b'"delta":{"content":""}'
        head, tail = self._chunk({"content": ""}, None).split(marker)
        self.content_head = head + b'"delta":{"content":'
        self.content_tail = b"}" + tail

    def delta(self, delta: dict[str, Any]) -> bytes:
        """Return a chunk carrying `delta` (tool calls)."""
        return self._chunk(delta, None)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._envelope, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI sends an explicit null until the usage chunk
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def role(self) -> bytes:
        """Return the opening chunk that announces the assistant role."""
        return self._chunk({"role": "assistant", "content": ""}, None)

    def finish(self, finish_reason: str) -> bytes:
        """Return the chunk that closes the choice."""
        return self._chunk({}, finish_reason)

    def usage(self, usage: Mapping[str, int]) -> bytes:
        """Return the trailing chunk with token counts and no choices."""
        return b"data: " + orjson.dumps({**self._envelope, "choices": [], "usage": usage}) + b"\n\n"

    def ending(self, end: End, finish_reason: str, usage: Mapping[str, int]) -> bytes:
        """Return the frames that follow the content tokens for a stream that ends with `end`."""
        if end is End.FINISH:
            usage_chunk = self.usage(usage) if self.include_usage else b""
            return self.finish(finish_reason) + usage_chunk + _DONE_FRAME
        return ERROR_FRAME if end is End.ERROR else b""


class _Simulator:
    """The request handlers, bound to one configuration, with the counts and fault they share."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.requests: Counter[str] = Counter()
        self.streaming = 0  # streamed answers being sent now
        self.abandoned = 0  # streamed answers whose client hung up before the end
        self.tokens_sent = 0  # content tokens of streamed answers written to their clients
        self.fault = None if config.fault is None else parse_fault(config.fault)
        self._models = frozenset(config.models)
        self._ttft_s = config.ttft_ms / 1000
        self._interval_s = 1 / config.tokens_per_second
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": _MODEL_CREATED, "owned_by": _OWNER}
                    for m in config.models
                ],
            }
        )

    def _count(self, body: object) -> None:
        model = body.get("model") if isinstance(body, dict) else None
        self.requests[model if isinstance(model, str) else ""] += 1

    async def count_refusal(self, request: web.Request) -> None:
        """Count a request the API-key check turned away, if it was a chat completion."""
        if request.method == "POST" and request.path == _CHAT_PATH:
            body: object = None
            with contextlib.suppress(ApiError, web.HTTPException):
                body = await read_json(request)
            self._count(body)

    def _fault_for(self, request: web.Request, chat: ChatRequest) -> Fault:
        # Later sources override earlier ones, but every spec given is checked.
        fault = self.fault
        if chat.model_fault is not None:
            fault = _request_fault(chat.model_fault, "model")
        header = request.headers.get(_FAULT_HEADER)
        if header is not None:
            fault = _request_fault(header, None)
        return NO_FAULT if fault is None else fault

    async def list_models(self, request: web.Request) -> web.Response:
        """Serve `GET /v1/models`."""
        return web.Response(body=self._models_body, content_type="application/json")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Serve `POST /v1/chat/completions`."""
        started = asyncio.get_running_loop().time()
        body: object = None
        try:
            body = await read_json(request)
        finally:
            self._count(body)
        chat = parse_chat(body, self._models)
        fault = self._fault_for(request, chat)
        if fault.refusal is not None:
            return fault.refusal(request)
        try:
            turn = scripted_turn(chat.messages)
        except ScriptError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_sim_script") from exc
        if turn is not None and turn.tool_calls:
            return await self._tool_calls(request, started, chat, turn.tool_calls)
        limit = self.config.response_tokens
        if turn is not None and turn.text is not None:
            tokens = _words(turn.text)
            finish_reason = "stop"
        elif fault.echo:
            tokens = echo_tokens(request, body)
            finish_reason = "stop"
        else:
            n = limit if chat.max_tokens is None else min(limit, chat.max_tokens)
            tokens = completion_tokens(chat.messages, n)
            finish_reason = "length" if n < limit else "stop"
        n = len(tokens)
        prompt = _prompt_tokens(chat.messages)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if fault.after is not None:
            tokens = tokens[: fault.after]
        interval_s = self._interval_s if fault.interval_s is None else fault.interval_s
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        if chat.stream:
            frames = _StreamFrames(completion_id, created, chat.model, chat.include_usage)
            ending = frames.ending(fault.end, finish_reason, usage)
            return await self._stream(request, started, tokens, frames, ending, interval_s, fault)
        if fault.end is End.HANG:
            await hang()
        await _sleep_until(started + self._ttft_s + max(len(tokens) - 1, 0) * interval_s)
        if fault.end is End.CUT:
            cut(request)
            return web.Response()  # never sent: the connection is already closing
        if fault.end is End.ERROR:
            return internal_error(request)
        completion = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": chat.model,
            "system_fingerprint": _FINGERPRINT,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(tokens)},
                    "logprobs": None,
                    "finish_reason": None if fault.end is End.CLOSE else finish_reason,
                }
            ],
            "usage": usage,
        }
        return web.Response(body=orjson.dumps(completion), content_type="application/json")

    async def _tool_calls(
        self, request: web.Request, started: float, chat: ChatRequest, calls: Sequence[ToolCall]
    ) -> web.StreamResponse:
        """Answer with a scripted turn's tool calls (each call's arguments in two pieces)."""
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        ids = [f"call_{secrets.token_hex(8)}" for _ in calls]
        n = sum(len(call.arguments) // 4 + 1 for call in calls)
        prompt = _prompt_tokens(chat.messages)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        await _sleep_until(started + self._ttft_s)
        if not chat.stream:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call_id, call in zip(ids, calls, strict=True)
                ],
            }
            completion = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": chat.model,
                "system_fingerprint": _FINGERPRINT,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": usage,
            }
            return web.Response(body=orjson.dumps(completion), content_type="application/json")
        frames = _StreamFrames(completion_id, created, chat.model, chat.include_usage)
        pending = [frames.role()]
        for index, (call_id, call) in enumerate(zip(ids, calls, strict=True)):
            head = {"index": index, "id": call_id, "type": "function"}
            half = len(call.arguments) // 2
            pending.append(
                frames.delta(
                    {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
                )
            )
            for piece in (call.arguments[:half], call.arguments[half:]):
                pending.append(
                    frames.delta(
                        {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                    )
                )
        pending.append(frames.ending(End.FINISH, "tool_calls", usage))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await response.write(b"".join(pending))
            await response.write_eof()
        return response

    async def _stream(
        self,
        request: web.Request,
        started: float,
        tokens: list[str],
        frames: _StreamFrames,
        ending: bytes,
        interval_s: float,
        fault: Fault,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        first_due = started + self._ttft_s
        loop = asyncio.get_running_loop()
        self.streaming += 1
        try:
            await _sleep_until(first_due)
            pending = [] if fault.silent else [frames.role()]
            queued = 0  # tokens in `pending`
            for i, token in enumerate(tokens):
                # Each token has a fixed slot on the schedule, so lateness never accumulates;
                # tokens already overdue (a loaded loop) go out together in one write.
                delay = first_due + i * interval_s - loop.time()
                if delay > 0:
                    await response.write(b"".join(pending))
                    pending.clear()
                    self.tokens_sent += queued
                    queued = 0
                    await asyncio.sleep(delay)
                if fault.stamp:
                    token = f"@{time.time():.6f};"
                pending += (frames.content_head, orjson.dumps(token), frames.content_tail)
                queued += 1
            pending.append(ending)
            await response.write(b"".join(pending))
            self.tokens_sent += queued
            if fault.end is End.CUT:
                cut(request)
            elif fault.end is End.HANG:
                await hang()
            else:
                await response.write_eof()
        except ConnectionResetError:
            self.abandoned += 1  # the client hung up; there is nobody left to tell
        except asyncio.CancelledError:
            self.abandoned += 1  # the client hung up while this handler waited
            raise
        finally:
            self.streaming -= 1
        return response


def build_app(config: SimConfig) -> web.Application:
    """Build the simulator's aiohttp application for `config`."""
    return _build_app(_Simulator(config))


def _build_app(simulator: _Simulator) -> web.Application:
    middlewares: list[Middleware] = [_openai_errors]
    if simulator.config.api_key is not None:
        middlewares.append(_require_api_key(simulator.config.api_key, simulator.count_refusal))
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
    app.router.add_post(_CHAT_PATH, simulator.chat_completions)
    app.router.add_get("/v1/models", simulator.list_models)
    app.on_response_prepare.append(_label_simulated)
    return app


class SimulatedProvider:
    """The simulator listening on a real socket for the length of an `async with` block."""

    def __init__(self, config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.host = host
        self.port = port  # 0 asks the OS for a free port; the bound one is known after entry
        self._simulator = _Simulator(config)
        self._runner: web.AppRunner | None = None

    @property
    def fault(self) -> str | None:
        """The fault spec for requests that name none themselves; None for a healthy provider."""
        return None if self._simulator.fault is None else self._simulator.fault.spec

    @fault.setter
    def fault(self, spec: str | None) -> None:
        self._simulator.fault = None if spec is None else parse_fault(spec)

    @property
    def requests(self) -> Counter[str]:
        """Chat completion requests received, by the model they named ("" for none)."""
        return self._simulator.requests

    @property
    def total_requests(self) -> int:
        """Return how many chat completion requests were received."""
        return self._simulator.requests.total()

    @property
    def streaming(self) -> int:
        """Streamed answers being sent now."""
        return self._simulator.streaming

    @property
    def abandoned(self) -> int:
        """Streamed answers whose client hung up before the end."""
        return self._simulator.abandoned

    @property
    def tokens_sent(self) -> int:
        """Content tokens of streamed answers written to their clients (what a provider would
        bill as output for them)."""
        return self._simulator.tokens_sent

    @property
    def base_url(self) -> str:
        """Return the OpenAI-style base URL, ending in `/v1`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def __aenter__(self) -> SimulatedProvider:
        if self._runner is not None:
            raise RuntimeError("this SimulatedProvider is already running")
        # Cancelling a disconnected client's handler frees its sleeping stream at once.
        runner = web.AppRunner(
            _build_app(self._simulator),
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_GRACE_S,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port, backlog=_LISTEN_BACKLOG).start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]
        self._runner = runner
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def serve_forever(config: SimConfig, host: str, port: int) -> None:
    """Serve the simulator on `host:port` until cancelled."""
    async with SimulatedProvider(config, host, port):
        gcpolicy.settle()
        await asyncio.Event().wait()
