"""The OpenAI-compatible relay: `POST /v1/chat/completions` and `GET /v1/models`.

Authenticated by Bullpen API keys (or a session); `model` names a model route, a
`provider/model`, or a model that one provider of the workspace offers. Every call goes through
the gateway's router, so fallback, timeouts, breakers and key redaction apply; usage and cost
are written to the ledger against the caller (its key, user or agent), without holding up
the call's end.

Streaming answers start once the first content has arrived: until then a failure is still an
ordinary HTTP error (problem+json, with an OpenAI-style `error` member too). A failure after
content ends the stream with an `error` event and no `[DONE]`, which OpenAI clients raise.
This module is the HTTP side (its schemas are in `bullpen.api.schemas.relay`); the call itself,
its answer and its metering are in `bullpen.gateway.relay`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Depends, Request, Response

from bullpen.api import docs
from bullpen.api.deps import (
    ServicesDep,
    caller_with,
    check_json,
    require,
    require_json,
    services_of,
)
from bullpen.api.direct import body_as, served_by
from bullpen.api.eventstream import EventStream
from bullpen.api.schemas.relay import (
    HEADER_SAFE,
    ChatRequest,
    ModelCard,
    ModelCards,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.gateway.relay import DONE as _DONE
from bullpen.gateway.relay import RelayAnswer, open_call, sse_frames, until_content, whole_answer
from bullpen.gateway.router import Call

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
    upstream = body.upstream()
    tracing = svc.tracing
    answer = RelayAnswer(body.model, keep=tracing is not None and tracing.capture)
    observe = None
    if tracing is not None:  # the call's span: the caller's key id, never the key
        observe = tracing.observer(
            body.model,
            {
                "bullpen.workspace.id": str(principal.workspace_id),
                **_caller_attributes(principal),
            },
            request=upstream,
            output=answer.message,
        )
    call, chunks, settle = await open_call(
        svc.directory,
        svc.gateway.router,
        principal,
        body.model,
        upstream,
        ledger=svc.ledger,
        slots=svc.relay_slots,
        clock=svc.clock,
        rates=svc.relay_rates,
        budgets=svc.relay_budgets,
        observe=observe,
    )
    try:
        if not body.stream:
            await whole_answer(settle, answer, chunks)
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
    (415, then the caller: 401, 429, 403; then the body: 422), for a fraction of the cost.
    (Most requests do not even come through the router: the app serves this directly, ahead
    of its middleware; see `BullpenApp`.)"""
    check_json(request)
    svc = services_of(request)
    principal = await caller_with(request, svc, Permission.LLM_USE)
    body = body_as(ChatRequest, await request.body())
    return await chat_completions(body, principal, svc)


router.add_api_route(
    "/chat/completions",
    chat_completions,
    methods=["POST"],
    route_class_override=served_by(chat_request),
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


def _caller_attributes(principal: Principal) -> dict[str, str]:
    """Who called, as span attributes: ids only."""
    if principal.api_key_id is not None:
        return {"bullpen.api_key.id": str(principal.api_key_id)}
    return {"bullpen.user.id": str(principal.user_id)} if principal.user_id else {}


def _served_headers(call: Call) -> dict[str, str]:
    served = call.served_by
    if served is None:
        return {}
    # The catalog's model, not the caller's words; percent-encoded (UTF-8) beyond visible
    # ASCII, so any name a provider lists makes a valid header.
    return {
        "X-Bullpen-Provider": served.provider.name,
        "X-Bullpen-Model": quote(served.model, safe=HEADER_SAFE),
    }
