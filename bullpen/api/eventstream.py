"""The one SSE response: task, run and workspace event streams and the relay's streamed
completions all go out through `EventStream`.

It ends cleanly when the client goes, and with `write_timeout_s` drops a client that takes
nothing for that long (an event stream's reader resumes with `Last-Event-ID`). Starlette's
StreamingResponse notices a departed client too, but it would wait forever on one that stays
connected and reads nothing, and it costs a task group per response. Here a disconnect is
noticed by one callback on `receive` (no task), and the frame generator and `on_close` are
released on every path: the end of the stream, a disconnect, a stalled client, an error, or a
response that never got to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

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
    """`text/event-stream` from an async generator of ready SSE frames, sent as they come.

    `on_close` runs once however the request ends (even if this response never starts);
    `write_timeout_s` drops a client whose socket takes nothing for that long; a frame ending
    in `last` is the final one and leaves with the body's end (one write, not two).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        headers: Mapping[str, str] = HEADERS,
        on_close: Callable[[], None] | None = None,
        write_timeout_s: float | None = None,
        last: bytes | None = None,
    ) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._frames = frames
        self._on_close = on_close
        self._write_timeout_s = write_timeout_s
        self._last = last
        self._released = on_close is None
        if on_close is not None:
            # However the request ends, even before this response is sent, release what it
            # holds.
            task = asyncio.current_task()
            if task is not None:
                task.add_done_callback(lambda _task: self._release())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        sending = listening = True
        gone = False
        waiter: asyncio.Future[Message]

        def heard(done: asyncio.Future[Message]) -> None:
            nonlocal gone, waiter
            if done.cancelled():
                return
            failed = done.exception() is not None  # retrieved, whether or not still listening
            if not listening:
                return
            if not failed and done.result()["type"] != "http.disconnect":
                waiter = asyncio.ensure_future(receive())  # not the end: listen on
                waiter.add_done_callback(heard)
                return
            gone = True
            if sending:
                task.cancel()

        waiter = asyncio.ensure_future(receive())
        waiter.add_done_callback(heard)
        stall = None if self._write_timeout_s is None else _Stall(self._write_timeout_s, task)
        loop = asyncio.get_running_loop()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            final = False
            async for frame in self._frames:
                final = self._last is not None and frame.endswith(self._last)
                if stall is not None:
                    stall.since = loop.time()
                await send({"type": "http.response.body", "body": frame, "more_body": not final})
                if stall is not None:
                    stall.since = None
                if final:
                    break
            sending = False
            if not final:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            stalled = stall is not None and stall.stalled
            if not (gone or stalled) or task.uncancel() > 0:
                raise
        finally:
            sending = listening = False
            if stall is not None:
                stall.stop()
            waiter.cancel()
            await self._frames.aclose()
            self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            assert self._on_close is not None
            self._on_close()
