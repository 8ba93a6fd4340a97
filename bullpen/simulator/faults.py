"""Fault modes of the simulated provider: the spec grammar, its parser and the canned answers.

A fault makes `bullpen.simulator.provider` misbehave the way real providers do, so timeouts,
retries and fallbacks can be tested over real sockets (how a request picks its fault is in that
module's docstring). A spec is `name` or `name:arg`:

    hang           200 and SSE headers, then nothing until the client leaves
    hang-after:N   N content tokens after the role chunk, then nothing until the client leaves
    429, 429:S     429 rate_limit_exceeded with `Retry-After: S`, S as given (default 1)
    500, 502, 503  that status, with an OpenAI server_error body
    529            529 with Anthropic's overloaded_error body
    spend-limit    429 insufficient_quota, OpenAI's out-of-credit answer, with no Retry-After
    401            401 invalid_api_key
    400            400 invalid_request_error
    echo-error     401 whose message quotes the Authorization header, as real providers do
    error-after:N  N content tokens, a `data: {"error": ...}` frame, then a clean end
    cut-after:N    N content tokens, then the connection closes with the body unfinished
    no-finish      every token, then a clean end with no finish chunk, usage chunk or [DONE]
    slow:TPS       TPS tokens per second (a decimal > 0) instead of the configured rate
    echo           the text is the JSON of {"headers": ..., "body": ...} of the request, sent
                   in 7-character tokens whatever the token cap
    stamp          not a fault: each token is the wall-clock time it is sent, `@<unix s>;`
                   (streamed answers only), so a reader can time delivery end to end

N is a whole number (0 allowed; beyond the completion's length it means all of it). Status
faults answer at once; the others keep the TTFT. Not streamed: `hang` and `hang-after` never
answer, `cut-after` closes the connection instead of answering, `error-after` answers 500,
`no-finish` answers `finish_reason: null`.

Parsed specs are cached (`parse_fault`), and canned error bodies are serialised once, when their
`Fault` is built, so a fault costs a request next to nothing.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

__all__ = [
    "ERROR_FRAME",
    "NO_FAULT",
    "End",
    "Fault",
    "Refusal",
    "cut",
    "echo_tokens",
    "hang",
    "internal_error",
    "parse_fault",
]

_ECHO_CHUNK_CHARS: Final = 7


class End(enum.Enum):
    """How a stream ends once its content tokens are out."""

    FINISH = enum.auto()  # the healthy ending: finish chunk, usage chunk if asked for, [DONE]
    CLOSE = enum.auto()  # a clean end of body and nothing else (no-finish)
    ERROR = enum.auto()  # an in-band error frame, then a clean end (error-after)
    CUT = enum.auto()  # the connection closed with the body unfinished (cut-after)
    HANG = enum.auto()  # nothing more until the client leaves (hang, hang-after)


Refusal = Callable[[web.Request], web.Response]


@dataclass(frozen=True, slots=True)
class Fault:
    """What a fault spec changes about a response; the defaults change nothing."""

    spec: str
    refusal: Refusal | None = None  # answered at once, instead of a completion
    silent: bool = False  # not even the role chunk goes out (hang)
    after: int | None = None  # content tokens sent before `end`; None sends them all
    end: End = End.FINISH
    interval_s: float | None = None  # seconds per token, instead of the configured rate
    echo: bool = False
    stamp: bool = False


NO_FAULT: Final = Fault("")


def _openai_error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _refusal(
    status: int, error: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Refusal:
    raw = orjson.dumps(error)  # serialised once per spec, not once per request

    def refuse(request: web.Request) -> web.Response:
        return web.Response(
            status=status, body=raw, headers=headers, content_type="application/json"
        )

    return refuse


def _rate_limited(retry_after: str) -> Refusal:
    message = f"Rate limit reached for requests. Please try again in {retry_after}s."
    error = _openai_error(message, "requests", "rate_limit_exceeded")
    return _refusal(429, error, {"Retry-After": retry_after})


def _echo_key_error(request: web.Request) -> web.Response:
    message = f"Incorrect API key provided: {request.headers.get('Authorization', '')}."
    error = _openai_error(message, "invalid_request_error", "invalid_api_key")
    return web.Response(status=401, body=orjson.dumps(error), content_type="application/json")


def _status_fault(
    spec: str, status: int, message: str, kind: str, code: str | None = None
) -> Fault:
    return Fault(spec, refusal=_refusal(status, _openai_error(message, kind, code)))


_SERVER_ERROR: Final = _openai_error(
    "The server had an error while processing your request. Sorry about that!", "server_error"
)
ERROR_FRAME: Final = b"data: " + orjson.dumps(_SERVER_ERROR) + b"\n\n"
internal_error = _refusal(500, _SERVER_ERROR)
_QUOTA_MESSAGE: Final = (
    "You exceeded your current quota, please check your plan and billing details."
)
_ANTHROPIC_OVERLOADED: Final = {
    "type": "error",
    "error": {"type": "overloaded_error", "message": "Overloaded"},
}
_FIXED_FAULTS: Final = {
    fault.spec: fault
    for fault in (
        Fault("hang", silent=True, after=0, end=End.HANG),
        Fault("no-finish", end=End.CLOSE),
        Fault("echo", echo=True),
        Fault("stamp", stamp=True),
        Fault("echo-error", refusal=_echo_key_error),
        Fault("429", refusal=_rate_limited("1")),
        Fault("500", refusal=internal_error),
        _status_fault("502", 502, "Bad gateway.", "server_error"),
        _status_fault("503", 503, "The server is overloaded or not ready yet.", "server_error"),
        Fault("529", refusal=_refusal(529, _ANTHROPIC_OVERLOADED)),
        _status_fault(
            "spend-limit", 429, _QUOTA_MESSAGE, "insufficient_quota", "insufficient_quota"
        ),
        _status_fault(
            "401", 401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
        ),
        _status_fault("400", 400, "Simulated invalid request.", "invalid_request_error"),
    )
}
_COUNTED_ENDS: Final = {"hang-after": End.HANG, "error-after": End.ERROR, "cut-after": End.CUT}
_WHOLE: Final = re.compile(r"[0-9]+")
_DECIMAL: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_GRAMMAR: Final = (
    "hang, hang-after:N, 429, 429:S, 500, 502, 503, 529, spend-limit, 401, 400, echo-error, "
    "error-after:N, cut-after:N, no-finish, slow:TPS, echo, stamp"
)


@functools.lru_cache(maxsize=256)
def parse_fault(spec: str) -> Fault:
    """Parse a fault spec (grammar in the module docstring), raising ValueError if it is bad."""
    fixed = _FIXED_FAULTS.get(spec)
    if fixed is not None:
        return fixed
    name, colon, arg = spec.partition(":")
    if name in _COUNTED_ENDS and _WHOLE.fullmatch(arg):
        return Fault(spec, after=int(arg), end=_COUNTED_ENDS[name])
    if name == "429" and _DECIMAL.fullmatch(arg):
        return Fault(spec, refusal=_rate_limited(arg))
    if name == "slow" and _DECIMAL.fullmatch(arg) and float(arg) > 0:
        return Fault(spec, interval_s=1 / float(arg))
    if name in _COUNTED_ENDS:
        why = f"{name} takes a whole number of tokens, as in {name}:3"
    elif name == "429":
        why = "429 takes a Retry-After in seconds, as in 429:0.5"
    elif name == "slow":
        why = "slow takes a rate in tokens per second above 0, as in slow:20"
    elif name in _FIXED_FAULTS and colon:
        why = f"{name} takes no argument"
    else:
        why = "unknown fault"
    raise ValueError(f"Invalid fault {spec!r}: {why}. Faults: {_GRAMMAR}.")


def echo_tokens(request: web.Request, body: object) -> list[str]:
    # str(): the names are multidict's istr, a str subclass orjson refuses as a dict key.
    headers = {str(name): value for name, value in request.headers.items()}
    text = orjson.dumps({"headers": headers, "body": body}).decode()
    return [text[i : i + _ECHO_CHUNK_CHARS] for i in range(0, len(text), _ECHO_CHUNK_CHARS)]


async def hang() -> None:
    """Wait until cancelled, sending nothing."""
    # Ends only by cancellation: the client leaving (handler_cancellation) or shutdown.
    await asyncio.get_running_loop().create_future()


def cut(request: web.Request) -> None:
    """Close the request's connection, leaving whatever body it was sending unfinished."""
    # close(), not abort(): close sends what is still buffered first, so the client gets every
    # token written before the connection drops, then an unfinished chunked body.
    if request.transport is not None:
        request.transport.close()
