"""The `process` adapter's output: stdout and stderr pipes turned into run events.

Stdout streams as `text` and becomes the result (its tail past 1 Mi characters); stderr becomes
one `log` event per line, cut at 8 KiB; both together stay within the run's output budget.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Callable
from typing import Any, Protocol

from bullpen.agents.base import Events
from bullpen.domain.events import EventKind

LINE_MAX_BYTES = 8 * 1024
RESULT_CUT_MARK = "[… earlier output cut …]\n"


class OutputBudget:
    """The output bytes a run may still write; running out kills its process group."""

    def __init__(self, limit: int, stop: Callable[[], None]) -> None:
        self._left = limit
        self._stop = stop
        self.exceeded = False

    def take(self, data: bytes) -> bytes:
        """The part of `data` within the budget; stops the group when it runs out."""
        if self.exceeded:
            return b""
        if len(data) > self._left:
            self.exceeded = True
            self._stop()
            return data[: self._left]
        self._left -= len(data)
        return data


class OutputSink(Protocol):
    """Turns one output pipe's bytes into events."""

    def feed(self, data: bytes) -> None:
        """Take the next bytes read."""

    def end(self) -> None:
        """The pipe is closed: flush what is held back."""


class StdoutSink:
    """Stdout: `text` events as the bytes arrive, and the run's result (its tail)."""

    def __init__(self, events: Events, result_max: int) -> None:
        self._events = events
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._result_max = result_max
        self._parts: list[str] = []
        self._size = 0
        self._cut = False

    def feed(self, data: bytes) -> None:
        """Emit the decoded text (a character split across reads waits for its rest)."""
        self._add(self._decoder.decode(data))

    def end(self) -> None:
        """Emit what an incomplete last character leaves (a replacement character)."""
        self._add(self._decoder.decode(b"", final=True))

    def result(self) -> str:
        """All of stdout, or its last `result_max` characters after a cut mark."""
        text = "".join(self._parts)
        if self._cut or len(text) > self._result_max:
            return RESULT_CUT_MARK + text[-self._result_max :]
        return text

    def _add(self, text: str) -> None:
        if not text:
            return
        text = text.replace("\x00", "\ufffd")
        self._events.text(text)
        self._parts.append(text)
        self._size += len(text)
        if self._size > 2 * self._result_max:  # compact now and then, not at every read
            kept = "".join(self._parts)[-self._result_max :]
            self._parts, self._size, self._cut = [kept], len(kept), True


class StderrSink:
    """Stderr: one `log` event per line, long lines cut; remembers the last non-empty line."""

    def __init__(self, events: Events) -> None:
        self._events = events
        self._line = bytearray()
        self._truncated = False
        self.last_line: str | None = None

    def feed(self, data: bytes) -> None:
        """Emit each line the bytes complete; hold the unfinished one."""
        *complete, rest = data.split(b"\n")
        for part in complete:
            self._hold(part)
            self._emit()
        self._hold(rest)

    def end(self) -> None:
        """Emit an unfinished last line."""
        if self._line or self._truncated:
            self._emit()

    def _hold(self, part: bytes) -> None:
        room = LINE_MAX_BYTES - len(self._line)
        if len(part) > room:
            part = part[:room]
            self._truncated = True
        self._line += part

    def _emit(self) -> None:
        line = self._line.decode("utf-8", errors="replace").removesuffix("\r")
        line = line.replace("\x00", "\ufffd")
        data: dict[str, Any] = {"stream": "stderr", "line": line}
        if self._truncated:
            data["truncated"] = True
        self._events.emit(EventKind.LOG, data)
        if line.strip():
            self.last_line = line
        self._line.clear()
        self._truncated = False


class PipeReader(asyncio.Protocol):
    """Hands what one of the command's output pipes carries to its sink, within the budget."""

    def __init__(self, sink: OutputSink, budget: OutputBudget, kill: Callable[[], None]) -> None:
        self._sink = sink
        self._budget = budget
        self._kill = kill
        self._attached = True
        self.error: Exception | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        """Pass the bytes on; a sink that fails ends the run (its error is raised after)."""
        if not self._attached or self.error is not None:
            return
        try:
            self._sink.feed(self._budget.take(data))
        except Exception as exc:
            self.error = exc
            self._kill()

    def connection_lost(self, exc: Exception | None) -> None:
        """The pipe is closed: let the sink flush, and mark the reader done."""
        if self._attached and self.error is None:
            try:
                self._sink.end()
            except Exception as err:
                self.error = err
        if not self.closed.done():
            self.closed.set_result(None)

    def detach(self) -> None:
        """Pass nothing more to the sink."""
        self._attached = False
