"""Providers known to this process: name → OpenAI-compatible endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

from bullpen.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Provider:
    """An OpenAI-compatible endpoint; `api_key` never leaves the gateway."""

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)


class ProviderRegistry:
    """The providers agents may name in their config."""

    def __init__(self) -> None:
        self._providers: dict[str, Provider] = {}

    def register(self, provider: Provider) -> None:
        """Add or replace a provider."""
        self._providers[provider.name] = provider

    def get(self, name: str) -> Provider:
        """The provider called `name`; unknown names are a clear error."""
        try:
            return self._providers[name]
        except KeyError:
            raise InvalidInput(f"provider {name!r} is not configured on this server") from None

    def names(self) -> list[str]:
        """Registered provider names."""
        return sorted(self._providers)
