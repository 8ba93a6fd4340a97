"""What an `llm` agent's tools do to the store: delegate, comment, finish; and its steps.

`Team` is the `agents.base.TeamPort` the adapter is given (the adapter never sees the store).

A tool step (the model's tool calls and their results) commits in one transaction with its
effects, fenced by the run's attempt: a delivery that lost its lease writes nothing. Effects are
keyed by (task, step, call), so a step delivered again after a crash finds the subtask or
comment it created before and never creates a second one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson

from bullpen.agents.base import HeldStep, Related, Report, StepResult, ToolCall
from bullpen.domain.approvals import ApprovalKind, Outcome
from bullpen.domain.records.mcp import OpenStep
from bullpen.domain.runs import ClaimedRun
from bullpen.domain.status import TERMINAL_TASK
from bullpen.errors import Conflict
from bullpen.services.enqueue import Admission, unavailable
from bullpen.store import agents as agent_store
from bullpen.store import approvals as approval_store
from bullpen.store import mcp as mcp_store
from bullpen.store import runs as run_store
from bullpen.store import workflow
from bullpen.store.base import Connection, Store

TITLE_MAX = 200
PROMPT_MAX = 100_000
COMMENT_MAX = 20_000
RESULT_MAX = 100_000


def _args(call: ToolCall) -> dict[str, Any]:
    try:
        parsed = orjson.loads(call.arguments or "{}")
    except orjson.JSONDecodeError as exc:
        raise _ToolError(f"the arguments are not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise _ToolError("the arguments must be a JSON object")
    return parsed


def _text(args: dict[str, Any], key: str, limit: int, *, required: bool = True) -> str | None:
    value = args.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _ToolError(f"'{key}' must be a non-empty string")
    if len(value) > limit:
        raise _ToolError(f"'{key}' is longer than {limit} characters")
    if "\x00" in value:  # PostgreSQL text cannot hold it (issue 19, finding 8c)
        raise _ToolError(f"'{key}' must not contain NUL characters")
    return value


class _ToolError(Exception):
    """A tool call the model got wrong: its result tells the model why."""


class Team:
    """The store side of the tool loop."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        on_enqueued: Callable[[], None],
        *,
        admission: Admission | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_enqueued = on_enqueued
        self._admission = admission or Admission()

    async def reports(self, workspace_id: UUID, agent_id: UUID) -> list[Report]:
        """The agents reporting to `agent_id`, by name."""
        async with self._store.read() as conn:
            rows = await agent_store.reports(conn, workspace_id, agent_id)
        return [Report(r.id, r.name, r.title, r.description, r.status) for r in rows]

    async def history(self, task_id: UUID) -> list[list[dict[str, Any]]]:
        """The task's completed tool steps, oldest first."""
        async with self._store.read() as conn:
            return await workflow.steps(conn, task_id)

    async def related(self, task_id: UUID) -> tuple[list[Related], list[Related]]:
        """The task's ended children (those it waits for) and ended blockers."""
        async with self._store.read() as conn:
            kids = await workflow.children(conn, task_id)
            blocks = await workflow.blockers(conn, task_id)
        ended = TERMINAL_TASK
        return (
            [_related(row) for row in kids if row.blocks_parent and row.status in ended],
            [_related(row) for row in blocks if row.status in ended],
        )

    async def commit_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        reports: list[Report],
        cost_usd: float,
        denied: tuple[frozenset[str], str] | None = None,
        given: dict[int, str] | None = None,
    ) -> StepResult:
        """Carry out a step's tool calls and record the step, in one fenced transaction;
        `denied` (tools, result): those tools' calls are not carried out, their result given;
        `given`: results of calls already made outside (by index), the step's open record
        closed."""
        now = self._clock()
        by_name = {report.name: report for report in reports}
        results: list[str] = []
        finished: str | None = None
        waits = created = False
        async with self._store.write() as conn:
            held = await run_store.holders(conn, [run.id], lock=True)
            if held.get(run.id) != run.attempt:
                raise Conflict("the run's lease moved on; this delivery stops")
            for index, call in enumerate(calls):
                key = f"{step}.{index}"
                try:
                    if denied is not None and call.name in denied[0]:
                        raise _ToolError(denied[1])
                    if given is not None and index in given:
                        results.append(given[index])
                        continue
                    args = _args(call)
                    if call.name == "delegate":
                        report = by_name.get(str(args.get("agent")))
                        if report is None:
                            names = ", ".join(sorted(by_name)) or "nobody"
                            raise _ToolError(f"'agent' must be one of your reports: {names}")
                        status = unavailable(report)
                        if status is not None:
                            raise _ToolError(f"{report.name} is {status}")
                        prompt = _text(args, "prompt", PROMPT_MAX)
                        assert prompt is not None
                        title = (
                            _text(args, "title", TITLE_MAX, required=False)
                            or (prompt.strip().splitlines()[0][:TITLE_MAX])
                        )
                        wait = args.get("wait", True)
                        if not isinstance(wait, bool):
                            raise _ToolError("'wait' must be true or false")
                        if await self._admission.too_deep(conn, run.task_id):
                            raise _ToolError(
                                f"subtasks nest at most {self._admission.max_depth} levels "
                                "below their root task: do this one yourself"
                            )
                        child, new = await workflow.delegate(
                            conn,
                            workspace_id=run.workspace_id,
                            parent_id=run.task_id,
                            agent_id=report.id,
                            title=title,
                            prompt=prompt,
                            priority=run.priority,
                            origin_key=key,
                            wait=wait,
                            now=now,
                        )
                        created |= new
                        waits |= wait
                        results.append(
                            f"created {child.task_key}-{child.number} for {report.name}"
                            + (" (you will be woken when it ends)" if wait else "")
                        )
                    elif call.name == "comment":
                        body = _text(args, "body", COMMENT_MAX)
                        assert body is not None
                        await workflow.comment_once(
                            conn,
                            workspace_id=run.workspace_id,
                            task_id=run.task_id,
                            agent_id=run.agent_id,
                            body=body,
                            origin_key=key,
                            now=now,
                        )
                        results.append("comment added")
                    elif call.name == "finish":
                        finished = _text(args, "result", RESULT_MAX)
                        results.append("finished")
                    else:
                        raise _ToolError(f"there is no tool named {call.name!r}")
                except _ToolError as err:
                    results.append(f"error: {err}")
            tool_messages = [
                {"role": "tool", "tool_call_id": call.id, "content": result}
                for call, result in zip(calls, results, strict=True)
            ]
            await workflow.store_step(
                conn,
                task_id=run.task_id,
                step=step,
                run_id=run.id,
                messages=[*messages, *tool_messages],
                cost_usd=cost_usd,
                now=now,
            )
            if given is not None:
                await mcp_store.close_step(conn, run.task_id, step)
            if created:
                self._store.after_commit(self._on_enqueued)
        return StepResult(results, tool_messages, finished, waits and finished is None)

    async def open_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        cost_usd: float,
    ) -> None:
        """Record a step about to make outside (MCP) calls, before the first (fenced): a
        delivery after a crash carries out this step, not a new answer of the model."""
        async with self._store.write() as conn:
            await self._fence(conn, run)
            await mcp_store.open_step(
                conn,
                task_id=run.task_id,
                step=step,
                run_id=run.id,
                messages=messages,
                calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
                cost_usd=cost_usd,
                now=self._clock(),
            )

    async def mark_call(
        self, run: ClaimedRun, step: int, index: int, state: dict[str, Any]
    ) -> None:
        """Record an outside call's state in its open step (fenced)."""
        async with self._store.write() as conn:
            await self._fence(conn, run)
            await mcp_store.set_call(conn, run.task_id, step, index, state)

    async def open_step_of(self, task_id: UUID, step: int) -> OpenStep | None:
        """Step `step` of the task if it was opened and never committed (a crash)."""
        async with self._store.read() as conn:
            return await mcp_store.get_open_step(conn, task_id, step)

    async def _fence(self, conn: Connection, run: ClaimedRun) -> None:
        held = await run_store.holders(conn, [run.id], lock=True)
        if held.get(run.id) != run.attempt:
            raise Conflict("the run's lease moved on; this delivery stops")

    async def hold_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        tools: frozenset[str],
        cost_usd: float,
    ) -> None:
        """Hold a step whose calls include gated `tools` for an approval (fenced): the task
        waits `awaiting_approval` once the run ends, and the next run resumes at this step."""
        now = self._clock()
        async with self._store.write() as conn:
            held = await run_store.holders(conn, [run.id], lock=True)
            if held.get(run.id) != run.attempt:
                raise Conflict("the run's lease moved on; this delivery stops")
            agent = await agent_store.get_agent(conn, run.workspace_id, run.agent_id)
            await approval_store.insert(
                conn,
                workspace_id=run.workspace_id,
                kind=ApprovalKind.TOOL_CALL,
                task_id=run.task_id,
                agent_id=run.agent_id,
                run_id=run.id,
                step=step,
                subject={
                    "tools": sorted(tools),
                    "calls": [
                        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                    ],
                    "messages": messages,
                    "cost_usd": cost_usd,
                },
                default_outcome=(agent.approval_default if agent else None) or Outcome.DENY,
                ttl_s=agent.approval_ttl_s if agent else None,
                now=now,
            )
            self._store.after_commit(self._on_enqueued)  # streams poll soon

    async def held_step(self, task_id: UUID, step: int) -> HeldStep | None:
        """Step `step` of the task if it was held for an approval (`approved` None while the
        approval is pending)."""
        async with self._store.read() as conn:
            approval = await approval_store.held_step(conn, task_id, step)
        if approval is None:
            return None
        subject = approval.subject
        return HeldStep(
            messages=list(subject["messages"]),
            calls=[ToolCall(c["id"], c["name"], c["arguments"]) for c in subject["calls"]],
            tools=frozenset(subject["tools"]),
            approved=approval.approved,
            reason=approval.reason,
            cost_usd=float(subject.get("cost_usd") or 0.0),
        )


def _related(row: Any) -> Related:
    return Related(
        task_id=row.id,
        key=f"{row.task_key}-{row.number}",
        title=row.title,
        agent=row.agent,
        status=row.status,
        result=row.result,
        error=row.error,
    )
