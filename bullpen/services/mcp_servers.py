"""A workspace's MCP servers: add, change, test (list their tools), remove; and what the
worker's tool loop reads of them.

- `McpService`: the API's use cases, each change audited in its transaction. An `http`
  server's URL must pass the outbound guard; its header values are sealed (AES-GCM, bound to
  the server and the header's name) before they reach the store and never returned (callers
  see hints). Headers go only where they were given for: moving a server with headers to
  another scheme, host or port needs `headers` again. A `stdio` server's command must be on
  `BULLPEN_PROCESS_ALLOW` and its `env` names on `BULLPEN_PROCESS_ENV_ALLOW`, as a `process`
  agent's (checked again whenever it starts).
- `McpDirectory`: a workspace's servers with their headers opened, for the worker, cached for
  a short time (changes made in this process apply at once; others within the TTL).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.agents.mcp import McpClient, McpServer, McpTool, check_stdio
from bullpen.agents.process_env import EnvAllow
from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal
from bullpen.domain.records.mcp import McpServerRecord
from bullpen.errors import InvalidInput, NotFound
from bullpen.security.outbound import OutboundAllow, OutboundRefused, check_url
from bullpen.security.secrets import SecretBox, hint
from bullpen.services.gateway import origin
from bullpen.store import audit
from bullpen.store import mcp as mcp_store
from bullpen.store.base import Connection, Store


def header_context(server_id: UUID, name: str) -> bytes:
    """The associated data binding a sealed header value to its server and name."""
    return b"mcp-header:" + server_id.bytes + name.lower().encode()


class McpHeadersRequired(InvalidInput):
    """A server's URL moves to another origin while its headers would be kept."""

    slug = "mcp-headers-required"
    title = "The MCP server's headers are required again"


class McpService:
    """MCP servers of the caller's workspace."""

    def __init__(
        self,
        store: Store,
        box: SecretBox,
        client: McpClient,
        directory: McpDirectory,
        clock: Callable[[], datetime],
        *,
        outbound: OutboundAllow,
        process_allow: Collection[str],
        env_allow: EnvAllow,
    ) -> None:
        self._store = store
        self._box = box
        self._client = client
        self._directory = directory
        self._clock = clock
        self._outbound = outbound
        self._process_allow = frozenset(process_allow)
        self._env_allow = env_allow

    async def list_servers(self, principal: Principal) -> list[McpServerRecord]:
        """The workspace's servers by name."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await mcp_store.list_servers(conn, principal.workspace_id)

    async def get(self, principal: Principal, server_id: UUID) -> McpServerRecord:
        """One server; another workspace's is NotFound."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await self._server(conn, principal, server_id)

    async def create(self, principal: Principal, values: dict[str, Any]) -> McpServerRecord:
        """Add a server (`values` as the API checked them; `headers` in the clear)."""
        need(principal, Permission.PROVIDERS_WRITE)
        self._check(values)
        server_id = uuid.uuid4()
        now = self._clock()
        stored = {**values, "headers": self._seal(server_id, values.get("headers") or {})}
        async with self._store.write() as conn:
            await mcp_store.create_server(
                conn,
                server_id=server_id,
                workspace_id=principal.workspace_id,
                values=stored,
                now=now,
            )
            await audit.record_by(
                conn,
                principal,
                "mcp_server.create",
                "mcp_server",
                server_id,
                now,
                _auditable(stored),
            )
            row = await self._server(conn, principal, server_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def update(
        self, principal: Principal, server_id: UUID, changes: dict[str, Any]
    ) -> McpServerRecord:
        """Change fields; `headers` replaces every header (`{}` removes them)."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._server(conn, principal, server_id, for_update=True)
            merged = {
                "transport": before.transport,
                "url": before.url,
                "command": before.command,
                "env": before.env,
                **changes,
            }
            self._check(merged, changes)
            if (
                "url" in changes
                and "headers" not in changes
                and before.headers
                and before.url is not None
                and origin(changes["url"]) != origin(before.url)
            ):
                message = (
                    "an MCP server's headers are only sent where they were given for: changing "
                    "the scheme, host or port of url needs headers in the same request (or "
                    "headers: {} to call the new address without them)"
                )
                raise McpHeadersRequired(
                    message, errors=[_field("headers", message, "required_for_new_origin")]
                )
            values = dict(changes)
            if "headers" in changes:
                values["headers"] = self._seal(server_id, changes["headers"] or {})
            changed = {k: v for k, v in values.items() if getattr(before, k) != v}
            if not changed:
                return before
            await mcp_store.update_server(conn, server_id, changed, now)
            await audit.record_by(
                conn,
                principal,
                "mcp_server.update",
                "mcp_server",
                server_id,
                now,
                {
                    "before": _auditable({k: getattr(before, k) for k in changed}),
                    "after": _auditable(changed),
                },
            )
            row = await self._server(conn, principal, server_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def delete(self, principal: Principal, server_id: UUID) -> None:
        """Delete a server; agents that list it get a tool error for its tools."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._server(conn, principal, server_id)
            await mcp_store.delete_server(conn, server_id)
            await audit.record_by(
                conn,
                principal,
                "mcp_server.delete",
                "mcp_server",
                server_id,
                now,
                {"name": before.name, "transport": before.transport},
            )
        self._directory.invalidate(principal.workspace_id)

    async def test(self, principal: Principal, server_id: UUID) -> list[McpTool]:
        """Connect to the server and list its tools now (McpUnavailable if it cannot)."""
        need(principal, Permission.PROVIDERS_WRITE)
        async with self._store.read() as conn:
            row = await self._server(conn, principal, server_id)
        return await self._client.tools(self._directory.opened(row), fresh=True)

    # ---- checks ---------------------------------------------------------------------------

    def _check(self, values: dict[str, Any], changes: dict[str, Any] | None = None) -> None:
        given = values if changes is None else changes
        if values["transport"] == "http":
            if values.get("command") is not None or values.get("env"):
                raise _invalid("command", "an http server has no command or env", "not_for_http")
            if values.get("url") is None:
                raise _invalid("url", "an http server needs a url", "missing")
            if "url" in given:
                try:
                    check_url(values["url"], self._outbound)
                except InvalidInput as err:
                    code = "outbound_refused" if isinstance(err, OutboundRefused) else "invalid_url"
                    raise type(err)(err.detail, errors=[_field("url", err.detail, code)]) from None
            return
        if values.get("url") is not None or given.get("headers"):
            raise _invalid("url", "a stdio server has no url or headers", "not_for_stdio")
        if values.get("command") is None:
            raise _invalid("command", "a stdio server needs a command", "missing")
        try:
            check_stdio(
                values["command"], values.get("env") or {}, self._process_allow, self._env_allow
            )
        except InvalidInput as err:
            raise InvalidInput(
                err.detail, errors=[_field("command", err.detail, "not_allowed")]
            ) from None

    def _seal(self, server_id: UUID, headers: dict[str, str]) -> dict[str, dict[str, str]]:
        return {
            name: {
                "sealed": base64.b64encode(
                    self._box.seal(value, header_context(server_id, name))
                ).decode(),
                "hint": hint(value),
            }
            for name, value in headers.items()
        }

    async def _server(
        self, conn: Connection, principal: Principal, server_id: UUID, *, for_update: bool = False
    ) -> McpServerRecord:
        row = await mcp_store.get_server(
            conn, principal.workspace_id, server_id, for_update=for_update
        )
        if row is None:
            raise NotFound("no such MCP server")
        return row


class McpDirectory:
    """Each workspace's servers with their headers opened (the tool loop's `ServersPort`)."""

    def __init__(
        self, store: Store, box: SecretBox, *, ttl_s: float, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._box = box
        self._ttl_s = ttl_s
        self._clock = clock
        self._cached: dict[UUID, tuple[float, dict[str, McpServer]]] = {}

    def invalidate(self, workspace_id: UUID) -> None:
        """Forget a workspace's servers (after a change made here)."""
        self._cached.pop(workspace_id, None)

    async def servers(self, workspace_id: UUID, names: Collection[str]) -> dict[str, McpServer]:
        """The named servers that exist, by name."""
        found = self._cached.get(workspace_id)
        if found is None or found[0] <= self._clock():
            async with self._store.read() as conn:
                rows = await mcp_store.list_servers(conn, workspace_id)
            found = (self._clock() + self._ttl_s, {row.name: self.opened(row) for row in rows})
            self._cached[workspace_id] = found
        return {name: server for name, server in found[1].items() if name in names}

    def opened(self, row: McpServerRecord) -> McpServer:
        """A stored server as the client uses it: its header values opened."""
        return McpServer(
            id=str(row.id),
            version=row.updated_at.isoformat(),
            name=row.name,
            transport=row.transport,
            url=row.url,
            headers={
                name: self._box.open(
                    base64.b64decode(value["sealed"]), header_context(row.id, name)
                )
                for name, value in row.headers.items()
            },
            command=row.command,
            env=row.env,
            timeout_s=row.timeout_s,
        )


def _field(field: str, message: str, code: str) -> dict[str, str]:
    return {"location": "body", "field": field, "message": message, "code": code}


def _invalid(field: str, message: str, code: str) -> InvalidInput:
    return InvalidInput(message, errors=[_field(field, message, code)])


def _auditable(values: dict[str, Any]) -> dict[str, Any]:
    """Server values fit for the audit log: headers as their names and hints only."""
    out = {k: v for k, v in values.items() if k != "headers"}
    if "headers" in values:
        out["header_hints"] = {
            name: value.get("hint", "…") for name, value in (values["headers"] or {}).items()
        }
    return out
