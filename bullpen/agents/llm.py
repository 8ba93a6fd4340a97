"""The `llm` adapter: one streaming chat completion through the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bullpen.domain.events import EventKind
from bullpen.domain.status import RunStatus
from bullpen.errors import BullpenError
from bullpen.gateway.router import Call, Gateway, content_of
from bullpen.store.runs import ClaimedRun, RunOutcome
from bullpen.streams.eventlog import RunWriter

DEFAULT_SYSTEM_PROMPT = "You are a helpful agent working on a task for your team."


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """What an `llm` agent's config holds."""

    model: str  # a model route, `provider/model`, or a model one provider offers
    provider: str | None  # given: `model` is this provider's model, no fallback
    system_prompt: str
    max_tokens: int | None

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
        return cls(model, provider, str(system), max_tokens)


async def run_llm(run: ClaimedRun, writer: RunWriter, gateway: Gateway) -> RunOutcome:
    """Stream one completion into the run's events; never raises for provider failures."""
    call = Call()
    started_wall = datetime.now(UTC)
    error: BullpenError | None = None
    parts: list[str] = []
    try:
        config = LlmConfig.parse(run.agent_config)
        catalog = await gateway.catalogs.catalog(run.workspace_id)
        chain = catalog.resolve(config.model, config.provider)
        request: dict[str, Any] = {
            "messages": [
                {"role": "system", "content": config.system_prompt},
                {"role": "user", "content": run.prompt},
            ]
        }
        if config.max_tokens is not None:
            request["max_tokens"] = config.max_tokens
        async for batch in gateway.router.stream(chain, request, call):
            for chunk in batch:
                text = content_of(chunk)
                if text:
                    parts.append(text)
                    writer.text(text)
    except BullpenError as err:
        error = err
    served = call.served_by
    if served is not None:
        writer.emit(
            EventKind.USAGE,
            {
                "provider": served.provider.name,
                "model": call.model or served.model,
                "input_tokens": call.input_tokens,
                "cached_input_tokens": call.cached_input_tokens,
                "output_tokens": call.output_tokens,
                "cost_usd": call.cost_usd,
                "estimated": call.usage_estimated,
            },
        )
    if error is not None:
        writer.emit(
            EventKind.ERROR,
            {"message": error.detail, "code": error.slug, "partial": call.delivered},
        )
    first_token_at = (
        started_wall + timedelta(seconds=call.ttft_s) if call.ttft_s is not None else None
    )
    return RunOutcome(
        status=RunStatus.DONE if error is None else RunStatus.FAILED,
        result="".join(parts) if error is None else None,
        error=error.detail if error is not None else None,
        first_token_at=first_token_at,
        ttft_ms=call.ttft_s * 1000 if call.ttft_s is not None else None,
        provider=served.provider.name if served is not None else None,
        model=(call.model or served.model) if served is not None else None,
        input_tokens=call.input_tokens if served is not None else None,
        output_tokens=call.output_tokens if served is not None else None,
        # Retrying is safe only before any text reached the stream.
        transient=error is not None and error.transient and not call.delivered,
        error_code=error.slug if error is not None else None,
        cost_usd=call.cost_usd,
        cached_input_tokens=call.cached_input_tokens if served is not None else None,
        llm_calls=call.attempts_public() or None,
    )
