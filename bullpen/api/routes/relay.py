"""The OpenAI-compatible relay: `POST /v1/chat/completions` and `GET /v1/models`.

Authenticated by Bullpen API keys (or a session); `model` names a model route, a
`provider/model`, or a model that one provider of the workspace offers. Every call goes through
the gateway's router, so fallback, timeouts, breakers and key redaction apply; usage and cost
are written to the ledger against the caller (its key, user or agent), without holding up
the call's end.

Streaming answers start once the first content has arrived: until then a failure is still an
ordinary HTTP error (problem+json, with an OpenAI-style `error` member too). A failure after
content ends the stream with an `error` event and no `[DONE]`, which OpenAI clients raise.
This module is the HTTP side; the call itself, its answer and its metering are in
`bullpen.gateway.relay`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
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
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.gateway.relay import DONE as _DONE
from bullpen.gateway.relay import RelayAnswer, open_call, sse_frames, until_content
from bullpen.gateway.router import Call

MAX_MESSAGES = 2000
MAX_OUTPUT_TOKENS = 1_000_000
# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
OutputTokens = Annotated[
    int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True), BeforeValidator(integral)
]
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
    call, chunks, settle = await open_call(
        svc.directory,
        svc.gateway.router,
        principal,
        body.model,
        body.upstream(),
        ledger=svc.ledger,
        slots=svc.relay_slots,
        clock=svc.clock,
    )
    answer = RelayAnswer(body.model)
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
        opening = await until_content(chunks)
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
        sse_frames(settle, answer, opening, chunks, include_usage),
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
