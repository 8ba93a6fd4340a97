"""Fallback across a route's providers, allowed only until the first content reaches the caller.

The rules (docs/gateway.md):
- Try the chain in order; skip a provider whose breaker is open.
- Move on after a connect failure, no first token within the provider's limit, 429 (after
  waiting out a short `Retry-After` once), 5xx or 529 overload, or a stream that errors or ends
  before any content.
- Fail at once, with the provider's typed error, on a refused request (400-class), refused
  credentials or an exhausted spend limit.
- After content has reached the caller nothing is retried: a failure ends the call as
  `ProviderIncomplete`, the text already passed on stays as it is, and the attempt that served
  it is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from bullpen.errors import (
    ProviderError,
    ProviderIncomplete,
    ProviderTimeout,
    ProviderUnavailable,
)
from bullpen.gateway.breaker import Breakers
from bullpen.gateway.catalog import Catalog, Price, Target
from bullpen.gateway.chunks import CHARS_PER_TOKEN, OutputCount
from bullpen.gateway.client import Exchange, GatewayClient
from bullpen.gateway.metrics import GatewayMetrics
from bullpen.gateway.redact import ChunkRedactor

_MESSAGE_OVERHEAD_TOKENS = 4


@dataclass(slots=True)
class Attempt:
    """One request to one provider within a call."""

    provider: str
    model: str
    outcome: str  # ok, failed, skipped (breaker open), incomplete, cancelled
    reason: str | None = None
    detail: str | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    started: float = 0.0  # the event loop's clock when it began (for its trace span)

    def public(self) -> dict[str, Any]:
        """The attempt as runs and logs record it."""
        return {
            "provider": self.provider,
            "model": self.model,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
            "ttft_ms": _ms(self.ttft_ms),
            "duration_ms": _ms(self.duration_ms),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass(slots=True)
class Call:
    """One gateway call: its attempts, who served it, its usage and cost."""

    attempts: list[Attempt] = field(default_factory=list)
    served_by: Target | None = None
    model: str | None = None  # the model name the provider reported
    delivered: bool = False  # content reached the caller: no more fallback
    ttft_s: float | None = None  # from the start of the call, failed attempts included
    finish_reason: str | None = None
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    usage_estimated: bool = False
    cost_usd: float | None = None
    # Output received so far, counted as it arrives: what metering reads between reads, and
    # the usage of a stream that ends without the provider's count.
    output: OutputCount = field(default_factory=OutputCount)

    def attempts_public(self) -> list[dict[str, Any]]:
        """Every attempt, as stored on the run."""
        return [a.public() for a in self.attempts]


class Router:
    """Runs calls over fallback chains; one per process (it owns the breakers' view)."""

    def __init__(
        self,
        client: GatewayClient,
        breakers: Breakers,
        metrics: GatewayMetrics,
        *,
        retry_after_max_s: float = 2.0,
    ) -> None:
        self._client = client
        self._breakers = breakers
        self._metrics = metrics
        self._retry_after_max_s = retry_after_max_s

    @property
    def breakers(self) -> Breakers:
        """This process's breakers (read-only use: the dashboard shows them)."""
        return self._breakers

    @property
    def client(self) -> GatewayClient:
        """The client calls go through (a provider check uses it too)."""
        return self._client

    async def stream(
        self, chain: Sequence[Target], request: Mapping[str, Any], call: Call
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """Yield the serving provider's chunks in batches (one per read), content redacted of
        its key; fill `call`.

        `request` is an OpenAI chat completion body without `model` and `stream`.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        last: ProviderError | None = None
        retry_hint: float | None = None
        for target in chain:
            provider = target.provider
            breaker = self._breakers.get(provider.key, provider.name)
            if not breaker.allow():
                call.attempts.append(
                    Attempt(
                        provider.name,
                        target.model,
                        "skipped",
                        "breaker-open",
                        started=loop.time(),
                    )
                )
                self._metrics.fell_back(provider.key, "breaker-open")
                continue
            waited = False
            while True:
                attempt_started = loop.time()
                attempt = Attempt(provider.name, target.model, "failed", started=attempt_started)
                call.attempts.append(attempt)
                try:
                    # Closed here, not when collected: a caller that stops reading (a budget's
                    # stop) needs the attempt's usage settled into `call` at once.
                    attempt_stream = self._attempt(target, request, call, attempt, started)
                    async with contextlib.aclosing(attempt_stream):
                        async for batch in attempt_stream:
                            yield batch
                except ProviderError as err:
                    attempt.reason, attempt.detail = err.reason, err.detail
                    self._metrics.outcome(provider.key, err.reason)
                    if call.delivered:
                        attempt.outcome = "incomplete"
                        breaker.failed() if err.transient else breaker.abandoned()
                        raise ProviderIncomplete(
                            f"the stream from {provider.name!r} broke after text was sent "
                            f"({err.reason}); the partial text is kept",
                            reason=err.reason,
                        ) from None
                    if not err.transient:
                        breaker.abandoned()
                        raise
                    breaker.failed()
                    last = err
                    pause = err.retry_after
                    if pause is not None:
                        retry_hint = pause if retry_hint is None else min(retry_hint, pause)
                    if (
                        not waited
                        and pause is not None
                        and pause <= self._retry_after_max_s
                        and breaker.allow()
                    ):
                        waited = True
                        await asyncio.sleep(pause)
                        continue
                    self._metrics.fell_back(provider.key, err.reason)
                    break
                except (asyncio.CancelledError, GeneratorExit):
                    # The caller went away (a cancelled run, a closed stream): no verdict on
                    # the provider, and a probe in flight must not keep its breaker shut.
                    attempt.outcome, attempt.reason = "cancelled", "cancelled"
                    breaker.abandoned()
                    raise
                else:
                    attempt.outcome = "ok"
                    breaker.succeeded()
                    self._metrics.outcome(provider.key, "ok")
                    return
                finally:
                    attempt.duration_ms = (loop.time() - attempt_started) * 1000
        tried = [a for a in call.attempts if a.outcome != "skipped"]
        if last is None:
            raise ProviderUnavailable(
                "every provider of this route is cooling down after failures "
                "(circuit breaker open); try again shortly",
                reason="breaker-open",
                retry_after=1.0,
            )
        if len(tried) == 1 and isinstance(last, ProviderTimeout):
            raise last
        summary = "; ".join(f"{a.provider}: {a.reason}" for a in tried)
        raise ProviderUnavailable(
            last.detail if len(tried) == 1 else f"no provider answered ({summary})",
            reason=last.reason,
            retry_after=retry_hint if retry_hint is not None else 1.0,
        )

    async def _attempt(
        self,
        target: Target,
        request: Mapping[str, Any],
        call: Call,
        attempt: Attempt,
        call_started: float,
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        provider = target.provider
        exchange = Exchange()
        body = {
            **request,
            "model": target.model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        redactor = ChunkRedactor((provider.api_key,)) if provider.api_key else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + provider.timeouts.deadline_s
        try:
            async for batch in self._client.stream(provider, body, exchange):
                if not call.delivered and exchange.content_chunks:
                    call.delivered = True
                    call.served_by = target
                    call.ttft_s = loop.time() - call_started
                    attempt.ttft_ms = (exchange.ttft_s or 0.0) * 1000
                    self._metrics.first_token(provider.key, exchange.ttft_s or 0.0)
                elif loop.time() > deadline:
                    raise ProviderTimeout(
                        f"provider {provider.name!r} did not finish within its "
                        f"{provider.timeouts.deadline_s:g} s deadline",
                        reason="deadline",
                    )
                for chunk in batch:
                    if redactor is not None:
                        redactor.chunk(chunk)
                    call.output.add(chunk, content_of(chunk))
                yield batch
        finally:
            if call.served_by is target:  # served, completely or not: its usage is owed
                call.finish_reason = exchange.finish_reason
                call.model = exchange.model or target.model
                _settle_usage(call, exchange, request, provider.price(target.model))
                attempt.input_tokens, attempt.output_tokens = (
                    call.input_tokens,
                    call.output_tokens,
                )


def _settle_usage(call: Call, exchange: Exchange, request: Mapping[str, Any], price: Price) -> None:
    """Usage from the stream's usage chunk, else counted; cost from the price table."""
    if exchange.input_tokens is not None and exchange.output_tokens is not None:
        call.input_tokens = exchange.input_tokens
        call.output_tokens = exchange.output_tokens
        call.cached_input_tokens = exchange.cached_input_tokens or 0
    else:
        call.usage_estimated = True
        call.input_tokens = estimate_prompt_tokens(request.get("messages") or ())
        call.output_tokens = max(exchange.content_chunks, call.output.tokens)
        call.cached_input_tokens = 0
    call.cost_usd = price.cost(call.input_tokens, call.cached_input_tokens, call.output_tokens)


def estimate_prompt_tokens(messages: Sequence[Any]) -> int:
    """About four characters a token, plus each message's framing."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        chars = len(content) if isinstance(content, str) else len(str(content or ""))
        total += -(-chars // CHARS_PER_TOKEN) + _MESSAGE_OVERHEAD_TOKENS
    return total


def _ms(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


class CatalogSource(Protocol):
    """Where the gateway finds a workspace's providers and routes."""

    async def catalog(self, workspace_id: UUID) -> Catalog:
        """The workspace's catalog."""
        ...


@dataclass(frozen=True, slots=True)
class Gateway:
    """What callers of the gateway hold: the router and where catalogs come from."""

    router: Router
    catalogs: CatalogSource


def content_of(chunk: Mapping[str, Any]) -> str | None:
    """The text delta of a chunk's first choice, if any."""
    choices = chunk.get("choices")
    if not choices:
        return None
    delta = choices[0].get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) and content else None
