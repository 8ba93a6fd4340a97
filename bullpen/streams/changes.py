"""Workspace streams: every task's creation and status change, and the workspace's notices
(approvals, budgets, paused agents), from the change log.

One poller per workspace per process reads the log (`bullpen.store.changes`) and keeps the
newest changes in memory; however many clients follow the workspace, the database sees one
query per poll. A poller wakes on its interval, on a run starting or ending anywhere the bus
reaches, and on a task enqueued by this process; on PostgreSQL it polls again shortly while
committed changes wait behind a transaction still running. It stops when its last reader
leaves.

A reader behind what the poller holds in memory (a resume from long ago, or a reader that was
slow) reads the store instead, page by page, until it catches up.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from uuid import UUID

import orjson

from bullpen.errors import BullpenError
from bullpen.store import changes as change_log
from bullpen.store.base import Store
from bullpen.store.changes import Change, Cursor, Notice
from bullpen.streams.bus.memory import Hub
from bullpen.streams.sse import KEEPALIVE

log = logging.getLogger(__name__)

PAGE = 500  # changes per query, and per hand-out to a reader
KEEP = 4096  # newest changes a poller keeps in memory
_HELD_RETRY_S = 0.02  # re-poll delay while committed changes wait for older transactions
_MIN_GAP_S = 0.02  # at most one poll per this interval, however many wake-ups


def format_change(change: Change) -> bytes:
    """One SSE frame, `event: task` for a task change and `event: <kind>` for a notice; the id
    is the change's position (see `cursor_id`)."""
    if isinstance(change, Notice):
        return b"id: %s\nevent: %s\ndata: %s\n\n" % (
            cursor_id(change.cursor),
            change.kind.encode(),
            orjson.dumps(change.data()),
        )
    return b"id: %s\nevent: task\ndata: %s\n\n" % (
        cursor_id(change.cursor),
        orjson.dumps(change.data()),
    )


def cursor_id(cursor: Cursor) -> bytes:
    """A position as an event id: `<xid>-<id>`, or a bare `<id>` when xid is 0 (SQLite)."""
    xid, id_ = cursor
    return b"%d-%d" % cursor if xid else b"%d" % id_


def parse_cursor(value: str) -> Cursor:
    """A position from its event id (checked by the route's pattern)."""
    xid, dash, id_ = value.partition("-")
    return (int(xid), int(id_)) if dash else (0, int(xid))


class Feed:
    """One workspace's changes in this process."""

    def __init__(self, store: Store, workspace_id: UUID, poll_s: float) -> None:
        self._store = store
        self.workspace_id = workspace_id
        self._poll_s = poll_s
        self.head: Cursor = change_log.START  # the newest change read
        self.floor: Cursor = change_log.START  # `recent` holds every change after this
        self._recent: list[Change] = []
        self._keys: list[Cursor] = []
        self._news: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self.readers = 0
        self.polls = 0
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read where the log ends now, then poll from there."""
        async with self._store.read() as conn:
            self.head = self.floor = await change_log.head(conn, self.workspace_id)
        self.task = asyncio.create_task(self._run(), name=f"bullpen-feed-{self.workspace_id}")

    def nudge(self) -> None:
        """Something may have changed: poll soon."""
        self._wake.set()

    async def next(self, cursor: Cursor, wait_s: float) -> list[Change]:
        """Changes after `cursor` in order (at most `PAGE`); empty when `wait_s` passed
        without one."""
        if cursor < self.floor:
            async with self._store.read() as conn:
                page, _held = await change_log.after(conn, self.workspace_id, cursor, PAGE)
            if page:
                return page
        waited = False
        while True:
            start = bisect.bisect_right(self._keys, cursor)
            if start < len(self._recent):
                return self._recent[start : start + PAGE]
            if waited:
                return []
            await self._wait(wait_s)
            waited = True

    async def _wait(self, wait_s: float) -> None:
        if self._news is None or self._news.done():
            self._news = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._news), wait_s)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.readers > 0:
            started = loop.time()
            try:
                async with self._store.read() as conn:
                    page, held = await change_log.after(conn, self.workspace_id, self.head, PAGE)
            except BullpenError as err:
                log.warning("workspace feed poll failed: %s", err.detail)
                page, held = [], False
            self.polls += 1
            if page:
                self._add(page)
            if len(page) == PAGE:
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _HELD_RETRY_S if held else self._poll_s)
            gap = _MIN_GAP_S - (loop.time() - started)
            if gap > 0:
                await asyncio.sleep(gap)

    def _add(self, page: list[Change]) -> None:
        self._recent.extend(page)
        self._keys.extend(change.cursor for change in page)
        self.head = page[-1].cursor
        if len(self._recent) > 2 * KEEP:
            cut = len(self._recent) - KEEP
            self.floor = self._keys[cut - 1]
            del self._recent[:cut], self._keys[:cut]
        news = self._news
        if news is not None and not news.done():
            news.set_result(None)


class Feeds:
    """This process's workspace feeds; readers count against the hub's stream limits."""

    def __init__(self, store: Store, hub: Hub, poll_s: float) -> None:
        self._store = store
        self._hub = hub
        self._poll_s = poll_s
        self._feeds: dict[UUID, Feed] = {}
        self._starting: dict[UUID, asyncio.Future[Feed]] = {}
        hub.status_watchers.append(self.nudge)

    def nudge(self) -> None:
        """Every feed polls soon (a task was enqueued, or a run started or ended)."""
        for feed in self._feeds.values():
            feed.nudge()

    async def open(
        self, workspace_id: UUID, *, counted: bool = True
    ) -> tuple[Feed, Callable[[], None]]:
        """The workspace's feed, started if need be, and the function that ends this reader.
        A `counted` reader is a stream of its own under the stream limits (429/503 beyond);
        one that is part of a stream already counted is not."""
        if counted:
            self._hub.admit(workspace_id)
        try:
            feed = await self._feed(workspace_id)
        except BaseException:
            if counted:
                self._hub.release(workspace_id)
            raise
        feed.readers += 1
        closed = False

        def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            feed.readers -= 1
            if counted:
                self._hub.release(workspace_id)
            if feed.readers == 0:
                self._stop(feed)

        return feed, close

    async def _feed(self, workspace_id: UUID) -> Feed:
        feed = self._feeds.get(workspace_id)
        if feed is not None:
            return feed
        starting = self._starting.get(workspace_id)
        if starting is not None:  # another reader is starting it: share that start
            return await asyncio.shield(starting)
        done: asyncio.Future[Feed] = asyncio.get_running_loop().create_future()
        self._starting[workspace_id] = done
        feed = Feed(self._store, workspace_id, self._poll_s)
        try:
            await feed.start()
        except BaseException as err:
            done.set_exception(err)
            done.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            self._feeds[workspace_id] = feed
            done.set_result(feed)
            return feed
        finally:
            del self._starting[workspace_id]

    def _stop(self, feed: Feed) -> None:
        if self._feeds.get(feed.workspace_id) is feed:
            del self._feeds[feed.workspace_id]
        if feed.task is not None:
            feed.task.cancel()

    async def close(self) -> None:
        """Stop every poller."""
        tasks = [f.task for f in self._feeds.values() if f.task is not None]
        self._feeds.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def feed_of(self, workspace_id: UUID) -> Feed | None:
        """The workspace's running feed, if any."""
        return self._feeds.get(workspace_id)

    @property
    def running(self) -> int:
        """Pollers running (for leak tests)."""
        return len(self._feeds)


async def workspace_stream(
    feed: Feed, cursor: Cursor | None, keepalive_s: float
) -> AsyncGenerator[bytes, None]:
    """Changes after `cursor` (from now when None), replayed then live, forever."""
    at = feed.head if cursor is None else cursor
    while True:
        page = await feed.next(at, keepalive_s)
        if not page:
            yield KEEPALIVE
            continue
        for change in page:
            yield format_change(change)
        at = page[-1].cursor
