"""The event log: coalesces text deltas, assigns gap-free seq, group-commits, then publishes.

Every `end` event is written here: a running run's by its writer's final (`commit_final`,
committed with the run's final state), and the end of a run no writer holds (cancelled while
queued, dead-lettered after a lost lease) by `append_ends`, in the transaction that ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.events import EventKind, RunEvent
from bullpen.errors import BullpenError
from bullpen.store import events as event_store
from bullpen.store import runs as run_store
from bullpen.store.base import Connection, Store
from bullpen.streams.bus.base import Bus

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class RunWriter:
    """The single producer of one run attempt's events."""

    def __init__(
        self,
        log_: EventLog,
        run_id: UUID,
        task_id: UUID,
        workspace_id: UUID,
        last_seq: int,
        attempt: int | None,
        on_lost: Callable[[], None] | None,
    ) -> None:
        self._log = log_
        self.run_id = run_id
        # The fence: with an attempt, events commit only while that attempt holds the run.
        self.attempt = attempt
        self.lost = False
        self._on_lost = on_lost
        self.task_id = task_id
        self.workspace_id = workspace_id
        self._seq = last_seq
        self.committed_seq = last_seq
        self._text: list[str] = []
        self._ready: list[RunEvent] = []
        self._streamed = False

    def text(self, delta: str) -> None:
        """Append a text delta; consecutive deltas become one event per flush window."""
        if delta:
            # The first text of a run skips the coalescing window: time to first token counts.
            urgent = not self._streamed
            self._streamed = True
            self._text.append(delta)
            self._log.mark_dirty(self, urgent=urgent)

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        """Append a non-text event after any pending text."""
        self._seal_text()
        self._ready.append(self._event(kind, data))
        self._log.mark_dirty(self)

    def drain(self) -> list[RunEvent]:
        """Take every pending event, sequenced (called by the flusher)."""
        self._seal_text()
        out, self._ready = self._ready, []
        return out

    def final(self, kind: EventKind, data: dict[str, Any]) -> RunEvent:
        """Sequence the run's last event, to be committed with its final state."""
        self._seal_text()
        if self._ready:
            raise RuntimeError("flush the run's events before its final one")
        return self._event(kind, data)

    def fence_failed(self) -> None:
        """The lease moved on: drop what is pending and tell the producer to stop."""
        self.lost = True
        self._text.clear()
        self._ready.clear()
        if self._on_lost is not None:
            self._on_lost()

    def restore(self, events: list[RunEvent]) -> None:
        """Put drained events back in front after a failed commit."""
        self._ready[:0] = events

    @property
    def pending(self) -> bool:
        """Whether events wait to be committed."""
        return bool(self._text or self._ready)

    def _event(self, kind: EventKind, data: dict[str, Any]) -> RunEvent:
        self._seq += 1
        return RunEvent(self.run_id, self.task_id, self._seq, kind, data)

    def _seal_text(self) -> None:
        if self._text:
            text = "".join(self._text)
            self._text.clear()
            self._ready.append(self._event(EventKind.TEXT, {"text": text}))


@dataclass(slots=True)
class _Final:
    """A run's last event, waiting to commit with its final state change."""

    writer: RunWriter
    kind: EventKind
    data: dict[str, Any]
    change: Callable[[Connection], Awaitable[bool]]
    done: asyncio.Future[bool]


class EventLog:
    """Owns the flusher task that commits all runs' pending events together."""

    def __init__(self, store: Store, bus: Bus, *, coalesce_s: float, clock: Clock) -> None:
        self._store = store
        self._bus = bus
        self._coalesce_s = coalesce_s
        self._clock = clock
        self._dirty: set[RunWriter] = set()
        self._wake = asyncio.Event()
        self._cycle: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._committing: frozenset[RunWriter] = frozenset()
        self._urgent = asyncio.Event()
        self._finals: list[_Final] = []
        # The last commit failed, so what it sent may be stored anyway: the server may have
        # committed it and the reply been lost. The next commit sends only what is not.
        self._unsure = False
        self.commits = 0

    def writer(
        self,
        run_id: UUID,
        task_id: UUID,
        workspace_id: UUID,
        last_seq: int,
        *,
        attempt: int | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> RunWriter:
        """A writer for one run attempt, continuing after `last_seq`.

        With `attempt` (a worker's delivery) every commit is fenced: once another attempt holds
        the run, or it is no longer running, the writer's events are refused and `on_lost` is
        called.
        """
        return RunWriter(self, run_id, task_id, workspace_id, last_seq, attempt, on_lost)

    def mark_dirty(self, writer: RunWriter, *, urgent: bool = False) -> None:
        """Note that a writer has events to commit; `urgent` skips the coalescing wait."""
        if writer.lost:
            return
        self._dirty.add(writer)
        if urgent:
            self._urgent.set()
        self._wake.set()

    async def flush(self, writer: RunWriter) -> None:
        """Wait until everything the writer emitted so far is committed and published."""
        while writer.pending or writer in self._dirty or self._inflight(writer):
            self._wake.set()
            await asyncio.shield(self._cycle)

    async def commit_final(
        self,
        writer: RunWriter,
        kind: EventKind,
        data: dict[str, Any],
        change: Callable[[Connection], Awaitable[bool]],
        *,
        urgent: bool = False,
    ) -> bool:
        """Commit the run's last event with its final state change, then publish it.

        The final joins the next group commit: after the writer's pending events, in the same
        transaction as other runs' events and finals (one commit for many runs' ends). `change`
        returns False to refuse (a fenced attempt): then nothing of the final is stored.
        `urgent` skips the coalescing wait (an end someone waits for, such as a subtask's).
        """
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._finals.append(_Final(writer, kind, data, change, done))
        self._dirty.add(writer)
        if urgent:
            self._urgent.set()
        self._wake.set()
        return await done

    async def __aenter__(self) -> EventLog:
        self._task = asyncio.create_task(self._run(), name="bullpen-eventlog")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._wake.set()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._dirty or self._finals:
            await self._commit_once()

    def _inflight(self, writer: RunWriter) -> bool:
        return writer in self._committing

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._coalesce_s and not self._urgent.is_set():
                # Coalesce for a window, but a run's first text cuts the window short.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._coalesce_s):
                        await self._urgent.wait()
            self._urgent.clear()
            try:
                await self._commit_once()
            except Exception as err:
                # Keep the flusher alive whatever happens: every live stream depends on it.
                if isinstance(err, BullpenError):
                    log.warning("event commit failed, retrying: %s", err.detail)
                else:
                    log.exception("event commit failed unexpectedly, retrying")
                await asyncio.sleep(0.5)
                self._wake.set()

    async def _commit_once(self) -> None:
        writers, self._dirty = self._dirty, set()
        finals, self._finals = self._finals, []
        self._committing = frozenset(writers)
        drained: dict[RunWriter, list[RunEvent]] = {}
        done, self._cycle = self._cycle, asyncio.get_running_loop().create_future()
        try:
            for writer in writers:
                events = writer.drain()
                if events:
                    drained[writer] = events
            if not drained and not finals:
                return
            lost: list[RunWriter] = []
            applied: list[tuple[_Final, RunEvent]] = []
            # Events alone are one statement (fence and insert together), which on PostgreSQL
            # needs no transaction around it: one round trip. Finals change state with them.
            opened = self._store.write() if finals else self._store.autocommit()
            try:
                async with opened as conn:
                    lost = await self._append(conn, drained)
                    batch = [e for events in drained.values() for e in events]
                    for final in finals:
                        if final.writer.lost or final.writer in lost:
                            continue
                        event = final.writer.final(final.kind, final.data)
                        if await final.change(conn):
                            applied.append((final, event))
                    await event_store.append(
                        conn,
                        [event for _, event in applied],
                        [final.writer.workspace_id for final, _ in applied],
                        self._clock(),
                    )
            except BaseException as err:
                self._unsure = True
                self._requeue(drained)
                for final in finals:
                    if not final.done.done():
                        final.done.set_exception(err)
                raise
            self._unsure = False
            self.commits += 1
            for writer in lost:
                writer.fence_failed()
            for writer, events in drained.items():
                writer.committed_seq = events[-1].seq
            ended = [event for _, event in applied]
            for final, event in applied:
                final.writer.committed_seq = event.seq
            self._bus.publish(batch + ended)
            chosen = {id(final) for final, _ in applied}
            for final in finals:
                # A waiter cancelled meanwhile (its run's task stopped during an outage) has
                # its future done already; the others must still hear of this commit.
                if not final.done.done():
                    final.done.set_result(id(final) in chosen)
        finally:
            self._committing = frozenset()
            if not done.done():
                done.set_result(None)

    async def _append(
        self, conn: Connection, drained: dict[RunWriter, list[RunEvent]]
    ) -> list[RunWriter]:
        """Store the drained events of the writers whose attempt still holds its run; returns
        the fenced writers that lost it (their events are refused, and dropped from
        `drained`). On PostgreSQL the held runs stay share-locked until this commits, so no
        re-queue or claim can slip in between the check and the insert."""
        unstored, lost = await self._unstored(conn, drained) if self._unsure else (drained, [])
        events = [e for evs in unstored.values() for e in evs]
        owners = [w.workspace_id for w, evs in unstored.items() for _ in evs]
        attempts = [w.attempt for w, evs in unstored.items() for _ in evs]
        held = await event_store.append_fenced(conn, events, owners, attempts, self._clock())
        lost += [w for w in unstored if w.attempt is not None and held.get(w.run_id) != w.attempt]
        for writer in lost:
            del drained[writer]
        return lost

    async def _unstored(
        self, conn: Connection, drained: dict[RunWriter, list[RunEvent]]
    ) -> tuple[dict[RunWriter, list[RunEvent]], list[RunWriter]]:
        """After a commit whose outcome is unknown: each writer's events that are not stored
        yet, and the fenced writers whose attempt no longer holds its run. Sending again what
        the lost commit stored would break the (run, seq) key on every try after it."""
        stored = await event_store.last_seqs(conn, [w.run_id for w in drained])
        fenced = [w.run_id for w in drained if w.attempt is not None]
        held = await run_store.holders(conn, fenced)
        unstored: dict[RunWriter, list[RunEvent]] = {}
        lost: list[RunWriter] = []
        for writer, events in drained.items():
            if writer.attempt is not None and held.get(writer.run_id) != writer.attempt:
                lost.append(writer)
                continue
            after = stored.get(writer.run_id, 0)
            if fresh := [e for e in events if e.seq > after]:
                unstored[writer] = fresh
        return unstored, lost

    def _requeue(self, drained: dict[RunWriter, list[RunEvent]]) -> None:
        # Put drained events back in front so order and seq survive a failed commit.
        for writer, events in drained.items():
            writer.restore(events)
            self._dirty.add(writer)


@dataclass(frozen=True, slots=True)
class Ending:
    """The end of a run that no writer holds: which run, and what its `end` event says."""

    run_id: UUID
    task_id: UUID
    workspace_id: UUID
    data: dict[str, Any]


async def append_ends(conn: Connection, ends: Sequence[Ending], now: datetime) -> list[RunEvent]:
    """Append the `end` event of each run in `ends`, after its last stored event, in the
    caller's transaction (with the state change that ends it); returns them, in order, for the
    caller to publish once that transaction has committed."""
    if not ends:
        return []
    last = await event_store.last_seqs(conn, [end.run_id for end in ends])
    events = [
        RunEvent(end.run_id, end.task_id, last.get(end.run_id, 0) + 1, EventKind.END, end.data)
        for end in ends
    ]
    await event_store.append(conn, events, [end.workspace_id for end in ends], now)
    return events
