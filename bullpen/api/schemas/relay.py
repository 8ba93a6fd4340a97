"""Wire schemas of the OpenAI-compatible relay (/v1): chat requests and model cards."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
)

from bullpen.api.schemas.common import integral

MAX_MESSAGES = 2000
MAX_OUTPUT_TOKENS = 1_000_000
# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
OutputTokens = Annotated[
    int, Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True), BeforeValidator(integral)
]
# What a header value may carry as is: visible ASCII, except `%` (the escape itself).
HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


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
