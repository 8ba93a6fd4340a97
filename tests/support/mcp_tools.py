"""A real MCP server built with the official SDK, for the MCP tool tests.

Its tools: `add`, `note` (appends its text to a log file, one line a call, so a test counts
the calls that really happened), `hang` (never answers in time), `big` (a long result) and
`secret` (no agent is allowed it). `serve_http` runs it over streamable HTTP on loopback in the
test's process, recording the headers it is sent; run as a script (`python mcp_tools.py LOG`)
it serves stdio, as a `stdio` MCP server's command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

SCRIPT = Path(__file__)


def build(log: Path) -> MCPServer:
    """The test server; `note` appends to `log`."""
    server = MCPServer("bullpen-test-tools")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    def note(text: str) -> str:
        """Write a note (a side effect the test can count)."""
        with log.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
        return f"noted {text}"

    @server.tool()
    async def hang() -> str:
        """Take far too long."""
        await anyio.sleep(60)
        return "too late"

    @server.tool()
    def big() -> str:
        """A result longer than a model should get."""
        return "x" * 50_000

    @server.tool()
    def secret() -> str:
        """A tool no agent is allowed."""
        with log.open("a", encoding="utf-8") as out:
            out.write("SECRET CALLED\n")
        return "the secret"

    @server.tool()
    def whereami() -> str:
        """The environment and directory the server runs in (stdio)."""
        return json.dumps({"cwd": os.getcwd(), "env": dict(os.environ)})

    return server


@dataclass
class HttpMcp:
    """A running streamable HTTP server: its URL and the headers of every request."""

    url: str
    headers: list[dict[str, str]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def serve_http(log: Path) -> AsyncIterator[HttpMcp]:
    """The server over streamable HTTP on 127.0.0.1 (a free port), in this process."""
    import uvicorn

    # Any Host: the guard's tests reach it by a name a stub resolver points at 127.0.0.1.
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = build(log).streamable_http_app(transport_security=security)
    running = HttpMcp(url="")

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            running.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    config = uvicorn.Config(
        recording,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,  # a `hang` call may still be open
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        running.url = f"http://127.0.0.1:{port}/mcp"
        yield running
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def stdio_command(log: Path) -> list[str]:
    """The command of a `stdio` server running this module (`-P`: not with this folder on
    `sys.path`, where `http.py` would hide the standard library's `http`)."""
    return [sys.executable, "-P", str(SCRIPT), str(log)]


def calls_in(log: Path) -> list[str]:
    """The notes written so far (one a call)."""
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


if __name__ == "__main__":
    build(Path(sys.argv[1])).run("stdio")
