"""MCP servers' tools for `llm` agents: list them, call them, over the official `mcp` SDK.

A workspace's server is reached one of two ways:

- `http` (streamable HTTP): its URL with its headers (opened from their sealed form only
  here). Every connection goes through the outbound guard: the host is resolved once, each
  address must be allowed (`BULLPEN_OUTBOUND_ALLOW`), and the connection goes to a checked
  address, never to the name (`GuardedBackend`); the SDK follows a redirect only on the same
  origin. Proxies from the worker's environment are not used.
- `stdio`: a command on the operator's allow-list (`BULLPEN_PROCESS_ALLOW`, checked again at
  every connection), started in a fresh temporary directory (removed afterwards) with the same
  clean environment as a `process` agent's command: `PATH=/usr/local/bin:/usr/bin:/bin`,
  `LANG=C.UTF-8`, `HOME` (that directory) and the server's `env` (names on
  `BULLPEN_PROCESS_ENV_ALLOW`); nothing of the worker's own environment. Its stderr is
  discarded. The SDK ends the server's process tree when the session closes.

The SDK itself is used by `mcp_session`, loaded on a server's first use. Each listing or call
opens a session, does its one request within the server's `timeout_s`,
and closes it. Tool listings are cached per server (and per change of the server) for
`ttl_s`. A failure to reach or use a server is `McpUnavailable`; its message never holds a
header value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

import orjson
from aiohttp.abc import AbstractResolver

from bullpen.agents.process import ALLOW_SETTING, BASE_PATH
from bullpen.agents.process_env import ENV_ALLOW_SETTING, EnvAllow
from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.outbound import AddressGuard, OutboundAllow

SERVER_NAME = r"^[a-z0-9][a-z0-9-]{0,31}$"  # no `_`: `<server>__<tool>` splits unambiguously
SEPARATOR = "__"
WIRE_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # a function name as OpenAI-style models take it
TOOLS_MAX = 128  # tools taken from one server's listing


class McpUnavailable(BullpenError):
    """An MCP server could not be reached, or did not answer as MCP servers do."""

    status = 502
    slug = "mcp-server-unavailable"
    title = "MCP server unavailable"


@dataclass(frozen=True, slots=True)
class McpServer:
    """A server as the worker uses it: its headers opened."""

    id: str
    version: str  # changes whenever the server is changed (its listing is then fetched again)
    name: str
    transport: str  # http | stdio
    url: str | None
    headers: dict[str, str] = field(repr=False)
    command: list[str] | None
    env: dict[str, str]
    timeout_s: float


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool a server lists."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    @property
    def wire_name(self) -> str:
        """The name the model calls it by: `<server>__<tool>`."""
        return f"{self.server}{SEPARATOR}{self.name}"


def split_name(wire_name: str) -> tuple[str, str] | None:
    """`(server, tool)` of an MCP tool's wire name, or None for a built-in tool's name."""
    server, sep, tool = wire_name.partition(SEPARATOR)
    if not sep or not tool or re.fullmatch(SERVER_NAME, server) is None:
        return None
    return server, tool


def stdio_environment(env: dict[str, str], home: str) -> dict[str, str]:
    """A stdio server's environment, as a `process` agent's command gets it."""
    return {"PATH": BASE_PATH, "LANG": "C.UTF-8", **env, "HOME": home}


def check_stdio(
    command: list[str], env: Iterable[str], allow: Collection[str], env_allow: EnvAllow
) -> None:
    """Refuse a command off the operator's allow-list, or an environment name off its list."""
    if not allow:
        raise InvalidInput(f"stdio MCP servers are off on this server: {ALLOW_SETTING} is empty")
    if command[0] not in allow:
        raise InvalidInput(f"{command[0]!r} is not an executable {ALLOW_SETTING} allows")
    refused = sorted(name for name in env if not env_allow.allows(name))
    if refused:
        raise InvalidInput(f"{ENV_ALLOW_SETTING} does not allow {', '.join(refused)}")


class ServersPort(Protocol):
    """Where the tool loop finds a workspace's servers (`services.mcp_servers.McpDirectory`)."""

    async def servers(self, workspace_id: UUID, names: Collection[str]) -> dict[str, McpServer]:
        """The named servers that exist, by name, their headers opened."""


class McpClient:
    """Lists and calls MCP servers' tools for `llm` agents (one per worker)."""

    def __init__(
        self,
        outbound: OutboundAllow,
        *,
        process_allow: Collection[str],
        env_allow: EnvAllow,
        ttl_s: float,
        clock: Callable[[], float],
        resolver: AbstractResolver | None = None,
    ) -> None:
        self._guard = AddressGuard(outbound, resolver)
        self._outbound = outbound
        self._process_allow = frozenset(process_allow)
        self._env_allow = env_allow
        self._ttl_s = ttl_s
        self._clock = clock
        self._listed: dict[tuple[str, str], tuple[float, list[McpTool]]] = {}

    async def close(self) -> None:
        """Close the resolver the guard may hold."""
        await self._guard.close()

    async def tools(self, server: McpServer, *, fresh: bool = False) -> list[McpTool]:
        """The server's tools (cached for the TTL unless `fresh`); McpUnavailable if it cannot
        be listed."""
        key = (server.id, server.version)
        found = self._listed.get(key)
        if not fresh and found is not None and found[0] > self._clock():
            return found[1]
        from bullpen.agents import mcp_session as sdk  # the SDK, loaded on first use

        tools: list[McpTool] = []

        async def listing(session: Any) -> None:
            cursor: str | None = None
            while len(tools) < TOOLS_MAX:
                page = await session.list_tools(params=sdk.page(cursor))
                for tool in page.tools:
                    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                    tools.append(McpTool(server.name, tool.name, tool.description or "", schema))
                cursor = page.next_cursor
                if not cursor:
                    break

        await sdk.with_session(self._reach(sdk), server, listing, "list the tools of")
        listed = tools[:TOOLS_MAX]
        self._listed = {k: v for k, v in self._listed.items() if k[0] != server.id}
        self._listed[key] = (self._clock() + self._ttl_s, listed)
        return listed

    async def call(
        self, server: McpServer, tool: str, arguments: dict[str, Any], *, result_max_chars: int
    ) -> tuple[str, bool]:
        """Call a tool: its result as text (cut at `result_max_chars`) and whether the tool
        reported an error. McpUnavailable when the server cannot be reached or times out."""
        from bullpen.agents import mcp_session as sdk  # the SDK, loaded on first use

        out: list[tuple[str, bool]] = []

        async def calling(session: Any) -> None:
            result = await session.call_tool(tool, arguments)
            out.append((sdk.text_of(result), bool(result.is_error)))

        await sdk.with_session(self._reach(sdk), server, calling, f"call {tool!r} on")
        text, failed = out[0]
        if len(text) > result_max_chars:
            text = (
                text[:result_max_chars]
                + f"\n[… result cut at {result_max_chars} characters of {len(text)} …]"
            )
        return text, failed

    def _reach(self, sdk: Any) -> Any:
        return sdk.Reach(self._guard, self._outbound, self._process_allow, self._env_allow)


# ---- what an agent may use, and the tool loop's side ----------------------------------------

INTERRUPTED = (
    "error: this call was interrupted (the worker stopped while it ran) and is not made again; "
    "whether it took effect is unknown"
)


@dataclass(frozen=True, slots=True)
class ArgLimit:
    """Limits on one argument of a tool call, checked before the call is made."""

    max_length: int | None = None  # strings (and the JSON text of other values)
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[Any, ...] | None = None

    def refusal(self, name: str, value: Any) -> str | None:
        """Why `value` is refused, or None."""
        if self.enum is not None and value not in self.enum:
            return f"'{name}' must be one of {orjson.dumps(list(self.enum)).decode()}"
        if self.max_length is not None:
            size = len(value) if isinstance(value, str) else len(orjson.dumps(value))
            if size > self.max_length:
                return f"'{name}' is longer than {self.max_length} characters"
        if self.minimum is not None or self.maximum is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"'{name}' must be a number"
            if self.minimum is not None and value < self.minimum:
                return f"'{name}' must be at least {self.minimum:g}"
            if self.maximum is not None and value > self.maximum:
                return f"'{name}' must be at most {self.maximum:g}"
        return None


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Limits on a tool's calls: the arguments' JSON size, and per argument."""

    max_chars: int | None = None
    arguments: dict[str, ArgLimit] = field(default_factory=dict)

    def refusal(self, text: str, arguments: dict[str, Any]) -> str | None:
        """Why a call with these arguments is refused, or None."""
        if self.max_chars is not None and len(text) > self.max_chars:
            return f"the arguments are longer than {self.max_chars} characters"
        for name, limit in self.arguments.items():
            if name in arguments and (why := limit.refusal(name, arguments[name])) is not None:
                return why
        return None


@dataclass(frozen=True, slots=True)
class Grant:
    """A server an agent may use, the tools it may call there and their limits."""

    server: str
    tools: frozenset[str]
    limits: dict[str, ToolLimits] = field(default_factory=dict)


GRANTS_MAX, GRANT_TOOLS_MAX = 16, 64


def parse_grants(value: Any) -> tuple[Grant, ...]:
    """An `llm` agent's stored `mcp` config, checked (BullpenError when malformed). A tool is
    a name, or `{"name", "max_chars", "arguments": {name: {"max_length", "minimum",
    "maximum", "enum"}}}`; a server or a tool named twice is merged (the later limits win)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > GRANTS_MAX:
        raise BullpenError(f"agent config 'mcp' must be a list of at most {GRANTS_MAX} servers")
    tools: dict[str, set[str]] = {}
    limits: dict[str, dict[str, ToolLimits]] = {}
    for item in value:
        server = item.get("server") if isinstance(item, dict) else None
        listed = item.get("tools") if isinstance(item, dict) else None
        if (
            not isinstance(server, str)
            or re.fullmatch(SERVER_NAME, server) is None
            or not isinstance(listed, list)
            or not listed
        ):
            raise BullpenError("each of agent config 'mcp' needs a 'server' and a list of 'tools'")
        for entry in listed:
            name = entry.get("name") if isinstance(entry, dict) else entry
            if not isinstance(name, str) or not name:
                raise BullpenError("each tool of agent config 'mcp' needs a name")
            tools.setdefault(server, set()).add(name)
            if isinstance(entry, dict):
                limits.setdefault(server, {})[name] = _tool_limits(entry)
    return tuple(
        Grant(server, frozenset(names), limits.get(server, {})) for server, names in tools.items()
    )


def _tool_limits(entry: dict[str, Any]) -> ToolLimits:
    arguments = entry.get("arguments") or {}
    if not isinstance(arguments, dict) or not all(isinstance(v, dict) for v in arguments.values()):
        raise BullpenError("agent config 'mcp': a tool's 'arguments' maps names to limits")
    return ToolLimits(
        max_chars=entry.get("max_chars"),
        arguments={
            name: ArgLimit(
                max_length=spec.get("max_length"),
                minimum=spec.get("minimum"),
                maximum=spec.get("maximum"),
                enum=tuple(spec["enum"]) if spec.get("enum") is not None else None,
            )
            for name, spec in arguments.items()
        },
    )


@dataclass(frozen=True, slots=True)
class Offered:
    """An MCP tool offered to the model, and how to call it."""

    server: McpServer
    tool: McpTool
    limits: ToolLimits | None


@dataclass(slots=True)
class Toolbox:
    """The MCP tools a run offers: their specs for the model, by wire name."""

    specs: list[dict[str, Any]] = field(default_factory=list)
    offered: dict[str, Offered] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # servers that could not be listed


class McpTools:
    """The tool loop's MCP side: what an agent may call, and calling it."""

    def __init__(self, servers: ServersPort, client: McpClient, *, result_max_chars: int) -> None:
        self._servers = servers
        self._client = client
        self._result_max_chars = result_max_chars

    async def toolbox(self, workspace_id: UUID, grants: tuple[Grant, ...]) -> Toolbox:
        """The allowed tools of the agent's servers (a server that cannot be listed is left
        out and named in `problems`; the run goes on without its tools)."""
        box = Toolbox()
        if not grants:
            return box
        servers = await self._servers.servers(workspace_id, [g.server for g in grants])
        for grant in grants:
            server = servers.get(grant.server)
            if server is None:
                box.problems.append(f"no MCP server named {grant.server!r} in this workspace")
                continue
            try:
                listed = await self._client.tools(server)
            except McpUnavailable as err:
                box.problems.append(err.detail)
                continue
            for tool in listed:
                wire = tool.wire_name
                if tool.name not in grant.tools or re.fullmatch(WIRE_NAME, wire) is None:
                    continue
                if wire in box.offered:
                    continue  # a duplicate in one listing: the first one stands
                box.offered[wire] = Offered(server, tool, grant.limits.get(tool.name))
                box.specs.append(_spec(tool))
        return box

    async def call(self, offered: Offered, arguments_text: str) -> str:
        """Make the call: its result, or `error: …` for the model (never raises for a tool's
        or a server's failure)."""
        try:
            arguments = orjson.loads(arguments_text or "{}")
        except orjson.JSONDecodeError as exc:
            return f"error: the arguments are not JSON ({exc})"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        if offered.limits is not None:
            why = offered.limits.refusal(arguments_text, arguments)
            if why is not None:
                return f"error: refused by this agent's limits: {why}"
        try:
            text, failed = await self._client.call(
                offered.server,
                offered.tool.name,
                arguments,
                result_max_chars=self._result_max_chars,
            )
        except McpUnavailable as err:
            return f"error: {err.detail}"
        return f"error: {text}" if failed else text


def refusal(name: str) -> str | None:
    """The result of a call to an MCP-shaped name the agent may not use, or None."""
    found = split_name(name)
    if found is None:
        return None
    return f"error: {found[1]!r} of MCP server {found[0]!r} is not a tool this agent may use"


def _spec(tool: McpTool) -> dict[str, Any]:
    schema = dict(tool.input_schema) if tool.input_schema else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": tool.wire_name,
            "description": (tool.description or f"{tool.name} (MCP server {tool.server})")[:1024],
            "parameters": schema,
        },
    }
