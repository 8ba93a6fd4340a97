"""The response for live event streams (SSE): ends cleanly when the client goes, and drops a
client that takes nothing for `write_timeout_s` (it resumes with `Last-Event-ID`).

Starlette's StreamingResponse notices a departed client too, but it would wait forever on one
that stays connected and reads nothing. Here the reader's subscription and the frame
generator are released on every path: the end of the stream, a disconnect, a stalled client,
an error, or a response that never got to start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Stall:
    """Cancels the streaming task when one write has waited `limit` seconds; costs a clock
    read per write, and one timer per `limit` seconds per stream."""

    __slots__ = ("_handle", "_limit", "_loop", "_task", "since", "stalled")

    def __init__(self, limit: float, task: asyncio.Task[object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._task = task
        self.since: float | None = None
        self.stalled = False
        self._handle = self._loop.call_later(limit, self._check)

    def _check(self) -> None:
        since = self.since
        now = self._loop.time()
        if since is not None and now - since >= self._limit:
            self.stalled = True
            self._task.cancel()
            return
        self._handle = self._loop.call_at((since or now) + self._limit, self._check)

    def stop(self) -> None:
        """No more checks."""
        self._handle.cancel()


class EventStream(Response):
    """`text/event-stream` from an async generator of ready SSE frames."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        on_close: Callable[[], None],
        write_timeout_s: float,
    ) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.init_headers(HEADERS)
        self._frames = frames
        self._on_close = on_close
        self._write_timeout_s = write_timeout_s
        # However the request ends, even before this response is sent, release what it holds.
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _task: self._release())
        self._released = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        finished = False
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            if not finished:
                task.cancel()

        watcher = asyncio.create_task(watch())
        stall = _Stall(self._write_timeout_s, task)
        loop = asyncio.get_running_loop()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for frame in self._frames:
                stall.since = loop.time()
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                stall.since = None
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not (gone or stall.stalled) or task.uncancel() > 0:
                raise
        finally:
            finished = True
            stall.stop()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._frames.aclose()
            self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._on_close()
