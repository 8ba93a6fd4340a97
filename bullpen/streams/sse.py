"""A task's event stream: replay from the store after Last-Event-ID, then follow live."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import orjson

from bullpen.domain.events import RunEvent
from bullpen.store import events as event_store
from bullpen.store.base import Store
from bullpen.streams.bus.base import Bus

REPLAY_PAGE = 500


def format_event(event: RunEvent) -> bytes:
    """One SSE frame; `id` is the run's seq so clients resume with Last-Event-ID."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        event.seq,
        event.kind.value.encode(),
        orjson.dumps(event.data),
    )


KEEPALIVE = b": keep-alive\n\n"


async def task_stream(
    store: Store, bus: Bus, task_id: UUID, after_seq: int, keepalive_s: float
) -> AsyncIterator[bytes]:
    """Frames of the task's latest run after `after_seq`, ending after its `end` event."""
    # Subscribe before replaying so nothing committed in between is missed; seq de-duplicates.
    async with bus.subscribe(task_id) as live:
        last = after_seq
        run_id: UUID | None = None
        while True:
            if run_id is None:
                async with store.read() as conn:
                    run_id = await event_store.latest_run_id(conn, task_id)
            if run_id is not None:
                ended = False
                async for frame, seq, is_end in _replay(store, run_id, last):
                    yield frame
                    last = seq
                    ended = ended or is_end
                if ended or await _ended_by(store, run_id, last):
                    return  # a resume from at or past the end has nothing more to wait for
            while True:
                event = await live.get(keepalive_s)
                if live.lagged:
                    live.reset()
                    break  # resume from the store
                if event is None:
                    yield KEEPALIVE
                    break  # also re-check the store: a safety net for missed wake-ups
                if event.seq <= last or (run_id is not None and event.run_id != run_id):
                    continue
                if event.seq != last + 1:
                    break  # a gap: fill it from the store
                run_id = event.run_id
                yield format_event(event)
                last = event.seq
                if event.is_end:
                    return


async def _replay(
    store: Store, run_id: UUID, after_seq: int
) -> AsyncIterator[tuple[bytes, int, bool]]:
    last = after_seq
    while True:
        async with store.read() as conn:
            page = await event_store.after(conn, run_id=run_id, after_seq=last, limit=REPLAY_PAGE)
        for event in page:
            yield format_event(event), event.seq, event.is_end
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
