"""The `llm` adapter: one streaming chat completion through the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bullpen.domain.events import EventKind
from bullpen.domain.status import RunStatus
from bullpen.errors import BullpenError
from bullpen.gateway.client import GatewayClient, StreamResult
from bullpen.gateway.providers import ProviderRegistry
from bullpen.store.runs import ClaimedRun, RunOutcome
from bullpen.streams.eventlog import RunWriter

DEFAULT_SYSTEM_PROMPT = "You are a helpful agent working on a task for your team."


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """What an `llm` agent's config holds."""

    provider: str
    model: str
    system_prompt: str
    max_tokens: int | None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> LlmConfig:
        """Read and check an agent's stored config."""
        provider, model = raw.get("provider"), raw.get("model")
        if not isinstance(provider, str) or not isinstance(model, str):
            raise BullpenError("agent config needs string 'provider' and 'model'")
        max_tokens = raw.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise BullpenError("agent config 'max_tokens' must be a positive integer")
        system = raw.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
        return cls(provider, model, str(system), max_tokens)


async def run_llm(
    run: ClaimedRun, writer: RunWriter, gateway: GatewayClient, providers: ProviderRegistry
) -> RunOutcome:
    """Stream one completion into the run's events; never raises for provider failures."""
    result = StreamResult()
    started_wall = datetime.now(UTC)
    provider_name: str | None = None
    model: str | None = None
    transient = False
    try:
        config = LlmConfig.parse(run.agent_config)
        provider_name, model = config.provider, config.model
        provider = providers.get(config.provider)
        messages = [
            {"role": "system", "content": config.system_prompt},
            {"role": "user", "content": run.prompt},
        ]
        async for delta in gateway.stream_chat(
            provider, config.model, messages, result, max_tokens=config.max_tokens
        ):
            writer.text(delta)
        status, error = RunStatus.DONE, None
    except BullpenError as err:
        status, error = RunStatus.FAILED, err.detail
        # Retrying is safe only before any text reached the stream.
        transient = err.transient and not result.text_parts
    if result.input_tokens is not None or result.output_tokens is not None:
        writer.emit(
            EventKind.USAGE,
            {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens},
        )
    if error is not None:
        writer.emit(EventKind.ERROR, {"message": error, "partial": bool(result.text_parts)})
    ttft_ms = result.ttft_s * 1000 if result.ttft_s is not None else None
    first_token_at = (
        started_wall + timedelta(seconds=result.ttft_s) if result.ttft_s is not None else None
    )
    return RunOutcome(
        status=status,
        result="".join(result.text_parts) if status is RunStatus.DONE else None,
        error=error,
        first_token_at=first_token_at,
        ttft_ms=ttft_ms,
        provider=provider_name,
        model=result.model or model,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        transient=transient,
    )
