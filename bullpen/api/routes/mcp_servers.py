"""/api/v1/mcp-servers: MCP servers whose tools the workspace's `llm` agents may call."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Response

from bullpen.api import docs
from bullpen.api.deps import McpServers, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.mcp_servers import (
    McpServerCreate,
    McpServerList,
    McpServerPublic,
    McpServerUpdate,
    McpToolList,
    McpToolPublic,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1", tags=["mcp"])

ServerId = Annotated[UUID, docs.path_id("MCP server")]
Reader = Annotated[Principal, require(Permission.PROVIDERS_READ)]
Writer = Annotated[Principal, require(Permission.PROVIDERS_WRITE)]


@router.get(
    "/mcp-servers",
    operation_id="listMcpServers",
    response_model=McpServerList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List MCP servers",
)
async def list_servers(principal: Reader, mcp: McpServers) -> McpServerList:
    """The workspace's MCP servers by name; header values appear only as hints."""
    rows = await mcp.list_servers(principal)
    return McpServerList(items=[McpServerPublic.from_row(r) for r in rows])


@router.post(
    "/mcp-servers",
    operation_id="createMcpServer",
    status_code=201,
    response_model=McpServerPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            McpServerPublic,
            "The MCP server",
            {
                "GetMcpServer": docs.link("getMcpServer", mcp_server_id="$response.body#/id"),
                "UpdateMcpServer": docs.link("updateMcpServer", mcp_server_id="$response.body#/id"),
                "TestMcpServer": docs.link("testMcpServer", mcp_server_id="$response.body#/id"),
                "DeleteMcpServer": docs.link("deleteMcpServer", mcp_server_id="$response.body#/id"),
            },
        ),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Add an MCP server",
)
async def create_server(
    body: McpServerCreate, principal: Writer, mcp: McpServers, idem: Idempotent
) -> Response:
    """Add a server. An `http` server's URL must pass the outbound guard and its header values
    are encrypted at rest and never shown; a `stdio` server's command must be on
    `BULLPEN_PROCESS_ALLOW`. Nothing is connected to: `POST …/test` does that."""
    async with idem.begin(principal) as tx:
        row = await mcp.create(principal, body.values())
        return tx.respond(
            201, McpServerPublic.from_row(row), location=f"/api/v1/mcp-servers/{row.id}"
        )


@router.get(
    "/mcp-servers/{mcp_server_id}",
    operation_id="getMcpServer",
    response_model=McpServerPublic,
    responses=docs.problems(*docs.READ),
    summary="Get an MCP server",
)
async def get_server(
    mcp_server_id: ServerId, principal: Reader, mcp: McpServers
) -> McpServerPublic:
    """One MCP server of the workspace."""
    return McpServerPublic.from_row(await mcp.get(principal, mcp_server_id))


@router.patch(
    "/mcp-servers/{mcp_server_id}",
    operation_id="updateMcpServer",
    response_model=McpServerPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Change an MCP server",
)
async def update_server(
    mcp_server_id: ServerId, body: McpServerUpdate, principal: Writer, mcp: McpServers
) -> McpServerPublic:
    """Only the fields sent change. Moving a server with headers to another scheme, host or
    port without sending `headers` is 422 `mcp-headers-required`: headers go only where they
    were given for."""
    changes = body.model_dump(exclude_unset=True)
    return McpServerPublic.from_row(await mcp.update(principal, mcp_server_id, changes))


@router.post(
    "/mcp-servers/{mcp_server_id}/test",
    operation_id="testMcpServer",
    response_model=McpToolList,
    responses=docs.problems(401, 403, 404, 422, 429, 502, 503),
    summary="Connect to an MCP server and list its tools",
)
async def test_server(mcp_server_id: ServerId, principal: Writer, mcp: McpServers) -> McpToolList:
    """Connect now (not from the cache) and list the server's tools; 502
    `mcp-server-unavailable` says why it could not (refused address, no answer within
    `timeout_s`, not an MCP server, a command that cannot start)."""
    tools = await mcp.test(principal, mcp_server_id)
    return McpToolList(items=[McpToolPublic.of(t) for t in tools])


@router.delete(
    "/mcp-servers/{mcp_server_id}",
    operation_id="deleteMcpServer",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Delete an MCP server",
)
async def delete_server(mcp_server_id: ServerId, principal: Writer, mcp: McpServers) -> Response:
    """Delete a server; agents that list it get a tool error for its tools until it exists
    again."""
    await mcp.delete(principal, mcp_server_id)
    return Response(status_code=204)
