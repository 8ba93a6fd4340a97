"""The relay's core: a caller's OpenAI call through the router, its answer and its metering.

`open_call` resolves the caller's `model` in its workspace's catalog, takes one of the
caller's stream slots and starts the router's stream (fallback, timeouts, breakers and key
redaction all happen there). The caller then reads the chunks either into one whole answer
(`RelayAnswer.absorb`, `RelayAnswer.completion`) or as SSE frames in Bullpen's own envelope
(`sse_frames`). Whatever ends the call settles it exactly once (`Settle`): the upstream stream
is closed if still open, the usage is queued for the ledger against the caller (the call's end
does not wait for that commit) and the slot is given back.

A failure after content went out ends the frames with an `error` event and no `[DONE]`, which
OpenAI clients raise. The HTTP side (authentication, response classes, headers) is in
`bullpen.api.routes.relay`, its request and response schemas in `bullpen.api.schemas.relay`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Protocol

import orjson

from bullpen.domain.principal import Principal
from bullpen.errors import BullpenError, ProviderIncomplete
from bullpen.gateway.catalog import Target
from bullpen.gateway.chunks import ToolCalls
from bullpen.gateway.router import Call, CatalogSource, Router, estimate_prompt_tokens

DONE = b"data: [DONE]\n\n"

Chunks = AsyncGenerator[list[dict[str, Any]], None]


class Ledger(Protocol):
    """Where usage rows go (`bullpen.services.ledger.UsageLedger`)."""

    def record(self, row: dict[str, Any] | None, draw: Any = None) -> asyncio.Future[None]:
        """Queue one row, and what the call drew from its budgets' pool (settled with it);
        the future says it committed."""
        ...


class Hold(Protocol):
    """A relayed call's hold on the budgets that cover it (`bullpen.services.spend`)."""

    @property
    def due(self) -> float:
        """`need` has nothing to do until the call's output passes this."""
        ...

    async def need(self, output_tokens: int) -> None:
        """Make sure this much output is reserved; raise `BudgetExceeded` to stop the stream."""
        ...

    def finish(self, call: Call) -> Any:
        """The call ended: what it drew and cost, for the ledger to settle (None: nothing)."""
        ...


class Budgets(Protocol):
    """Budgets as relayed calls meet them (`bullpen.services.spend.RelayBudgets`)."""

    async def open(
        self, principal: Principal, chain: Sequence[Target], request: dict[str, Any]
    ) -> Hold | None:
        """Reserve for a call about to be made (None: no budget covers it); raise
        `BudgetExceeded` when one has no room."""
        ...


class StreamSlots(Protocol):
    """Bounds the calls open at once per workspace and caller."""

    def take(self, workspace: str, caller: str) -> None:
        """Take a slot, or raise when none is free."""
        ...

    def give_back(self, workspace: str, caller: str) -> None:
        """Free a slot taken by `take`."""
        ...


class KeyRates(Protocol):
    """Counts API keys' requests and tokens per minute (`bullpen.security.ratelimit.KeyWindows`)."""

    def admit(self, key: str, *, rpm: int | None, tpm: int | None, estimate: int) -> Any:
        """Count one call of `key` (its prompt estimate in flight), or raise when over a limit;
        returns what `settle` needs."""
        ...

    def settle(self, ticket: Any, tokens: int) -> None:
        """The call ended having used `tokens` (input + output)."""
        ...


class Settle:
    """Ends a relay call exactly once: closes the upstream stream if still open, records the
    usage against the caller, counts its tokens against its key's TPM and gives back the
    stream slot."""

    __slots__ = (
        "_call",
        "_chunks",
        "_clock",
        "_done",
        "_hold",
        "_ledger",
        "_observe",
        "_principal",
        "_rates",
        "_slots",
        "_ticket",
    )

    def __init__(
        self,
        call: Call,
        chunks: Chunks,
        principal: Principal,
        *,
        ledger: Ledger,
        slots: StreamSlots,
        clock: Callable[[], datetime],
        rates: KeyRates | None = None,
        ticket: Any = None,
        hold: Hold | None = None,
        observe: Callable[[Call], None] | None = None,
    ) -> None:
        self._call = call
        self._hold = hold
        self._observe = observe
        self._chunks = chunks
        self._principal = principal
        self._ledger = ledger
        self._slots = slots
        self._clock = clock
        self._rates = rates
        self._ticket = ticket
        self._done = False

    @property
    def call(self) -> Call:
        """The gateway call being settled."""
        return self._call

    async def meter(self) -> None:
        """Reserve the output read so far against the call's budgets, if any cover it;
        `BudgetExceeded` stops the call (settling it closes the upstream stream). Callers read
        a batch, pass it on, then call this: the batch that reaches a budget still goes out."""
        hold, output = self._hold, self._call.output
        if hold is not None and output.tokens > hold.due:
            await hold.need(output.tokens)

    def __call__(self) -> None:
        """The call ended: queue its usage for the ledger (which commits it within moments;
        the caller does not wait for that) and free the slot. An upstream still open is closed
        first, in the background, and the rest follows once it is."""
        if self._done:
            return
        self._done = True
        if getattr(self._chunks, "ag_frame", None) is not None:
            # Unfinished (a client gone mid-stream, a budget's stop): closing it closes the
            # upstream request and counts the usage of what streamed, which is then owed.
            _background(self._close_then_record())
            return
        self._record()

    async def _close_then_record(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            self._record()

    def _record(self) -> None:
        row = usage_row(self._principal, self._call, self._clock)
        draw = None if self._hold is None else self._hold.finish(self._call)
        if row is not None or draw is not None:
            self._ledger.record(row, draw)
        if self._rates is not None and self._ticket is not None:
            call = self._call
            used = call.input_tokens + call.output_tokens if call.served_by is not None else 0
            self._rates.settle(self._ticket, used)
        self._slots.give_back(str(self._principal.workspace_id), self._principal.scope_id)
        if self._observe is not None:  # tracing: the call's span, now that it has ended
            self._observe(self._call)


async def open_call(
    catalogs: CatalogSource,
    router: Router,
    principal: Principal,
    model: str,
    body: dict[str, Any],
    *,
    ledger: Ledger,
    slots: StreamSlots,
    clock: Callable[[], datetime],
    rates: KeyRates | None = None,
    budgets: Budgets | None = None,
    observe: Callable[[Call], None] | None = None,
) -> tuple[Call, Chunks, Settle]:
    """Start one relayed call: the call's record, its chunks (not read yet) and its settling.

    An unknown model, a caller out of slots, a key over its requests or tokens per minute or
    a budget with no room left raises here, before anything needs settling. `observe` is
    given the call once it ended (tracing)."""
    catalog = await catalogs.catalog(principal.workspace_id)
    chain = catalog.resolve(model)
    workspace, caller = str(principal.workspace_id), principal.scope_id
    slots.take(workspace, caller)
    ticket = None
    if rates is not None and (principal.rpm_limit is not None or principal.tpm_limit is not None):
        estimate = 0
        if principal.tpm_limit is not None:
            estimate = estimate_prompt_tokens(body.get("messages") or ())
        try:
            ticket = rates.admit(
                caller, rpm=principal.rpm_limit, tpm=principal.tpm_limit, estimate=estimate
            )
        except BaseException:
            slots.give_back(workspace, caller)
            raise
    hold = None
    try:
        if budgets is not None:
            hold = await budgets.open(principal, chain, body)
    except BaseException:
        if ticket is not None and rates is not None:
            rates.settle(ticket, 0)
        slots.give_back(workspace, caller)
        raise
    call = Call()
    chunks = router.stream(chain, body, call)
    return (
        call,
        chunks,
        Settle(
            call,
            chunks,
            principal,
            ledger=ledger,
            slots=slots,
            clock=clock,
            rates=rates,
            ticket=ticket,
            hold=hold,
            observe=observe,
        ),
    )


_closing: set[asyncio.Task[None]] = set()


def _background(closing: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(closing)
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def until_content(
    chunks: AsyncIterator[list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The first batch: it holds the first content (the router yields nothing before it)."""
    async for batch in chunks:
        return batch
    return []


async def whole_answer(settle: Settle, answer: RelayAnswer, chunks: Chunks) -> None:
    """Read a call not streamed to its caller into `answer`, metered as it arrives."""
    async for batch in chunks:
        for chunk in batch:
            answer.absorb(chunk)
        await settle.meter()


async def sse_frames(
    settle: Settle,
    answer: RelayAnswer,
    opening: list[dict[str, Any]],
    chunks: AsyncIterator[list[dict[str, Any]]],
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    """The streamed answer as SSE bytes: the role chunk with the opening batch, one yield per
    upstream read, then the usage chunk (if asked for) and `[DONE]`; settles the call."""
    # One yield (one socket write) per upstream read: what arrived together leaves together.
    try:
        yield answer.frame([{"index": 0, "delta": {"role": "assistant", "content": ""}}]) + (
            answer.frames(opening)
        )
        try:
            await settle.meter()
            async for batch in chunks:
                frames = answer.frames(batch)
                if frames:
                    yield frames
                await settle.meter()
        except BullpenError as err:
            # Content went out already: say so in-band, and never send [DONE].
            yield error_frame(err)
            return
        settle()
        yield (answer.usage_frame(settle.call) if include_usage else b"") + DONE
    finally:
        settle()


def error_frame(err: BullpenError) -> bytes:
    """The in-band `error` event that ends a stream which already sent content (a budget's
    stop is OpenAI's `insufficient_quota`)."""
    code = err.slug if not isinstance(err, ProviderIncomplete) else "provider-incomplete"
    kind, code = err.openai_error or (code, code)
    return (
        b"data: "
        + orjson.dumps({"error": {"message": err.detail, "type": kind, "code": code}})
        + b"\n\n"
    )


class RelayAnswer:
    """Chunks in our own envelope (our id, the model name the caller used), and the whole
    answer for non-streaming callers."""

    __slots__ = (
        "_created",
        "_head",
        "_id",
        "_keep",
        "_model",
        "finish_reason",
        "text",
        "tool_calls",
    )

    def __init__(self, model: str, *, keep: bool = False) -> None:
        """`keep`: a streamed answer is kept whole too (tracing records it)."""
        self._id = "chatcmpl-" + secrets.token_hex(12)
        self._keep = keep
        self._created = int(time.time())
        self._model = model
        envelope = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": model,
        }
        self._head = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":'
        self.text: list[str] = []
        self.tool_calls = ToolCalls()
        self.finish_reason: str | None = None

    def frame(self, choices: list[dict[str, Any]]) -> bytes:
        """One SSE frame carrying `choices`."""
        return self._head + orjson.dumps(choices) + b"}\n\n"

    def frames(self, batch: list[dict[str, Any]]) -> bytes:
        """The frames for upstream chunks (its usage-only chunk is replaced by ours)."""
        if self._keep:
            for chunk in batch:
                self.absorb(chunk)
        return b"".join(self.frame(c["choices"]) for c in batch if c.get("choices"))

    def usage_frame(self, call: Call) -> bytes:
        """The trailing usage chunk OpenAI sends with `include_usage`."""
        return self._head + b"[]" + b',"usage":' + orjson.dumps(usage_of(call)) + b"}\n\n"

    def absorb(self, chunk: dict[str, Any]) -> None:
        """Collect a chunk into the whole answer (text, tool calls, finish reason)."""
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if isinstance(content, str):
            self.text.append(content)
        if isinstance(delta, dict):
            self.tool_calls.add_delta(delta)

    def message(self) -> dict[str, Any]:
        """The answer so far as an assistant message."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls.calls()
            ]
        return message

    def completion(self, call: Call) -> dict[str, Any]:
        """The non-streaming answer."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls.calls()
            ]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": usage_of(call),
        }


def usage_of(call: Call) -> dict[str, Any]:
    """A call's usage in OpenAI's `usage` shape."""
    return {
        "prompt_tokens": call.input_tokens,
        "completion_tokens": call.output_tokens,
        "total_tokens": call.input_tokens + call.output_tokens,
        "prompt_tokens_details": {"cached_tokens": call.cached_input_tokens},
    }


def usage_row(
    principal: Principal, call: Call, clock: Callable[[], datetime]
) -> dict[str, Any] | None:
    """The call's ledger row, against the caller; None if it used nothing."""
    served = call.served_by
    if served is None or call.cost_usd is None:
        return None
    return {
        "workspace_id": principal.workspace_id,
        "run_id": None,
        "agent_id": principal.agent_id,
        "user_id": principal.user_id,
        "api_key_id": principal.api_key_id,
        "provider": served.provider.name,
        "model": call.model or served.model,
        "input_tokens": call.input_tokens,
        "cached_input_tokens": call.cached_input_tokens,
        "output_tokens": call.output_tokens,
        "cost_usd": call.cost_usd,
        "created_at": clock(),
    }
