"""Request parsing for the simulated provider: bodies checked as OpenAI checks them.

A chat completion body is read (`read_json`, capped at `MAX_BODY_BYTES`) and checked field by
field (`parse_chat`); what fails is an `ApiError` carrying OpenAI's status, message, `param` and
`code`, which `error_response` renders in OpenAI's error format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

__all__ = ["MAX_BODY_BYTES", "ApiError", "ChatRequest", "error_response", "parse_chat", "read_json"]

MAX_BODY_BYTES: Final = 1024 * 1024
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ApiError(Exception):
    """A request the simulator refuses, rendered in OpenAI's error format."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> web.Response:
    """Return an error in OpenAI's format: `{"error": {message, type, param, code}}`."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _invalid_type(param: str, expected: str, value: object) -> ApiError:
    message = (
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead."
    )
    return ApiError(400, message, param=param, code="invalid_type")


def _optional_bool(body: Mapping[str, Any], key: str, param: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _invalid_type(param, "a boolean", value)
    return value


def _optional_positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(key, "an integer", value)
    if value < 1:
        message = (
            f"Invalid '{key}': integer below minimum value. "
            f"Expected a value >= 1, but got {value} instead."
        )
        raise ApiError(400, message, param=key, code="integer_below_min_value")
    return value


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise ApiError(
            400,
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
            param="messages",
            code="empty_array",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid_type(f"messages[{i}]", "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise _invalid_type(f"messages[{i}].role", "a string", role)
        if role not in _ROLES:
            raise ApiError(
                400,
                f"Invalid value: '{role}'. Supported values are: {', '.join(sorted(_ROLES))}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        content = message.get("content")
        # An assistant turn that only called tools has no text, as in OpenAI's API.
        if not isinstance(content, str) and not (role == "assistant" and content is None):
            raise _invalid_type(f"messages[{i}].content", "a string", content)
    return messages


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The fields of a chat completion request the simulator acts on."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    model_fault: str | None  # the spec after the `@` of `<model>@<spec>`


def parse_chat(body: object, models: frozenset[str]) -> ChatRequest:
    """Check a chat completion body as OpenAI does, for a provider serving `models`."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is None:
        raise ApiError(
            400,
            "Missing required parameter: 'model'.",
            param="model",
            code="missing_required_parameter",
        )
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    messages = _messages(body)
    stream = bool(_optional_bool(body, "stream", "stream"))
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _invalid_type("stream_options", "an object", options)
        if not stream:
            raise ApiError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
                code="invalid_value",
            )
        include_usage = bool(
            _optional_bool(options, "include_usage", "stream_options.include_usage")
        )
    caps = [
        cap
        for cap in (
            _optional_positive_int(body, "max_tokens"),
            _optional_positive_int(body, "max_completion_tokens"),
        )
        if cap is not None
    ]
    model_fault = None
    if model not in models:
        base, at, model_fault = model.rpartition("@")
        if not at or base not in models:
            raise ApiError(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
    max_tokens = min(caps) if caps else None
    return ChatRequest(model, messages, stream, include_usage, max_tokens, model_fault)


async def read_json(request: web.Request) -> object:
    """Read and parse the JSON body; one declared over `MAX_BODY_BYTES` is refused unread."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        # Refuse before reading: aiohttp's own check (in read()) only trips after 1 MiB arrived.
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=length)
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"We could not parse the JSON body of your request: {exc}") from exc
