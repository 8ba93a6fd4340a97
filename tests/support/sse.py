"""A small SSE reader for tests (the load generator has its own, tuned for speed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass
class Event:
    """One parsed SSE event; markers (`run`, `close`) have no id."""

    id: str | None
    event: str
    data: dict[str, Any]

    @property
    def seq(self) -> int:
        """The run's seq: all of a run stream's id, the part after the dot of a task's."""
        assert self.id is not None
        return int(self.id.rsplit(".", 1)[-1])


async def read_events(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    *,
    stop_after: int | None = None,
    until: Callable[[list[Event]], bool] | None = None,
    markers: bool = False,
) -> list[Event]:
    """Read a stream to its end (or `stop_after` events, or until `until(events)` holds),
    returning the events with ids (and the markers without, if asked)."""
    events: list[Event] = []
    async with session.get(url, headers={**headers, "Accept": "text/event-stream"}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith(":"):
                continue
            if line == "":
                if fields:
                    event = Event(fields.get("id"), fields["event"], json.loads(fields["data"]))
                    fields = {}
                    if event.id is None and not markers:
                        continue
                    events.append(event)
                    if stop_after is not None and len(events) >= stop_after:
                        return events
                    if until is not None and until(events):
                        return events
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    return events


def text_of(events: list[Event]) -> str:
    """The concatenated text deltas."""
    return "".join(e.data["text"] for e in events if e.event == "text")
