"""The ASGI endpoint at `/mcp`, which loads the MCP SDK on its first request.

The SDK (and the server built on it, bullpen.api.mcp.server) costs about 25 MB of memory and
0.4 s of import, which a server that is never asked for MCP should not pay. So the app starts
with this endpoint alone; the first request to `/mcp` imports the server in a thread (the
event loop keeps serving meanwhile) and starts the SDK's session manager in a task of its
own, which lives until the app stops. Requests that arrive while it starts wait for it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from bullpen.api import problems
from bullpen.api.deps import authenticate, bearer, services_of
from bullpen.api.mcp.tools import Caller
from bullpen.errors import BullpenError, Unauthenticated, Unavailable
from bullpen.settings import Settings

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

log = logging.getLogger(__name__)

PATH = "/mcp"
CALLER = "bullpen.mcp.caller"  # the ASGI scope key the authenticated caller travels under
SERVER_MODULE = "bullpen.api.mcp.server"


class McpEndpoint:
    """Authenticates each request, then hands it to the SDK's manager (started on first use).

    Only POST: stateless, the server opens no stream of its own (GET) and has no session to
    end (DELETE); other methods get 405 problem+json, as the MCP spec allows.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._open = False  # inside `run()`: the app is serving
        self._ready: asyncio.Future[StreamableHTTPSessionManager] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve while inside; on the way out, stop the manager if a request started it."""
        self._open = True
        try:
            yield
        finally:
            self._open = False
            self._stop.set()
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)
            self._task = self._ready = None
            self._stop = asyncio.Event()

    @property
    def started(self) -> bool:
        """Whether the SDK's manager runs (a request to `/mcp` has started it)."""
        return self._ready is not None and self._ready.done() and not self._ready.exception()

    async def _manager(self) -> StreamableHTTPSessionManager:
        if not self._open:
            raise Unavailable("the MCP server is not running", retry_after=1)
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._serve(self._ready), name="mcp-server")
        ready = self._ready
        try:
            # Shielded: a request that goes away must not cancel the start others wait on.
            return await asyncio.shield(ready)
        except BullpenError:
            raise
        except Exception as err:
            if self._ready is ready:  # the next request tries again
                self._ready = None
            log.error("the MCP server could not start: %s", type(err).__name__)
            raise Unavailable("the MCP server could not start", retry_after=1) from None

    async def _serve(self, ready: asyncio.Future[StreamableHTTPSessionManager]) -> None:
        """Import the server, run the SDK's manager until the app stops; the manager's task
        group is entered and left in this one task, as anyio requires."""
        try:
            server: Any = await asyncio.to_thread(importlib.import_module, SERVER_MODULE)
            manager = server.session_manager(self._settings)
            async with manager.run():
                ready.set_result(manager)
                await self._stop.wait()
        except Exception as err:
            if not ready.done():
                ready.set_exception(err)  # the waiting requests answer 503
            else:
                log.exception("the MCP server stopped")
        except BaseException:  # cancelled: the app is going away
            if not ready.done():
                ready.set_exception(Unavailable("the MCP server is not running", retry_after=1))
            raise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            if request.method != "POST":
                problem = problems.problem(
                    405,
                    "method-not-allowed",
                    "Method not allowed",
                    f"{request.method} is not allowed on {PATH}: MCP requests are POSTs.",
                    instance=PATH,
                    headers={"Allow": "POST"},
                )
                await problem(scope, receive, send)
                return
            svc = services_of(request)
            credentials = await bearer(request)
            if credentials is None:  # a session cookie is not taken: MCP carries no CSRF proof
                raise Unauthenticated(
                    f"send `Authorization: Bearer <api key>`: {PATH} takes API keys"
                )
            principal = await authenticate(request, svc, credentials, None)
            manager = await self._manager()
        except BullpenError as err:
            await (await problems.answer(request, err))(scope, receive, send)
            return
        scope[CALLER] = Caller(principal, svc)
        await manager.handle_request(scope, receive, send)
