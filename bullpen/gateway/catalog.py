"""What the gateway can call in one workspace: providers, their models and prices, and routes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bullpen.errors import ModelNotFound

# The separator of a direct `provider/model` name (a model name may itself contain more).
_DIRECT = "/"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0

    def cost(self, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> float:
        """The cost of one call; cached input tokens are part of `input_tokens`."""
        uncached = max(0, input_tokens - cached_input_tokens)
        return (
            uncached * self.input
            + cached_input_tokens * self.cached_input
            + output_tokens * self.output
        ) / 1_000_000


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Connect, first-token and between-chunk limits and the whole call's deadline, in seconds."""

    connect_s: float
    ttft_s: float
    idle_s: float
    deadline_s: float


@dataclass(frozen=True, slots=True)
class Provider:
    """An OpenAI-compatible endpoint; `api_key` never leaves the gateway."""

    key: str  # unique per process: the breaker and the connection pool are kept by it
    name: str
    base_url: str
    timeouts: Timeouts
    prices: Mapping[str, Price] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    # Configured by the operator (the simulator), not by a workspace: not subject to the
    # outbound guard that keeps workspace providers off non-public addresses.
    builtin: bool = False

    def price(self, model: str) -> Price:
        """The model's price; a model without one costs nothing."""
        return self.prices.get(model) or Price()


@dataclass(frozen=True, slots=True)
class Target:
    """One link of a fallback chain."""

    provider: Provider
    model: str


@dataclass(frozen=True, slots=True)
class Catalog:
    """One workspace's providers (by name) and routes (name → chain)."""

    providers: Mapping[str, Provider]
    routes: Mapping[str, tuple[Target, ...]]

    def resolve(self, model: str, provider: str | None = None) -> tuple[Target, ...]:
        """The chain for a route name, `provider/model`, or a model only one provider lists.

        With `provider` given, `model` is that provider's model: a chain of one.
        """
        if provider is not None:
            return (self._direct(provider, model),)
        chain = self.routes.get(model)
        if chain is not None:
            return chain
        name, sep, rest = model.partition(_DIRECT)
        if sep and name in self.providers:
            return (self._direct(name, rest),)
        owners = [p for p in self.providers.values() if model in p.prices]
        if len(owners) == 1:
            return (Target(owners[0], model),)
        if len(owners) > 1:
            names = ", ".join(sorted(f"{p.name}/{model}" for p in owners))
            raise ModelNotFound(
                f"model {model!r} is offered by several providers; name one: {names}"
            )
        raise ModelNotFound(
            f"no model route or provider model is called {model!r} in this workspace"
        )

    def _direct(self, provider: str, model: str) -> Target:
        found = self.providers.get(provider)
        if found is None:
            raise ModelNotFound(f"provider {provider!r} is not configured in this workspace")
        if found.prices and model not in found.prices:
            raise ModelNotFound(f"provider {provider!r} has no model {model!r}")
        return Target(found, model)

    def model_ids(self) -> Sequence[str]:
        """Every name `resolve` accepts without a provider: routes, then `provider/model`s."""
        direct = sorted(f"{p.name}{_DIRECT}{m}" for p in self.providers.values() for m in p.prices)
        return [*sorted(self.routes), *direct]
