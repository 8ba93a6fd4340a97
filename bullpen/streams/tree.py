"""A task's stream with its subtasks: the task's runs (as `task_stream`) merged with a `task`
event for every creation and status change in its tree (the task, its subtasks, theirs...).

The two parts advance independently, so every event's id carries both positions:
`<run>.<seq>~<change>` (the task part as in `task_stream`, then the change log's). A resume
continues each part from its own position. The stream ends, with the task part's `close`, once
the task has finished and its own last change has been sent (or a keep-alive interval has
passed waiting for it), so the tree's changes up to the end are never cut off.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from uuid import UUID

from bullpen.store import changes as change_log
from bullpen.store.base import Store
from bullpen.store.changes import Cursor, Notice
from bullpen.streams.bus.memory import Subscriber
from bullpen.streams.changes import Feed, cursor_id, format_change, parse_cursor
from bullpen.streams.sse import KEEPALIVE, TaskCursor, task_stream

_CLOSE = b"event: close\n"


def split_cursor(value: str | None) -> tuple[str | None, Cursor | None]:
    """(the task part, the change log part) of a `Last-Event-ID` (checked by the route)."""
    if not value:
        return None, None
    task_part, tilde, change_part = value.partition("~")
    if not tilde:
        return task_part, None
    return task_part, parse_cursor(change_part)


async def tree_stream(
    store: Store,
    live: Subscriber,
    feed: Feed,
    task_id: UUID,
    last_event_id: str | None,
    keepalive_s: float,
) -> AsyncGenerator[bytes, None]:
    """The task's runs and its tree's changes, merged; ids carry both parts' positions."""
    task_part, changes_at = split_cursor(last_event_id)
    cursor = TaskCursor.parse(task_part)
    run_id = b"%d.%d" % (cursor.run, cursor.seq)
    if changes_at is None:
        async with store.read() as conn:
            tree = await change_log.subtree(conn, task_id)
            changes_at = await change_log.first_of(conn, tree) or feed.head
    change_id = cursor_id(changes_at)
    # (is a run frame, the frame, a change frame's position)
    queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=64)

    async def pump(frames: AsyncGenerator[_Item, None]) -> None:
        try:
            async for item in frames:
                await queue.put(item)
        finally:
            await frames.aclose()

    parts = [
        asyncio.create_task(pump(_run_frames(store, live, task_id, cursor, keepalive_s))),
        asyncio.create_task(pump(_tree_changes(store, feed, task_id, changes_at, keepalive_s))),
    ]
    closing: bytes | None = None
    last: Cursor | None = None  # when closing: the task's own last change
    try:
        while True:
            try:
                async with asyncio.timeout(keepalive_s if closing else None):
                    is_run, frame, at = await _next(queue, parts)
            except TimeoutError:  # only while closing: the task's final change is late
                assert closing is not None
                yield closing
                return
            if frame.startswith(_CLOSE):  # the task ended: let its final change through first
                closing = frame
                async with store.read() as conn:
                    last = await change_log.last_of(conn, task_id)
            elif frame.startswith(b"id: "):
                if is_run:
                    run_id, frame = _retag(frame, change_id, first=True)
                else:
                    change_id, frame = _retag(frame, run_id, first=False)
                yield frame
            elif not closing:
                yield frame  # a marker or a keep-alive
            if at is not None:
                changes_at = at
            if closing and (last is None or changes_at >= last):
                yield closing
                return
    finally:
        for task in parts:
            task.cancel()
        await asyncio.gather(*parts, return_exceptions=True)


_Item = tuple[bool, bytes, Cursor | None]


async def _next(queue: asyncio.Queue[_Item], parts: list[asyncio.Task[None]]) -> _Item:
    """The next item of either part; a part that failed raises here."""
    while True:
        if not queue.empty():
            return queue.get_nowait()
        getter = asyncio.ensure_future(queue.get())
        going = [part for part in parts if not part.done()]
        try:
            done, _ = await asyncio.wait([getter, *going], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter in done:
            return getter.result()
        for part in done:
            part.result()  # raises a part's error; a part that ended leaves the other going


async def _run_frames(
    store: Store, live: Subscriber, task_id: UUID, cursor: TaskCursor, keepalive_s: float
) -> AsyncGenerator[_Item, None]:
    async for frame in task_stream(store, live, task_id, cursor, keepalive_s):
        yield True, frame, None


def _retag(frame: bytes, other: bytes, *, first: bool) -> tuple[bytes, bytes]:
    """(the position in the frame's id, the frame with the combined id: the task part first)."""
    end = frame.index(b"\n")
    own = frame[4:end]
    combined = own + b"~" + other if first else other + b"~" + own
    return own, b"id: " + combined + frame[end:]


async def _tree_changes(
    store: Store, feed: Feed, root: UUID, after: Cursor, keepalive_s: float
) -> AsyncGenerator[_Item, None]:
    """Changes of the root's tree after `after`; a new task joins the tree when its parent
    is in it (a parent's creation always precedes its children's)."""
    async with store.read() as conn:
        tree = await change_log.subtree(conn, root)
    at = after
    while True:
        page = await feed.next(at, keepalive_s)
        if not page:
            yield False, KEEPALIVE, None
            continue
        for change in page:
            if isinstance(change, Notice):  # workspace notices are not a tree's
                continue
            if change.parent_id in tree:
                tree.add(change.task_id)
            if change.task_id in tree:
                yield False, format_change(change), change.cursor
        at = page[-1].cursor
