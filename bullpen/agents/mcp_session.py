"""The SDK side of MCP servers: a session over streamable HTTP (through the outbound guard)
or stdio (a clean environment), and what a result or a failure says.

Imported only when a server is used (`McpClient`), so processes that never reach an MCP server
do not load the SDK.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import httpcore2
import httpx2
import orjson
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import PaginatedRequestParams

from bullpen.agents.mcp import McpServer, McpUnavailable, check_stdio, stdio_environment
from bullpen.agents.process_env import EnvAllow
from bullpen.errors import InvalidInput
from bullpen.security.outbound import AddressGuard, OutboundAllow, OutboundRefused, check_url

log = logging.getLogger(__name__)
_ENV_UNSET = ("LOGNAME", "SHELL", "TERM", "USER")  # what the SDK would pass on otherwise


def page(cursor: str | None) -> PaginatedRequestParams | None:
    """The parameters of a listing's next page."""
    return None if cursor is None else PaginatedRequestParams(cursor=cursor)


@dataclass(slots=True)
class Peer:
    """What a session learnt of its server: whether every address used was public, and
    whether it answered as an MCP server does (its `initialize`)."""

    public: bool | None = None
    answered: bool = False


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to addresses the outbound guard allows: the one it checked."""

    def __init__(self, guard: AddressGuard, peer: Peer) -> None:
        self._guard = guard
        self._inner = httpcore2.AnyIOBackend()
        self._peer = peer

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Resolve and check `host`, then connect to one of its checked addresses."""
        checked = await self._guard.check(host.strip("[]"), port)
        peer = self._peer
        peer.public = checked.public if peer.public is None else peer.public and checked.public
        last: Exception | None = None
        for _family, address in checked.addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as err:
                last = err
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Never: MCP servers are reached over TCP."""
        raise httpcore2.ConnectError("unix sockets are not used")

    async def sleep(self, seconds: float) -> None:
        """Sleep as the inner backend does."""
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport over a pool that connects through `GuardedBackend`, no proxies."""

    def __init__(self, backend: GuardedBackend) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            max_connections=4,
            network_backend=backend,
        )


@dataclass(frozen=True, slots=True)
class Reach:
    """What connecting to a server is allowed to do (the operator's settings)."""

    guard: AddressGuard
    outbound: OutboundAllow
    process_allow: Collection[str]
    env_allow: EnvAllow


async def with_session(
    reach: Reach, server: McpServer, work: Callable[[ClientSession], Any], what: str
) -> None:
    """Open a session to the server, run `work` in it, close it, all within its timeout.

    As for providers, a server at a non-public address (one `BULLPEN_OUTBOUND_ALLOW` lets
    through) fails with one message whatever went wrong until it has answered as an MCP server
    does, so that MCP server URLs cannot map the internal network; the server log has the real
    reason."""
    failure: str | None = None
    peer = Peer()
    try:
        with anyio.fail_after(server.timeout_s):
            async with _session(reach, server, peer) as session:
                await work(session)
    except TimeoutError:
        failure = f"no answer within {server.timeout_s:g} s"
    except (OutboundRefused, InvalidInput) as err:
        failure = err.detail
    except MCPError as err:
        failure = f"the server answered with an error: {_short(str(err))}"
    except Exception as err:  # the SDK and its transports raise many kinds, often grouped
        failure = _describe(err)
    if failure is None:
        return
    if peer.public is False and not peer.answered:
        log.warning("MCP server %r at a non-public address: %s", server.name, failure)
        failure = (
            "it is at a non-public address, whose errors are not shown (the server log has them)"
        )
    raise McpUnavailable(f"could not {what} MCP server {server.name!r}: {failure}")


@contextlib.asynccontextmanager
async def _session(reach: Reach, server: McpServer, peer: Peer) -> AsyncIterator[ClientSession]:
    async with contextlib.AsyncExitStack() as stack:
        if server.transport == "http":
            assert server.url is not None
            check_url(server.url, reach.outbound)
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=server.headers,
                    transport=_GuardedTransport(GuardedBackend(reach.guard, peer)),
                    timeout=httpx2.Timeout(server.timeout_s),
                    trust_env=False,
                )
            )
            read, write = await stack.enter_async_context(
                streamable_http_client(server.url, http_client=http)
            )
        else:
            assert server.command is not None
            check_stdio(server.command, server.env, reach.process_allow, reach.env_allow)
            home = stack.enter_context(tempfile.TemporaryDirectory(prefix="bullpen-mcp-"))
            # /dev/null: opening it does not block
            errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: ASYNC230
            # `env -u` drops what the SDK adds from the worker's environment; the rest of
            # the environment is ours (values never on a command line).
            unset = [arg for name in _ENV_UNSET for arg in ("-u", name)]
            params = StdioServerParameters(
                command="/usr/bin/env",
                args=[*unset, "--", *server.command],
                env=stdio_environment(server.env, home),
                cwd=home,
            )
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        peer.answered = True
        yield session


def text_of(result: Any) -> str:
    """A tool result as the model reads it: its text blocks, else its structured content."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            inner = getattr(block, "resource", None)
            parts.append(
                str(getattr(inner, "text", "") or f"[resource: {getattr(inner, 'uri', '')}]")
            )
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode())
    return "\n".join(parts)


def _short(text: str) -> str:
    return text if len(text) <= 300 else text[:300] + "…"


def _describe(err: BaseException) -> str:
    """One line for a failure, from the innermost exception of a group."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    if isinstance(err, OutboundRefused):
        return err.detail
    if isinstance(err, (httpx2.ConnectError, ConnectionError, socket.gaierror)):
        return f"could not connect ({type(err).__name__})"
    if isinstance(err, httpx2.HTTPStatusError):
        return f"HTTP {err.response.status_code}"
    if isinstance(err, FileNotFoundError | PermissionError):
        return f"could not start the command ({type(err).__name__})"
    return f"{type(err).__name__}: {_short(str(err))}" if str(err) else type(err).__name__
