"""Bullpen as an MCP server at `/mcp`: streamable HTTP, stateless, JSON responses.

This module holds what needs the MCP SDK (the server, its tools' listing and calls); it is
imported on the first request to `/mcp` (bullpen.api.mcp.endpoint), not when the app starts.

Each HTTP request is authenticated as the REST API authenticates it (a Bullpen API key only,
rate limits included) before the MCP SDK sees it; the caller rides in the ASGI scope to the
tool, which checks the tool's permission (a refusal is audited), validates the arguments and
calls the services. Stateless: no MCP session is kept between requests, so any API process
behind a load balancer answers any request, and nothing is held per client.

What a tool raises becomes a tool error (`isError`) with a clear message: a Bullpen error's
title and detail, an argument's name and what is wrong with it, or, for anything unexpected,
a fixed sentence (the exception is logged, never sent).
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
import orjson
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError
from starlette.requests import Request

from bullpen import __version__
from bullpen.api.deps import check_permission, record_denial
from bullpen.api.mcp.endpoint import CALLER, PATH
from bullpen.api.mcp.tools import TOOLS, Caller, StoredRefusal, Tool
from bullpen.errors import BullpenError, Forbidden
from bullpen.settings import Settings

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Bullpen runs tasks on a team of LLM agents. `list_agents` shows who can take work; "
    "`create_task` hands a prompt to one; `wait_for_task` (or `get_task`) returns its result "
    "and cost once it has ended."
)


def _tool_of(tool: Tool) -> types.Tool:
    """A tool as `tools/list` describes it."""
    schema = tool.args.model_json_schema()
    schema.pop("title", None)
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=schema,
        annotations=types.ToolAnnotations(
            read_only_hint=tool.read_only,
            destructive_hint=tool.destructive,
            idempotent_hint=tool.idempotent,
            open_world_hint=False,
        ),
    )


_LISTED = [_tool_of(tool) for tool in TOOLS.values()]
_SCHEMAS = {tool.name: tool.input_schema for tool in _LISTED}


async def _list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_LISTED)


async def _call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    request = ctx.request
    caller = request.scope.get(CALLER) if isinstance(request, Request) else None
    if not isinstance(caller, Caller):  # only reachable through `McpEndpoint`, which sets it
        return _error("Unauthenticated: this server takes requests only at /mcp with an API key")
    tool = TOOLS.get(params.name)
    if tool is None:
        return _error(f"Unknown tool {params.name[:100]!r}; `tools/list` lists them")
    try:
        check_permission(caller.principal, tool.permission)
        try:
            args = tool.args.model_validate_json(orjson.dumps(params.arguments or {}))
        except ValidationError as err:
            return _error(_invalid(err))
        result = await tool.run(caller, args)
    except Forbidden as err:
        await _audit_denial(caller, tool, err.detail)
        return _error(_message(err))
    except BullpenError as err:
        if err.status >= 500:
            log.warning("MCP tool %s -> %s: %s", tool.name, err.status, err.detail)
        return _error(_message(err))
    except StoredRefusal as err:
        return _error(_stored_message(err.problem))
    except Exception:
        log.exception("MCP tool %s failed", tool.name)
        return _error("Internal error: something went wrong on our side; it has been logged.")
    text = orjson.dumps(result).decode()
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=result
    )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _message(err: BullpenError) -> str:
    """A Bullpen error as one line: its title, its detail, when to try again."""
    text = f"{err.title} ({err.slug}): {err.detail}"
    if err.retry_after is not None:
        text += f" Retry after {max(1, round(err.retry_after))} s."
    return text


def _stored_message(problem: dict[str, Any]) -> str:
    slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
    return f"{problem.get('title', 'Error')} ({slug}): {problem.get('detail', '')} (replayed)"


def _invalid(err: ValidationError) -> str:
    """Which arguments are wrong and why; never their values (they may be long, or private)."""
    parts = []
    for item in err.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in item["loc"]) or "arguments"
        parts.append(f"{field}: {item['msg']}")
    return "Invalid arguments (validation): " + "; ".join(parts)


async def _audit_denial(caller: Caller, tool: Tool, reason: str) -> None:
    data = {"method": "POST", "path": PATH, "tool": tool.name, "reason": reason}
    try:
        await record_denial(caller.svc, caller.principal, data)
    except BullpenError as err:  # the refusal stands even if it could not be recorded
        log.warning("could not audit a refusal: %s", err.detail)


def build_server() -> Server[Any]:
    """The MCP server: Bullpen's tools, no resources or prompts."""
    return Server(
        "bullpen",
        version=__version__,
        title="Bullpen",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=_SCHEMAS.get,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


def session_manager(settings: Settings) -> StreamableHTTPSessionManager:
    """The SDK's manager of the stateless streamable-HTTP transport around `build_server()`."""
    return StreamableHTTPSessionManager(
        app=build_server(),
        json_response=True,
        stateless=True,
        # Bearer keys only, never a cookie: a page on another origin has nothing to send, so
        # the Host/Origin checks against DNS rebinding guard nothing here; Bullpen serves
        # under whatever host name its operator gives it.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=settings.max_body_bytes,
    )
