"""The OpenAI-compatible relay: `POST /v1/chat/completions` and `GET /v1/models`.

Authenticated by Bullpen API keys (or a session); `model` names a model route, a
`provider/model`, or a model that one provider of the workspace offers. Every call goes through
the gateway's router, so fallback, timeouts, breakers and key redaction apply; usage and cost
are written to the ledger against the caller (its key, user or agent), without holding up
the call's end.

Streaming answers start once the first content has arrived: until then a failure is still an
ordinary HTTP error (problem+json, with an OpenAI-style `error` member too). A failure after
content ends the stream with an `error` event and no `[DONE]`, which OpenAI clients raise.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, Literal
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
)

from bullpen.api import docs
from bullpen.api.deps import (
    ServicesDep,
    caller_with,
    check_json,
    require,
    require_json,
    services_of,
)
from bullpen.api.eventstream import EventStream
from bullpen.api.schemas import integral
from bullpen.app import Services
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.errors import BullpenError, ProviderIncomplete
from bullpen.gateway.router import Call

MAX_MESSAGES = 2000
MAX_OUTPUT_TOKENS = 1_000_000
# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
OutputTokens = Annotated[
    int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True), BeforeValidator(integral)
]
_DONE = b"data: [DONE]\n\n"
# What a header value may carry as is: visible ASCII, except `%` (the escape itself).
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def _printable(model: str) -> str:
    """Refuse names no model has (issue 19, finding 8d): control characters (CR/LF among
    them), line and paragraph separators, format characters; checked before any provider
    call, so a caller's name can smuggle nothing into a header, a log line or a bill."""
    if not model.isprintable():
        raise ValueError("must be printable: no control, separator or format characters")
    return model


ModelName = Annotated[str, AfterValidator(_printable)]


class _Message(BaseModel):
    """Fields besides `role` and `content` (names, tool calls) pass through to the provider."""

    model_config = ConfigDict(extra="allow")


class SystemMessage(_Message):
    """Instructions."""

    role: Literal["system"]
    content: str


class DeveloperMessage(_Message):
    """Instructions (OpenAI's newer name for `system`)."""

    role: Literal["developer"]
    content: str


class UserMessage(_Message):
    """The user's turn. Content parts (images, audio) are not supported: text only."""

    role: Literal["user"]
    content: str


class AssistantMessage(_Message):
    """An earlier answer: text, or tool calls with no text."""

    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ToolMessage(_Message):
    """A tool's result for one of the assistant's tool calls."""

    role: Literal["tool"]
    content: str
    tool_call_id: str = Field(min_length=1, max_length=200)


ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


class StreamOptions(BaseModel):
    """Streaming options."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False


class ChatRequest(BaseModel):
    """An OpenAI chat completion request. Other OpenAI fields (temperature, tools, ...) are
    passed to the provider as given; the provider refuses what it does not support (400)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [{"model": "sim-1", "messages": [{"role": "user", "content": "Hello"}]}]
        },
    )

    model: ModelName = Field(
        min_length=1,
        max_length=300,
        description="Route, provider/model or model; printable characters only",
    )
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = Field(default=None, description="Only one choice is supported.")
    max_tokens: OutputTokens | None = None
    max_completion_tokens: OutputTokens | None = None

    def upstream(self) -> dict[str, Any]:
        """The body for the provider, without `model` and streaming (the gateway sets those)."""
        body = self.model_dump(
            exclude={"model", "stream", "stream_options"}, exclude_none=True, by_alias=True
        )
        return body


class ModelCard(BaseModel):
    """A model callers may name."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelCards(BaseModel):
    """The models of the caller's workspace: routes first, then `provider/model`s."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


router = APIRouter(prefix="/v1", tags=["relay"])
Caller = Annotated[Principal, require(Permission.LLM_USE)]


@router.get(
    "/models",
    operation_id="listModels",
    response_model=ModelCards,
    responses=docs.problems(401, 403, 429, 503),
    summary="List models (OpenAI-compatible)",
)
async def list_models(principal: Caller, svc: ServicesDep) -> ModelCards:
    """Every name `model` accepts in this workspace."""
    catalog = await svc.directory.catalog(principal.workspace_id)
    return ModelCards(
        data=[ModelCard(id=name, created=0, owned_by="bullpen") for name in catalog.model_ids()]
    )


async def chat_completions(body: ChatRequest, principal: Caller, svc: ServicesDep) -> Response:
    """Call a model through the gateway, streamed or not."""
    catalog = await svc.directory.catalog(principal.workspace_id)
    chain = catalog.resolve(body.model)
    svc.relay_slots.take(str(principal.workspace_id), principal.scope_id)
    call = Call()
    chunks = svc.gateway.router.stream(chain, body.upstream(), call)
    settle = _Settle(svc, principal, call, chunks)
    answer = _Answer(body.model)
    try:
        if not body.stream:
            async for batch in chunks:
                for chunk in batch:
                    answer.absorb(chunk)
            settle()
            return Response(
                orjson.dumps(answer.completion(call)),
                media_type="application/json",
                headers=_served_headers(call),
            )
        opening = await _until_content(chunks)
    except BaseException:
        settle()
        raise
    # Whatever ends the request (its end, a client gone before the stream began, a crash)
    # settles the call once.
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: settle())
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return EventStream(
        _sse(settle, answer, opening, chunks, include_usage),
        headers={"Cache-Control": "no-cache", **_served_headers(call)},
        last=_DONE,  # the frame ending in `[DONE]` is the last
    )


async def chat_request(request: Request) -> Response:
    """`chat_completions` with its parameters resolved here, as FastAPI would resolve them
    (415, then the caller: 401, 429, 403; then the body: 422), for a fraction of the cost."""
    check_json(request)
    svc = services_of(request)
    principal = await caller_with(request, svc, Permission.LLM_USE)
    try:
        body = ChatRequest.model_validate_json(await request.body())
    except ValidationError as err:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
        ) from None
    return await chat_completions(body, principal, svc)


class _ChatRoute(APIRoute):
    """FastAPI documents `chat_completions` from its signature (and `access_of` reads its
    `require`), but requests go to `chat_request`: solving the dependencies generically cost
    more CPU than the rest of a relayed call's set-up. (Most requests do not even come this
    way: the app serves `chat_request` directly, ahead of its middleware; see `BullpenApp`.)"""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return chat_request


router.add_api_route(
    "/chat/completions",
    chat_completions,
    methods=["POST"],
    route_class_override=_ChatRoute,
    operation_id="createChatCompletion",
    dependencies=[Depends(require_json)],
    responses={
        200: {
            "description": "A chat completion, or with `stream: true` a text/event-stream of "
            "chat completion chunks ending in `data: [DONE]`",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        **docs.problems(400, 401, 403, 404, 413, 415, 422, 429, 503),
        402: {"description": "The provider's spend limit is reached"},
        502: {"description": "The provider failed, refused Bullpen's key, or broke mid-answer"},
        504: {"description": "The provider sent no first token in time"},
    },
    summary="Create a chat completion (OpenAI-compatible)",
)


class _Settle:
    """Ends a relay call exactly once: closes the upstream stream if still open, records the
    usage against the caller, and gives back the stream slot."""

    __slots__ = ("_call", "_chunks", "_done", "_principal", "_svc")

    def __init__(
        self,
        svc: Services,
        principal: Principal,
        call: Call,
        chunks: AsyncGenerator[list[dict[str, Any]], None],
    ) -> None:
        self._svc = svc
        self._principal = principal
        self._call = call
        self._chunks = chunks
        self._done = False

    @property
    def call(self) -> Call:
        """The gateway call being settled."""
        return self._call

    def __call__(self) -> None:
        """The call ended: close upstream if still open, queue its usage for the ledger (which
        commits it within moments; the caller does not wait for that), free the slot."""
        if self._done:
            return
        self._done = True
        if getattr(self._chunks, "ag_frame", None) is not None:
            # Unfinished (a client gone mid-stream): closing it closes the upstream request.
            _background(self._chunks.aclose())
        _record(self._svc, self._principal, self._call)
        self._svc.relay_slots.give_back(str(self._principal.workspace_id), self._principal.scope_id)


_closing: set[asyncio.Task[None]] = set()


def _background(closing: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(closing)
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _until_content(
    chunks: AsyncIterator[list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The first batch: it holds the first content (the router yields nothing before it)."""
    async for batch in chunks:
        return batch
    return []


async def _sse(
    settle: _Settle,
    answer: _Answer,
    opening: list[dict[str, Any]],
    chunks: AsyncIterator[list[dict[str, Any]]],
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    # One yield (one socket write) per upstream read: what arrived together leaves together.
    try:
        yield answer.frame([{"index": 0, "delta": {"role": "assistant", "content": ""}}]) + (
            answer.frames(opening)
        )
        try:
            async for batch in chunks:
                frames = answer.frames(batch)
                if frames:
                    yield frames
        except BullpenError as err:
            # Content went out already: say so in-band, and never send [DONE].
            yield _error_frame(err)
            return
        settle()
        yield (answer.usage_frame(settle.call) if include_usage else b"") + _DONE
    finally:
        settle()


def _error_frame(err: BullpenError) -> bytes:
    code = err.slug if not isinstance(err, ProviderIncomplete) else "provider-incomplete"
    return (
        b"data: "
        + orjson.dumps({"error": {"message": err.detail, "type": code, "code": code}})
        + b"\n\n"
    )


class _Answer:
    """Chunks in our own envelope (our id, the model name the caller used), and the whole
    answer for non-streaming callers."""

    __slots__ = ("_created", "_head", "_id", "_model", "finish_reason", "text", "tool_calls")

    def __init__(self, model: str) -> None:
        self._id = "chatcmpl-" + secrets.token_hex(12)
        self._created = int(time.time())
        self._model = model
        envelope = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": model,
        }
        self._head = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":'
        self.text: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def frame(self, choices: list[dict[str, Any]]) -> bytes:
        """One SSE frame carrying `choices`."""
        return self._head + orjson.dumps(choices) + b"}\n\n"

    def frames(self, batch: list[dict[str, Any]]) -> bytes:
        """The frames for upstream chunks (its usage-only chunk is replaced by ours)."""
        return b"".join(self.frame(c["choices"]) for c in batch if c.get("choices"))

    def usage_frame(self, call: Call) -> bytes:
        """The trailing usage chunk OpenAI sends with `include_usage`."""
        return self._head + b"[]" + b',"usage":' + orjson.dumps(_usage(call)) + b"}\n\n"

    def absorb(self, chunk: dict[str, Any]) -> None:
        """Collect a chunk into the whole answer (text, tool calls, finish reason)."""
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if isinstance(content, str):
            self.text.append(content)
        for piece in delta.get("tool_calls") or ():
            if not isinstance(piece, dict):
                continue
            index = piece.get("index", 0)
            whole = self.tool_calls.setdefault(
                index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if piece.get("id"):
                whole["id"] = piece["id"]
            function = piece.get("function") or {}
            whole["function"]["name"] += function.get("name") or ""
            whole["function"]["arguments"] += function.get("arguments") or ""

    def completion(self, call: Call) -> dict[str, Any]:
        """The non-streaming answer."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": _usage(call),
        }


def _usage(call: Call) -> dict[str, Any]:
    return {
        "prompt_tokens": call.input_tokens,
        "completion_tokens": call.output_tokens,
        "total_tokens": call.input_tokens + call.output_tokens,
        "prompt_tokens_details": {"cached_tokens": call.cached_input_tokens},
    }


def _served_headers(call: Call) -> dict[str, str]:
    served = call.served_by
    if served is None:
        return {}
    # The catalog's model, not the caller's words; percent-encoded (UTF-8) beyond visible
    # ASCII, so any name a provider lists makes a valid header.
    return {
        "X-Bullpen-Provider": served.provider.name,
        "X-Bullpen-Model": quote(served.model, safe=_HEADER_SAFE),
    }


def _record(svc: Services, principal: Principal, call: Call) -> asyncio.Future[None] | None:
    """The call's usage in the ledger, against the caller; None if it used nothing."""
    served = call.served_by
    if served is None or call.cost_usd is None:
        return None
    return svc.ledger.record(
        {
            "workspace_id": principal.workspace_id,
            "run_id": None,
            "agent_id": principal.agent_id,
            "user_id": principal.user_id,
            "api_key_id": principal.api_key_id,
            "provider": served.provider.name,
            "model": call.model or served.model,
            "input_tokens": call.input_tokens,
            "cached_input_tokens": call.cached_input_tokens,
            "output_tokens": call.output_tokens,
            "cost_usd": call.cost_usd,
            "created_at": svc.clock(),
        }
    )
