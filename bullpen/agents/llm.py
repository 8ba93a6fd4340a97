"""The `llm` adapter: a bounded tool loop over the gateway.

Each step is one streaming chat completion. An answer without tool calls ends the run with its
text as the result (a plain agent is one call). Tool calls are carried out and recorded as a
step (see `bullpen.services.team`), then the loop goes on: `finish` ends the run with its result;
a `delegate` that waits ends the run with the task `blocked`, and the task's next run resumes
from the stored steps with what its subtasks ended with. A step calling a tool of the config's
`approval_tools` is held (its messages kept with the approval) and the run ends with the task
`awaiting_approval`; once decided, the next run carries that step out without asking the model
again (a denied call's result says so, with the reason) and the loop goes on. MCP servers'
tools (the config's `mcp`) are offered beside the built-in ones and called at most once, even
across a crash (see `_execute` and `bullpen.agents.mcp`). Ceilings on the
steps, the wall time and the cost of a run, and a loop detector (the same call made
`loop_repeats` times on the task), stop a runaway with a typed error.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from bullpen.agents.base import (
    Events,
    HeldStep,
    MeterPort,
    Related,
    Report,
    RunContext,
    SpendPort,
    StepResult,
    TeamPort,
    ToolCall,
)
from bullpen.agents.mcp import INTERRUPTED, Grant, McpTools, Toolbox, parse_grants, refusal
from bullpen.domain.events import EventKind
from bullpen.domain.runs import RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.errors import AgentLoop, AgentStopped, BudgetExceeded, BullpenError
from bullpen.gateway.catalog import Target
from bullpen.gateway.chunks import ToolCalls
from bullpen.gateway.router import Call, Gateway, content_of

if TYPE_CHECKING:
    from bullpen.telemetry.spans import Tracing

DEFAULT_SYSTEM_PROMPT = "You are a helpful agent working on a task for your team."
TOOL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # a tool's name, as `approval_tools` lists it
APPROVAL_TOOLS_MAX = 64
MAX_STEPS, MAX_WALL_S, LOOP_REPEATS = 20, 600.0, 3
_EVENT_ARGS_MAX = 2000  # characters of a tool call's arguments shown in its event


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """What an `llm` agent's config holds."""

    model: str  # a model route, `provider/model`, or a model one provider offers
    provider: str | None  # given: `model` is this provider's model, no fallback
    system_prompt: str
    max_tokens: int | None
    max_steps: int = MAX_STEPS  # tool steps per run
    max_wall_s: float = MAX_WALL_S  # wall time per run
    max_cost_usd: float | None = None  # provider cost per run
    loop_repeats: int = LOOP_REPEATS  # the same tool call this often on a task is a loop
    approval_tools: frozenset[str] = frozenset()  # tools whose calls wait for an approval
    mcp: tuple[Grant, ...] = ()  # MCP servers and the tools of each the agent may call

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> LlmConfig:
        """Read and check an agent's stored config."""
        provider, model = raw.get("provider"), raw.get("model")
        if not isinstance(model, str) or (provider is not None and not isinstance(provider, str)):
            raise BullpenError("agent config needs a string 'model' (and 'provider' if any)")
        max_tokens = raw.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise BullpenError("agent config 'max_tokens' must be a positive integer")
        system = raw.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
        return cls(
            model,
            provider,
            str(system),
            max_tokens,
            max_steps=_positive(raw, "max_steps", MAX_STEPS, int),
            max_wall_s=_positive(raw, "max_wall_s", MAX_WALL_S, float),
            max_cost_usd=_positive(raw, "max_cost_usd", None, float),
            loop_repeats=_positive(raw, "loop_repeats", LOOP_REPEATS, int),
            approval_tools=_tool_names(raw.get("approval_tools")),
            mcp=parse_grants(raw.get("mcp")),
        )


def _tool_names(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if (
        not isinstance(value, list)
        or len(value) > APPROVAL_TOOLS_MAX
        or not all(isinstance(v, str) and re.fullmatch(TOOL_NAME, v) for v in value)
    ):
        raise BullpenError(
            f"agent config 'approval_tools' must be a list of at most {APPROVAL_TOOLS_MAX} "
            "tool names"
        )
    return frozenset(value)


def _positive(raw: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BullpenError(f"agent config {key!r} must be a positive number")
    if kind is int and not float(value).is_integer():
        raise BullpenError(f"agent config {key!r} must be a whole number")
    return kind(value)


def tool_specs(reports: list[Report]) -> list[dict[str, Any]]:
    """The tools offered to the model (`delegate` only to an agent with reports)."""

    def spec(name: str, description: str, props: dict[str, Any], required: list[str]) -> Any:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": props,
                    "required": required,
                    "additionalProperties": False,
                },
            },
        }

    tools = [
        spec(
            "comment",
            "Add a comment to your task (progress, a question, a note for the team).",
            {"body": {"type": "string"}},
            ["body"],
        ),
        spec(
            "finish",
            "End your task with its result.",
            {"result": {"type": "string"}},
            ["result"],
        ),
    ]
    if reports:
        tools.insert(
            0,
            spec(
                "delegate",
                "Create a subtask for one of your reports. With wait (the default) your task "
                "pauses and you are woken with the subtasks' results when they have all ended.",
                {
                    "agent": {"type": "string", "enum": [r.name for r in reports]},
                    "prompt": {"type": "string"},
                    "title": {"type": "string"},
                    "wait": {"type": "boolean"},
                },
                ["agent", "prompt"],
            ),
        )
    return tools


def _system(config: LlmConfig, description: str, reports: list[Report]) -> str:
    parts = [config.system_prompt]
    if description:
        parts.append(description)
    if reports:
        roster = "\n".join(
            f"- {r.name}"
            + (f" ({r.title})" if r.title else "")
            + (f": {r.description}" if r.description else "")
            for r in reports
        )
        parts.append(f"Your reports, to whom you can delegate subtasks:\n{roster}")
    return "\n\n".join(parts)


def _wake_message(ended: list[Related]) -> dict[str, Any]:
    lines = [orjson.dumps(item.as_dict()).decode() for item in ended]
    return {
        "role": "user",
        "content": "These subtasks and blockers have ended:\n" + "\n".join(lines),
        "reported": [str(item.task_id) for item in ended],
    }


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message as the provider gets it (Bullpen's own keys removed)."""
    return {k: v for k, v in message.items() if k != "reported"}


def _signature(call: ToolCall) -> tuple[str, str]:
    try:
        canonical = orjson.dumps(orjson.loads(call.arguments), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        return call.name, call.arguments
    return call.name, canonical.decode()


def _past_calls(messages: list[dict[str, Any]]) -> list[ToolCall]:
    out = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            out.append(
                ToolCall(
                    call.get("id", ""), function.get("name", ""), function.get("arguments", "")
                )
            )
    return out


@dataclass(slots=True)
class _Usage:
    """The provider usage of every call of a run, summed."""

    started: datetime
    served: Target | None = None
    model: str | None = None
    ttft_s: float | None = None
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)  # for the cost ledger
    prior_usd: float = 0.0  # what the task's earlier runs of this agent spent

    @property
    def task_usd(self) -> float:
        """The task's spend by this agent, earlier runs and this one."""
        return self.prior_usd + (self.cost_usd or 0.0)

    def add(self, call: Call, offset_s: float, meter: MeterPort | None = None) -> None:
        self.attempts.extend(call.attempts_public())
        if meter is not None and (row := meter.ledger_row(call)) is not None:
            self.calls.append(row)
        if call.served_by is None:
            return
        self.served, self.model = call.served_by, call.model or call.served_by.model
        if self.ttft_s is None and call.ttft_s is not None:
            self.ttft_s = offset_s + call.ttft_s
        self.input_tokens += call.input_tokens
        self.cached_input_tokens += call.cached_input_tokens
        self.output_tokens += call.output_tokens
        if call.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + call.cost_usd

    def outcome(
        self,
        error: BullpenError | None,
        result: str | None,
        *,
        waits: bool = False,
        delivered: bool = False,
        awaits_approval: bool = False,
    ) -> RunOutcome:
        served = self.served is not None
        return RunOutcome(
            status=RunStatus.DONE if error is None else RunStatus.FAILED,
            result=result if error is None else None,
            error=error.detail if error is not None else None,
            first_token_at=(
                self.started + timedelta(seconds=self.ttft_s) if self.ttft_s is not None else None
            ),
            ttft_ms=self.ttft_s * 1000 if self.ttft_s is not None else None,
            provider=self.served.provider.name if self.served is not None else None,
            model=self.model if served else None,
            input_tokens=self.input_tokens if served else None,
            output_tokens=self.output_tokens if served else None,
            # Retrying is safe only before any text reached the stream.
            transient=error is not None and error.transient and not delivered,
            error_code=error.slug if error is not None else None,
            cost_usd=self.cost_usd,
            cached_input_tokens=self.cached_input_tokens if served else None,
            llm_calls=self.attempts or None,
            waits=waits,
            calls=self.calls or None,
            awaits_approval=awaits_approval,
            budget_stop=isinstance(error, BudgetExceeded) and error.by_budget,
        )


class LlmAdapter:
    """Runs `llm` agents: the tool loop, over the gateway."""

    def __init__(
        self,
        gateway: Gateway,
        team: TeamPort,
        spend: SpendPort | None = None,
        mcp: McpTools | None = None,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self._gateway = gateway
        self._team = team
        self._spend = spend
        self._mcp = mcp
        self._tracing = tracing

    async def run(self, ctx: RunContext) -> RunOutcome:
        """Run the loop; provider failures and ceilings end the run `failed`, never raise."""
        usage = _Usage(ctx.started_at)
        loop = asyncio.get_running_loop()
        began = loop.time()
        delivered = False
        try:
            config = LlmConfig.parse(ctx.run.agent_config)
            catalog = await self._gateway.catalogs.catalog(ctx.run.workspace_id)
            chain = catalog.resolve(config.model, config.provider)
            if config.max_cost_usd is not None and self._spend is not None:
                usage.prior_usd = await self._spend.task_spent(ctx.run)
            return await self._loop(ctx, config, chain, usage, began)
        except _Delivered as stop:
            delivered, error = True, stop.error
        except BullpenError as err:
            error = err
        ctx.events.emit(
            EventKind.ERROR, {"message": error.detail, "code": error.slug, "partial": delivered}
        )
        return usage.outcome(error, None, delivered=delivered)

    async def _loop(
        self,
        ctx: RunContext,
        config: LlmConfig,
        chain: tuple[Target, ...],
        usage: _Usage,
        began: float,
    ) -> RunOutcome:
        run = ctx.run
        reports = (
            await self._team.reports(run.workspace_id, run.agent_id) if run.has_reports else []
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _system(config, run.agent_description, reports)},
            {"role": "user", "content": run.prompt},
        ]
        history = await self._team.history(run.task_id) if run.steps else []
        for past in history:
            messages.extend(past)
        step = len(history)
        box = Toolbox()
        if config.mcp and self._mcp is not None:
            box = await self._mcp.toolbox(run.workspace_id, config.mcp)
            for problem in box.problems:  # the run goes on without that server's tools
                ctx.events.emit(EventKind.LOG, {"message": problem, "source": "mcp"})
        opened = await self._team.open_step_of(run.task_id, step + 1) if config.mcp else None
        if opened is not None:  # a crash during the step's outside calls: finish that step
            step += 1
            calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in opened.calls]
            held = await self._team.held_step(run.task_id, step) if config.approval_tools else None
            carried = await self._execute(
                ctx,
                step,
                opened.messages,
                calls,
                reports,
                opened.cost_usd,
                box,
                denied=_denial(held),
                prior=opened.results,
            )
            messages.extend([*opened.messages, *carried.messages])
            if carried.finished is not None:
                return usage.outcome(None, carried.finished)
            if carried.waits:
                return usage.outcome(None, None, waits=True)
        elif config.approval_tools:  # a step held for an approval: carry it out once decided
            held = await self._team.held_step(run.task_id, step + 1)
            if held is not None and held.approved is None:  # a delivery again: still waiting
                return usage.outcome(None, None, awaits_approval=True)
            if held is not None:
                step += 1
                carried = await self._carry_out(ctx, held, step, reports, box)
                messages.extend([*held.messages, *carried.messages])
                if carried.finished is not None:
                    return usage.outcome(None, carried.finished)
                if carried.waits:
                    return usage.outcome(None, None, waits=True)
        reported = {item for m in messages for item in m.get("reported", ())}
        ended = [
            r for r in (*ctx.task.children, *ctx.task.blockers) if str(r.task_id) not in reported
        ]
        pending = [_wake_message(ended)] if ended else []
        seen = Counter(_signature(call) for call in _past_calls(messages))
        tools = [*tool_specs(reports), *box.specs]
        loop = asyncio.get_running_loop()
        delivered = False
        # The ceilings count the task's earlier runs of this agent too (its stored steps and
        # ledger rows): a redelivery or a wake does not start them again from zero.
        while True:
            if step >= config.max_steps:
                raise _stop(AgentStopped(f"stopped after {step} tool steps (max_steps)"), delivered)
            if config.max_cost_usd is not None and usage.task_usd >= config.max_cost_usd:
                raise _stop(
                    AgentStopped(
                        f"stopped at a cost of ${usage.task_usd:.4f} (max_cost_usd "
                        f"${config.max_cost_usd:.4f})"
                    ),
                    delivered,
                )
            # The wall-time ceiling counts the task's earlier deliveries and wakes too.
            left = config.max_wall_s - ctx.run.elapsed_s - (loop.time() - began)
            request: dict[str, Any] = {
                "messages": [_wire(m) for m in (*messages, *pending)],
                "tools": tools,
            }
            if config.max_tokens is not None:
                request["max_tokens"] = config.max_tokens
            call = Call()
            offset = loop.time() - began
            meter: MeterPort | None = None
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    if self._spend is not None:
                        ceiling = None
                        if config.max_cost_usd is not None:
                            ceiling = config.max_cost_usd - usage.task_usd
                        meter = await self._spend.open_call(run, chain, request, ceiling)
                    text, calls = await self._complete(
                        config.model, chain, request, call, ctx.events, meter
                    )
            except TimeoutError:
                usage.add(call, offset, meter)
                wall = f"{config.max_wall_s:g}"
                raise _stop(
                    AgentStopped(f"stopped after {wall} s of wall time (max_wall_s)"),
                    delivered or call.delivered,
                ) from None
            except BullpenError as err:
                usage.add(call, offset, meter)
                raise _stop(err, delivered or call.delivered) from None
            usage.add(call, offset, meter)
            delivered = delivered or call.delivered
            if not calls:
                return usage.outcome(None, text)
            for tool_call in calls:
                signature = _signature(tool_call)
                seen[signature] += 1
                if seen[signature] >= config.loop_repeats:
                    raise _stop(
                        AgentLoop(
                            f"stopped a loop: {tool_call.name} was called with the same "
                            f"arguments {seen[signature]} times"
                        ),
                        delivered,
                    )
            step += 1
            assistant = {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ],
            }
            for c in calls:
                ctx.events.emit(
                    EventKind.TOOL_CALL,
                    {
                        "step": step,
                        "id": c.id,
                        "name": c.name,
                        "arguments": c.arguments[:_EVENT_ARGS_MAX],
                    },
                )
            gated = frozenset(c.name for c in calls) & config.approval_tools
            if gated:
                await self._team.hold_step(
                    run,
                    step=step,
                    messages=[*pending, assistant],
                    calls=calls,
                    tools=gated,
                    cost_usd=call.cost_usd or 0.0,
                )
                ctx.events.emit(
                    EventKind.LOG,
                    {
                        "message": f"step {step} waits for an approval to call "
                        + ", ".join(sorted(gated)),
                        "source": "approval",
                    },
                )
                return usage.outcome(None, None, awaits_approval=True)
            done = await self._execute(
                ctx, step, [*pending, assistant], calls, reports, call.cost_usd or 0.0, box
            )
            messages.extend([*pending, assistant, *done.messages])
            pending = []
            if done.finished is not None:
                return usage.outcome(None, done.finished)
            if done.waits:
                return usage.outcome(None, None, waits=True)

    async def _carry_out(
        self, ctx: RunContext, held: HeldStep, step: int, reports: list[Report], box: Toolbox
    ) -> StepResult:
        """Commit a held step as decided, with no model call."""
        return await self._execute(
            ctx, step, held.messages, held.calls, reports, held.cost_usd, box, denied=_denial(held)
        )

    async def _execute(
        self,
        ctx: RunContext,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        reports: list[Report],
        cost_usd: float,
        box: Toolbox,
        *,
        denied: tuple[frozenset[str], str] | None = None,
        prior: dict[str, dict[str, Any]] | None = None,
    ) -> StepResult:
        """Carry out a step's calls and commit it (`_carry_calls`): every tool call of a run,
        built-in or an MCP server's, goes through here, and is traced here (a span per call,
        from before any call is carried out to the step's commit)."""
        tracing = self._tracing
        if tracing is None:
            return await self._carry_calls(
                ctx, step, messages, calls, reports, cost_usd, box, denied=denied, prior=prior
            )
        spans = tracing.start_tools(step, [(c.id, c.name, c.name in box.offered) for c in calls])
        try:
            done = await self._carry_calls(
                ctx, step, messages, calls, reports, cost_usd, box, denied=denied, prior=prior
            )
        except BaseException as exc:
            tracing.end_tools(spans, None, exc)
            raise
        tracing.end_tools(spans, done.results)
        return done

    async def _carry_calls(
        self,
        ctx: RunContext,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        reports: list[Report],
        cost_usd: float,
        box: Toolbox,
        *,
        denied: tuple[frozenset[str], str] | None = None,
        prior: dict[str, dict[str, Any]] | None = None,
    ) -> StepResult:
        """Carry out a step's calls and commit it. MCP calls reach outside the transaction, so
        the step is opened first and each call marked started, then done with its result: a
        delivery after a crash finishes the same step (`prior`: what its calls got to) and
        never makes a started call again."""
        given: dict[int, str] = {}
        outside: list[int] = []
        for index, c in enumerate(calls):
            if denied is not None and c.name in denied[0]:
                continue
            if c.name in box.offered:
                outside.append(index)
            elif (why := refusal(c.name)) is not None:
                given[index] = why
        if outside and prior is None:
            await self._team.open_step(
                ctx.run, step=step, messages=messages, calls=calls, cost_usd=cost_usd
            )
            prior = {}
        for index in outside:
            state = (prior or {}).get(str(index))
            if state is not None:
                done_before = state.get("state") == "done"
                given[index] = str(state.get("result")) if done_before else INTERRUPTED
                continue
            assert self._mcp is not None
            await self._team.mark_call(ctx.run, step, index, {"state": "started"})
            result = await self._mcp.call(box.offered[calls[index].name], calls[index].arguments)
            await self._team.mark_call(ctx.run, step, index, {"state": "done", "result": result})
            given[index] = result
        done: StepResult = await self._team.commit_step(
            ctx.run,
            step=step,
            messages=messages,
            calls=calls,
            reports=reports,
            cost_usd=cost_usd,
            denied=denied,
            given=given if given or prior is not None else None,
        )
        for c, result in zip(calls, done.results, strict=True):
            ctx.events.emit(
                EventKind.TOOL_RESULT, {"step": step, "id": c.id, "name": c.name, "result": result}
            )
        return done

    async def _complete(
        self,
        requested: str,
        chain: tuple[Target, ...],
        request: dict[str, Any],
        call: Call,
        events: Events,
        meter: MeterPort | None,
    ) -> tuple[str, list[ToolCall]]:
        """One streaming completion: its text (streamed into the run) and tool calls; traced
        once it has ended (`requested`: the model the agent's config names).

        With a meter, the output is reserved as it arrives; a refusal stops the stream there
        (closed at once, so the provider stops and the call's usage is settled)."""
        if self._tracing is None:
            return await self._stream(chain, request, call, events, meter)
        started_ns = time.time_ns()
        failure: BaseException | None = None
        output: dict[str, Any] | None = None
        try:
            text, calls = await self._stream(chain, request, call, events, meter)
            if self._tracing.capture:
                output = _assistant(text, calls)
            return text, calls
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._tracing.llm_call(
                call,
                requested=requested,
                started_ns=started_ns,
                request=request,
                output=output,
                error=failure,
            )

    async def _stream(
        self,
        chain: tuple[Target, ...],
        request: dict[str, Any],
        call: Call,
        events: Events,
        meter: MeterPort | None,
    ) -> tuple[str, list[ToolCall]]:
        parts: list[str] = []
        pieces = ToolCalls()
        stream = self._gateway.router.stream(chain, request, call)
        output = call.output  # the router counts it as it arrives
        async with contextlib.aclosing(stream):
            async for batch in stream:
                for chunk in batch:
                    text = content_of(chunk)
                    if text:
                        parts.append(text)
                        events.text(text)
                    pieces.add(chunk)
                if meter is not None and output.tokens > meter.due:
                    await meter.need(output.tokens)
        found = [ToolCall(c.id or f"call_{c.index}", c.name, c.arguments) for c in pieces.calls()]
        return "".join(parts), found


def _assistant(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    """A step's answer as an assistant message (what a traced call's output records)."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return message


def _denial(held: HeldStep | None) -> tuple[frozenset[str], str] | None:
    """The gated tools of a denied held step and their result, or None."""
    if held is None or held.approved is not False:
        return None
    why = f": {held.reason}" if held.reason else ""
    return held.tools, f"an approver denied this call{why}"


class _Delivered(Exception):
    """A failure after text reached the stream: not retried."""

    def __init__(self, error: BullpenError) -> None:
        super().__init__(error.detail)
        self.error = error


def _stop(error: BullpenError, delivered: bool) -> Exception:
    return _Delivered(error) if delivered else error
