"""A provider check: one minimal streamed chat completion, read to its end and timed.

It goes through the gateway's own client, so it meets the provider exactly as calls do: the
provider's timeouts, its key, and (for workspace providers) the outbound guard on every new
connection. It does not go through the router: no fallback, no retry, and the provider's
circuit breaker is neither consulted nor changed (a check is a question, not traffic).
Failures are the client's typed `ProviderError`s, whose text never holds the key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bullpen.errors import ProviderTimeout
from bullpen.gateway.catalog import Provider
from bullpen.gateway.client import Exchange, GatewayClient

CHECK_PROMPT = "Reply with the word OK."
CHECK_MAX_TOKENS = 8  # a check asks for at most this many output tokens


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What a successful check measured."""

    provider: str
    model: str  # the model asked for
    served_model: str | None  # the model the provider said answered
    ttft_ms: float
    latency_ms: float  # the whole call, from sending to the stream's end
    finish_reason: str | None
    input_tokens: int | None
    output_tokens: int | None


async def check(client: GatewayClient, provider: Provider, model: str) -> CheckResult:
    """Call `model` of `provider` once with a tiny prompt, streamed, and read it to its end."""
    body = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": CHECK_MAX_TOKENS,
        "messages": [{"role": "user", "content": CHECK_PROMPT}],
    }
    exchange = Exchange()
    loop = asyncio.get_running_loop()
    started = loop.time()
    limit = provider.timeouts.deadline_s
    try:
        async with asyncio.timeout(limit):
            stream = client.stream(provider, body, exchange)
            try:
                async for _batch in stream:
                    pass
            finally:  # closed now, not when collected: its connection is released at once
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
    except TimeoutError:
        raise ProviderTimeout(
            f"provider {provider.name!r} did not finish within its {limit:g} s deadline",
            reason="deadline",
        ) from None
    return CheckResult(
        provider=provider.name,
        model=model,
        served_model=exchange.model,
        ttft_ms=round((exchange.ttft_s or 0.0) * 1000, 2),
        latency_ms=round((loop.time() - started) * 1000, 2),
        finish_reason=exchange.finish_reason,
        input_tokens=exchange.input_tokens,
        output_tokens=exchange.output_tokens,
    )
