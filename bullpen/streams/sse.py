"""Run and task event streams: replay from the store after `Last-Event-ID`, then follow live.

A stream subscribes before it replays, so nothing committed in between is missed, and drops
what it has already sent by `seq`. It goes back to the store whenever the live side may have
missed something: its subscriber lagged (a full buffer, a bus reconnect, an event too large
for the bus), a `seq` gap, or a keep-alive interval without news.

- A run's stream: event ids are the run's `seq`; it ends after the run's `end` event.
- A task's stream: every run of the task in order, each introduced by a `run` event (no id);
  event ids are `<run number>.<seq>`. It ends, with a `close` event, once the task is finished
  (done, failed or cancelled) and its last run has ended; a task waiting for a retry keeps it
  open.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from uuid import UUID

import orjson

from bullpen.domain.events import RunEvent
from bullpen.domain.status import TERMINAL_TASK, TaskStatus
from bullpen.store import events as event_store
from bullpen.store.base import Store
from bullpen.store.events import TaskRuns
from bullpen.streams.bus.memory import Subscriber

REPLAY_PAGE = 500
KEEPALIVE = b": keep-alive\n\n"

Frame = Callable[[RunEvent], bytes]


def format_event(event: RunEvent) -> bytes:
    """One SSE frame of a run's stream; `id` is the run's seq."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        event.seq,
        event.kind.value.encode(),
        orjson.dumps(event.data),
    )


def _task_frame(number: int) -> Frame:
    prefix = b"id: %d." % number

    def frame(event: RunEvent) -> bytes:
        return prefix + b"%d\nevent: %s\ndata: %s\n\n" % (
            event.seq,
            event.kind.value.encode(),
            orjson.dumps(event.data),
        )

    return frame


def _marker(name: str, data: dict[str, object]) -> bytes:
    """An event without an id: it does not move the client's resume point."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(data))


@dataclass(frozen=True, slots=True)
class TaskCursor:
    """Where a task stream resumes: after `seq` of the task's run number `run` (1-based)."""

    run: int = 1
    seq: int = 0

    @classmethod
    def parse(cls, value: str | None) -> TaskCursor:
        """From a `Last-Event-ID` of `<run>.<seq>` or a bare `<seq>` of run 1 (already checked
        by the route's pattern)."""
        if not value:
            return cls()
        run, dot, seq = value.partition(".")
        if not dot:  # a bare seq: the form of this stream's ids before runs were numbered
            return cls(1, int(run))
        return cls(max(1, int(run)), int(seq))


async def run_stream(
    store: Store, live: Subscriber, run_id: UUID, after_seq: int, keepalive_s: float
) -> AsyncGenerator[bytes, None]:
    """Frames of one run after `after_seq`, ending after its `end` event."""
    async for frame in _follow(store, live, run_id, after_seq, keepalive_s, format_event):
        yield frame


async def task_stream(
    store: Store,
    live: Subscriber,
    task_id: UUID,
    cursor: TaskCursor,
    keepalive_s: float,
    first: TaskRuns | None = None,
) -> AsyncGenerator[bytes, None]:
    """Frames of every run of the task from `cursor` on, then a `close` event. `first`: the
    task's status and runs as read after `live` was opened (`event_store.task_runs`), which
    saves the stream its own first read."""
    number, after = cursor.run, cursor.seq
    while True:
        if first is not None:
            (status, run_ids), first = first, None
        else:
            async with store.read() as conn:
                status, run_ids = await event_store.task_runs(conn, task_id)
        if number <= len(run_ids):
            run_id = run_ids[number - 1]
            yield _marker("run", {"run_id": str(run_id), "number": number})
            async for frame in _follow(
                store, live, run_id, after, keepalive_s, _task_frame(number)
            ):
                yield frame
            number, after = number + 1, 0
            continue
        if status is None or TaskStatus(status) in TERMINAL_TASK:
            yield _marker("close", {"reason": "task-ended", "status": status})
            return
        # Waiting for the task's next run: any news of the task, or the keep-alive, re-checks.
        news = await live.get(keepalive_s)
        if live.lagged:
            live.reset()
        elif news is None:
            yield KEEPALIVE


async def _follow(
    store: Store,
    live: Subscriber,
    run_id: UUID,
    after_seq: int,
    keepalive_s: float,
    frame: Frame,
) -> AsyncIterator[bytes]:
    """One run's frames after `after_seq`, replayed then live, until its `end` event."""
    last = after_seq
    # Only a resume can start at or past the run's end: the replay shows every later event,
    # the end among them. Asked once; a fresh stream (after 0) never asks.
    resumed = after_seq > 0
    while True:
        async for stored in _replay(store, run_id, last):
            yield frame(stored)
            last = stored.seq
            if stored.is_end:
                return
        if resumed:
            resumed = False
            if await _ended_by(store, run_id, after_seq):
                return  # a resume from at or past the end has nothing more to wait for
        while True:
            event = await live.get(keepalive_s)
            if live.lagged:
                live.reset()
                break  # resume from the store
            if event is None:
                yield KEEPALIVE
                break  # also re-check the store: a safety net for missed wake-ups
            if event.run_id != run_id:
                continue
            if event.seq <= last:
                if event.is_end:
                    return  # a resume from past the end: the end has come
                continue
            if event.seq != last + 1:
                break  # a gap: fill it from the store
            yield frame(event)
            last = event.seq
            if event.is_end:
                return


async def _replay(store: Store, run_id: UUID, after_seq: int) -> AsyncIterator[RunEvent]:
    last = after_seq
    while True:
        async with store.read() as conn:
            page = await event_store.after(conn, run_id=run_id, after_seq=last, limit=REPLAY_PAGE)
        for event in page:
            yield event
            last = event.seq
            if event.is_end:
                return
        if len(page) < REPLAY_PAGE:
            return


async def _ended_by(store: Store, run_id: UUID, seq: int) -> bool:
    """Whether the run's `end` event has a seq at or below `seq`."""
    async with store.read() as conn:
        end = await event_store.end_seq(conn, run_id)
    return end is not None and end <= seq
