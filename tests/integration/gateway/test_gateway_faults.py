"""The fault matrix: every simulator fault against a route of providers over real sockets.

The router is driven directly (no database): each case puts a fault on the first provider of
a two- or three-provider route and checks the gateway outcome table (docs/gateway.md) —
which provider served, how often each was called, what text reached the caller (never
duplicated, never reported complete when truncated) and which typed error came out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bullpen.errors import (
    ProviderAuth,
    ProviderError,
    ProviderIncomplete,
    ProviderRejected,
    ProviderSpendLimit,
    ProviderTimeout,
    ProviderUnavailable,
)
from bullpen.gateway.breaker import BreakerPolicy, Breakers, BreakerState
from bullpen.gateway.catalog import Price, Provider, Target, Timeouts
from bullpen.gateway.client import GatewayClient
from bullpen.gateway.metrics import GatewayMetrics
from bullpen.gateway.router import Call, Router, content_of
from bullpen.simulator.provider import SimConfig, SimulatedProvider, completion_tokens

TOKENS = 8
SIM = SimConfig(ttft_ms=5, tokens_per_second=2000, response_tokens=TOKENS, models=("m",))
LIMITS = Timeouts(connect_s=1.0, ttft_s=0.4, idle_s=0.4, deadline_s=10.0)
MESSAGES = [{"role": "user", "content": "tell me about the weather"}]
FULL = completion_tokens(MESSAGES, TOKENS)
KEY = "sk-primary-key-0123456789abcdef"


@dataclass
class Rig:
    router: Router
    breakers: Breakers
    registry: CollectorRegistry
    sims: list[SimulatedProvider]
    providers: list[Provider]

    def chain(self, fault: str | None = None, length: int = 2) -> list[Target]:
        first = "m" if fault is None else f"m@{fault}"
        return [Target(self.providers[0], first)] + [
            Target(p, "m") for p in self.providers[1:length]
        ]

    def calls(self) -> list[int]:
        return [sim.total_requests for sim in self.sims]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with GatewayClient() as client:
        sims = [SimulatedProvider(SIM) for _ in range(3)]
        for sim in sims:
            await sim.__aenter__()
        try:
            providers = [
                Provider(
                    key=name,
                    name=name,
                    base_url=sim.base_url,
                    timeouts=LIMITS,
                    prices={"m": Price(input=1.0, output=2.0)},
                    api_key=KEY if name == "primary" else None,
                )
                for name, sim in zip(("primary", "backup", "third"), sims, strict=True)
            ]
            breakers = Breakers(BreakerPolicy(failures=3, window_s=30, cooldown_s=0.5))
            registry = CollectorRegistry()
            router = Router(
                client, breakers, GatewayMetrics(registry, breakers), retry_after_max_s=0.5
            )
            yield Rig(router, breakers, registry, sims, providers)
        finally:
            for sim in sims:
                await sim.__aexit__(None, None, None)


async def run(rig: Rig, chain: list[Target]) -> tuple[Call, list[str], ProviderError | None]:
    """One call; the text pieces the caller received, and the error it ended with."""
    call, pieces = Call(), []
    try:
        async for batch in rig.router.stream(chain, {"messages": MESSAGES}, call):
            for chunk in batch:
                text = content_of(chunk)
                if text:
                    pieces.append(text)
    except ProviderError as err:
        return call, pieces, err
    return call, pieces, None


def outcomes(call: Call) -> list[tuple[str, str, str | None]]:
    return [(a.provider, a.outcome, a.reason) for a in call.attempts]


# fault on the primary → who serves, the attempts, and the calls each simulator received
FALLS_BACK = [
    ("hang", "ttft-timeout"),
    ("500", "http-500"),
    ("502", "http-502"),
    ("503", "http-503"),
    ("529", "http-529"),
    ("429:30", "http-429"),  # Retry-After too long to wait: on to the next at once
    ("error-after:0", "stream-error"),
    ("cut-after:0", "connection-lost"),
]


@pytest.mark.parametrize(("fault", "reason"), FALLS_BACK)
async def test_failures_before_content_fall_back(rig: Rig, fault: str, reason: str) -> None:
    started = time.monotonic()
    call, pieces, error = await run(rig, rig.chain(fault))
    assert error is None
    assert "".join(pieces) == "".join(FULL)
    assert outcomes(call) == [("primary", "failed", reason), ("backup", "ok", None)]
    assert call.served_by is not None and call.served_by.provider.name == "backup"
    assert rig.calls() == [1, 1, 0]
    assert time.monotonic() - started < (1.5 if fault == "hang" else 1.0)
    assert (call.input_tokens, call.output_tokens) == (8, TOKENS)  # the backup's usage chunk


async def test_a_short_retry_after_is_waited_out_once_on_the_same_provider(rig: Rig) -> None:
    started = time.monotonic()
    call, pieces, error = await run(rig, rig.chain("429:0.3"))
    elapsed = time.monotonic() - started
    assert error is None and "".join(pieces) == "".join(FULL)
    assert outcomes(call) == [
        ("primary", "failed", "http-429"),
        ("primary", "failed", "http-429"),
        ("backup", "ok", None),
    ]
    assert rig.calls() == [2, 1, 0]
    assert elapsed >= 0.3  # the wait honoured Retry-After


@pytest.mark.parametrize(
    ("fault", "kind", "reason"),
    [
        ("spend-limit", ProviderSpendLimit, "spend-limit"),
        ("401", ProviderAuth, "http-401"),
        ("echo-error", ProviderAuth, "http-401"),
        ("400", ProviderRejected, "http-400"),
    ],
)
async def test_refusals_fail_fast_without_fallback(
    rig: Rig, fault: str, kind: type[ProviderError], reason: str
) -> None:
    call, pieces, error = await run(rig, rig.chain(fault, length=3))
    assert isinstance(error, kind) and not error.transient
    assert error.reason == reason and pieces == []
    assert KEY not in error.detail  # echo-error quotes the Authorization header back
    assert rig.calls() == [1, 0, 0]
    assert outcomes(call) == [("primary", "failed", reason)]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("error-after:3", "stream-error"),
        ("cut-after:3", "connection-lost"),
        ("hang-after:3", "idle-timeout"),
    ],
)
async def test_after_content_a_failure_ends_the_call_visibly(
    rig: Rig, fault: str, reason: str
) -> None:
    call, pieces, error = await run(rig, rig.chain(fault, length=3))
    assert isinstance(error, ProviderIncomplete) and error.reason == reason
    assert pieces == FULL[:3]  # exactly what was sent: no retry, no stitching
    assert rig.calls() == [1, 0, 0]
    assert outcomes(call) == [("primary", "incomplete", reason)]
    assert call.delivered and call.served_by is not None
    assert call.output_tokens >= 1 and call.usage_estimated  # the partial answer is billed


async def test_a_stream_without_a_finish_reason_is_not_a_success(rig: Rig) -> None:
    _call, pieces, error = await run(rig, rig.chain("no-finish"))
    assert isinstance(error, ProviderIncomplete) and error.reason == "no-finish"
    assert pieces == FULL and rig.calls() == [1, 0, 0]


async def test_a_slow_stream_is_served_whole(rig: Rig) -> None:
    call, pieces, error = await run(rig, rig.chain("slow:100"))
    assert error is None and pieces == FULL
    assert outcomes(call) == [("primary", "ok", None)]


async def test_echoed_keys_are_masked_in_the_text(rig: Rig) -> None:
    _call, pieces, error = await run(rig, rig.chain("echo"))
    text = "".join(pieces)
    assert error is None and '"authorization"' in text.lower()
    assert KEY not in text and "Bearer [redacted]" in text


async def test_when_every_provider_fails_the_error_is_unavailable_with_a_retry_hint(
    rig: Rig,
) -> None:
    chain = [Target(p, "m@503") for p in rig.providers]
    _call, pieces, error = await run(rig, chain)
    assert isinstance(error, ProviderUnavailable) and error.transient
    assert error.retry_after is not None and pieces == []
    assert "primary: http-503; backup: http-503; third: http-503" in error.detail
    assert rig.calls() == [1, 1, 1]


async def test_a_single_provider_timeout_stays_a_timeout(rig: Rig) -> None:
    _call, _pieces, error = await run(rig, rig.chain("hang", length=1))
    assert isinstance(error, ProviderTimeout) and error.status == 504


async def test_the_breaker_skips_a_failing_provider_then_probes_it(rig: Rig) -> None:
    for _ in range(3):
        await run(rig, rig.chain("503"))
    assert rig.breakers.get("primary", "primary").state is BreakerState.OPEN
    call, _pieces, error = await run(rig, rig.chain("503"))
    assert error is None
    assert outcomes(call) == [("primary", "skipped", "breaker-open"), ("backup", "ok", None)]
    assert rig.calls() == [3, 4, 0]  # the skipped provider was not called
    await asyncio.sleep(0.5)  # the cooldown
    call, _pieces, error = await run(rig, rig.chain())  # healthy again: the probe succeeds
    assert outcomes(call) == [("primary", "ok", None)]
    assert rig.breakers.get("primary", "primary").state is BreakerState.CLOSED
    metrics = generate_latest(rig.registry).decode()
    assert 'bullpen_gateway_requests_total{outcome="http-503",provider="primary"} 3.0' in metrics
    assert 'bullpen_gateway_fallbacks_total{provider="primary",reason="breaker-open"} 1.0' in (
        metrics
    )
    assert 'bullpen_gateway_breaker_state{provider="primary"} 0.0' in metrics
    assert 'bullpen_gateway_ttft_seconds_count{provider="backup"} 4.0' in metrics


async def test_cancelling_the_caller_closes_the_upstream_request(rig: Rig) -> None:
    sim = rig.sims[0]
    received: list[str] = []

    async def consume() -> None:
        async for batch in rig.router.stream(rig.chain("slow:5"), {"messages": MESSAGES}, Call()):
            received.extend(text for chunk in batch if (text := content_of(chunk)))

    task = asyncio.create_task(consume())
    while not received:
        await asyncio.sleep(0.01)
    assert open_connections(sim) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if open_connections(sim) == 0:
            break
        await asyncio.sleep(0.01)
    assert open_connections(sim) == 0
    assert rig.breakers.get("primary", "primary").state is BreakerState.CLOSED


def open_connections(sim: SimulatedProvider) -> int:
    runner = sim._runner
    assert runner is not None and runner.server is not None
    return len(runner.server.connections)


async def test_a_probe_whose_caller_goes_away_does_not_keep_the_breaker_shut(rig: Rig) -> None:
    for _ in range(3):
        await run(rig, rig.chain("503"))
    await asyncio.sleep(0.5)  # cooled down: the next call is the probe
    probe = rig.router.stream(rig.chain("slow:5"), {"messages": MESSAGES}, Call())
    await anext(probe)  # the probe is streaming
    await probe.aclose()  # and its caller leaves (a relay client hanging up)
    call, _pieces, error = await run(rig, rig.chain())
    assert error is None and outcomes(call) == [("primary", "ok", None)]


def scripted_call(arguments: dict[str, str]) -> list[dict[str, str]]:
    """A conversation whose simulated model answers with one tool call of these arguments
    (the simulator streams them in two pieces, split at the middle)."""
    script = orjson.dumps([{"tool_calls": [{"name": "note", "arguments": arguments}]}]).decode()
    return [{"role": "system", "content": f"<sim-script>{script}</sim-script>"}, *MESSAGES]


# Issue 19, finding 11c: tool call arguments were masked chunk by chunk, so a key split
# across two chunks passed whole.
async def test_a_key_split_across_tool_call_chunks_is_masked(rig: Rig) -> None:
    arguments = {"note": KEY}
    whole = orjson.dumps(arguments).decode()
    middle = len(whole) // 2
    assert whole.index(KEY) < middle < whole.index(KEY) + len(KEY)  # the split is in the key
    call, pieces = Call(), []
    request = {"messages": scripted_call(arguments)}
    async for batch in rig.router.stream(rig.chain(), request, call):
        for chunk in batch:
            for choice in chunk["choices"]:  # none in the usage chunk
                for tool_call in choice["delta"].get("tool_calls") or ():
                    pieces.append(tool_call["function"].get("arguments") or "")
    assert KEY not in "".join(pieces) and KEY[:8] not in "".join(pieces)
    assert orjson.loads("".join(pieces)) == {"note": "[redacted]"}
    assert call.finish_reason == "tool_calls" and outcomes(call) == [("primary", "ok", None)]
