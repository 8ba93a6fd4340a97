"""Wire schemas of /api/v1/mcp-servers: MCP servers whose tools `llm` agents may call."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from bullpen.agents.mcp import SERVER_NAME, McpTool
from bullpen.agents.process import (
    ARG_MAX_CHARS,
    COMMAND_MAX_ITEMS,
    ENV_NAME_MAX_CHARS,
    ENV_NAME_PATTERN,
    ENV_VALUE_MAX_CHARS,
)
from bullpen.agents.process_env import ENV_MAX_ENTRIES
from bullpen.api.schemas.common import Strict, optional
from bullpen.api.schemas.gateway import BaseUrl
from bullpen.domain.records.mcp import McpServerRecord

HEADERS_MAX = 16
HEADER_VALUE_MAX = 4096
TIMEOUT_MIN_S, TIMEOUT_DEFAULT_S, TIMEOUT_MAX_S = 1.0, 30.0, 600.0
# Headers the HTTP client or the MCP transport sets itself.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "connection",
        "transfer-encoding",
        "te",
        "upgrade",
        "keep-alive",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    }
)


class Transport(StrEnum):
    """How the server is reached."""

    HTTP = "http"
    STDIO = "stdio"


def _not_reserved(headers: dict[str, Any]) -> dict[str, Any]:
    taken = sorted(name for name in headers if name.lower() in RESERVED_HEADERS)
    if taken:
        raise ValueError(f"set by Bullpen itself, not settable: {', '.join(taken)}")
    if len({name.lower() for name in headers}) != len(headers):
        raise ValueError("a header name is given twice (names are case-insensitive)")
    return headers


ServerName = Annotated[str, StringConstraints(pattern=SERVER_NAME)]
HeaderName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
]  # an HTTP token
HeaderValue = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=HEADER_VALUE_MAX,
        pattern=r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
    ),
]
_HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
_HEADERS_DOC = (
    "HTTP headers sent with every request (e.g. `Authorization`). Each value is a secret: "
    "sealed when saved, sent only to this server's origin, never shown again (the server shows "
    "`header_hints`)."
)
Headers = Annotated[
    dict[HeaderName, HeaderValue], Field(max_length=HEADERS_MAX), AfterValidator(_not_reserved)
]


def _names(pattern: str, max_length: int, *, patch: bool) -> Any:
    """`json_schema_extra` of a mapping whose keys follow `pattern` (pydantic documents the
    pattern alone, which allows any other key): only such keys. A PATCH field's has no
    default (`null` is refused)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["additionalProperties"] = False
        schema["propertyNames"] = {"minLength": 1, "maxLength": max_length, "pattern": pattern}
        if patch:
            schema.pop("default", None)

    return extra


Argument = Annotated[str, StringConstraints(max_length=ARG_MAX_CHARS, pattern=r"^[^\x00]*$")]
_EXECUTABLE: dict[str, Any] = {
    "type": "string",
    "maxLength": ARG_MAX_CHARS,
    "pattern": r"^/[^\x00]*$",
}
_COMMAND_DOC = (
    "`stdio`: the executable (an absolute path on `BULLPEN_PROCESS_ALLOW`) and its arguments, "
    "no shell; started as a `process` agent's command is, in a clean environment."
)


def _create_command_schema(schema: dict[str, Any]) -> None:
    schema["prefixItems"] = [_EXECUTABLE]  # the first item is the executable: absolute


def _command_schema(schema: dict[str, Any]) -> None:
    schema["prefixItems"] = [_EXECUTABLE]  # the first item is the executable: absolute
    schema.pop("default", None)  # a PATCH field: may be left out, `null` is refused


Command = Annotated[
    list[Argument],
    Field(min_length=1, max_length=COMMAND_MAX_ITEMS),
    AfterValidator(lambda v: _absolute(v)),
]
EnvName = Annotated[
    str, StringConstraints(min_length=1, max_length=ENV_NAME_MAX_CHARS, pattern=ENV_NAME_PATTERN)
]
EnvValue = Annotated[str, StringConstraints(max_length=ENV_VALUE_MAX_CHARS, pattern=r"^[^\x00]*$")]
Env = Annotated[dict[EnvName, EnvValue], Field(max_length=ENV_MAX_ENTRIES)]
_ENV_DOC = (
    "Environment variables for the command (not secret; names on `BULLPEN_PROCESS_ENV_ALLOW`)."
)
Timeout = Annotated[
    float, Field(ge=TIMEOUT_MIN_S, le=TIMEOUT_MAX_S, allow_inf_nan=False, strict=True)
]


def _absolute(command: list[str]) -> list[str]:
    if not command[0].startswith("/"):
        raise ValueError("command[0] must be the executable's absolute path")
    return command


class _CreateFields(Strict):
    name: ServerName = Field(
        examples=["files"],
        description="Lower-case letters, digits and `-`, up to 32: tools are offered to models "
        "as `<name>__<tool>`.",
    )
    timeout_s: Timeout = Field(
        default=TIMEOUT_DEFAULT_S,
        description="Each listing or tool call, connecting included, fails after this long; "
        "a call's failure is returned to the model as a tool error.",
    )


class McpHttpCreate(_CreateFields):
    """A new MCP server reached over streamable HTTP."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "files",
                    "transport": "http",
                    "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": "Bearer …"},
                }
            ]
        },
    )

    transport: Literal["http"]
    url: BaseUrl = Field(
        description="The server's MCP endpoint. Non-public addresses are refused (here and "
        "whenever the host resolves to one) unless BULLPEN_OUTBOUND_ALLOW names them."
    )
    headers: (
        Annotated[Headers, Field(json_schema_extra=_names(_HEADER_NAME, 64, patch=False))] | None
    ) = Field(default=None, description=_HEADERS_DOC)

    def values(self) -> dict[str, Any]:
        """The fields as the service takes them."""
        return {
            "name": self.name,
            "transport": self.transport,
            "url": self.url,
            "headers": self.headers or {},
            "command": None,
            "env": {},
            "timeout_s": self.timeout_s,
        }


class McpStdioCreate(_CreateFields):
    """A new MCP server run as a local command, spoken to over its stdin and stdout."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "git", "transport": "stdio", "command": ["/usr/local/bin/mcp-git"]}
            ]
        },
    )

    transport: Literal["stdio"]
    command: Command = Field(description=_COMMAND_DOC, json_schema_extra=_create_command_schema)
    env: (
        Annotated[
            Env,
            Field(json_schema_extra=_names(ENV_NAME_PATTERN, ENV_NAME_MAX_CHARS, patch=False)),
        ]
        | None
    ) = Field(default=None, description=_ENV_DOC)

    def values(self) -> dict[str, Any]:
        """The fields as the service takes them."""
        return {
            "name": self.name,
            "transport": self.transport,
            "url": None,
            "headers": {},
            "command": self.command,
            "env": self.env or {},
            "timeout_s": self.timeout_s,
        }


McpServerCreate = Annotated[McpHttpCreate | McpStdioCreate, Field(discriminator="transport")]


class McpServerUpdate(Strict):
    """Only the fields sent change; the transport cannot."""

    name: ServerName = optional()
    url: BaseUrl = optional("`http` only.")
    headers: Headers = Field(
        default=None,  # type: ignore[arg-type]  # a PATCH field: `null` is refused
        description=_HEADERS_DOC + " `http` only. Replaces every header (`{}` removes them); "
        "needed again when `url` moves to another scheme, host or port (422 "
        "`mcp-headers-required`).",
        json_schema_extra=_names(_HEADER_NAME, 64, patch=True),
    )
    command: Command = Field(
        default=None,  # type: ignore[arg-type]  # a PATCH field: `null` is refused
        description=_COMMAND_DOC,
        json_schema_extra=_command_schema,
    )
    env: Env = Field(
        default=None,  # type: ignore[arg-type]  # a PATCH field: `null` is refused
        description=_ENV_DOC + " `stdio` only; replaces the environment.",
        json_schema_extra=_names(ENV_NAME_PATTERN, ENV_NAME_MAX_CHARS, patch=True),
    )
    timeout_s: Timeout = optional()


class McpServerPublic(BaseModel):
    """An MCP server as the API shows it: its header values only as hints."""

    id: UUID
    name: str
    transport: Transport
    url: str | None
    header_hints: dict[str, str] = Field(
        examples=[{"Authorization": "Bea…a1b2"}],
        description="Each header's name and the first and last characters of its value",
    )
    command: list[str] | None
    env: dict[str, str]
    timeout_s: float
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: McpServerRecord) -> McpServerPublic:
        """Build from an `mcp_servers` row."""
        return cls(
            id=row.id,
            name=row.name,
            transport=Transport(row.transport),
            url=row.url,
            header_hints=row.header_hints,
            command=row.command,
            env=row.env,
            timeout_s=row.timeout_s,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class McpServerList(BaseModel):
    """The workspace's MCP servers by name."""

    items: list[McpServerPublic]


class McpToolPublic(BaseModel):
    """A tool the server lists."""

    name: str
    wire_name: str = Field(description="The name models call it by: `<server>__<tool>`")
    description: str
    input_schema: dict[str, Any]

    @classmethod
    def of(cls, tool: McpTool) -> McpToolPublic:
        """Build from a listed tool."""
        return cls(
            name=tool.name,
            wire_name=tool.wire_name,
            description=tool.description,
            input_schema=tool.input_schema,
        )


class McpToolList(BaseModel):
    """What a server lists now."""

    items: list[McpToolPublic]
