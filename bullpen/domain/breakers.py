"""Breakers: limits that pause a runaway agent (runs started per hour, failures in a row,
spend per hour).

The instance's defaults (`BULLPEN_BREAKER_*`) apply to every agent; an agent's overrides
(`agents.breakers`) replace some of them: a key left out keeps the default, a key set to None
means no limit for that agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The limits an agent may override, by their stored (and wire) names.
KEYS = ("runs_per_hour", "failures_in_a_row", "usd_per_hour")
WINDOW_S = 3600.0  # the window of both hourly limits


@dataclass(frozen=True, slots=True)
class BreakerLimits:
    """An agent's limits; None is no limit."""

    runs_per_hour: int | None = 1000
    failures_in_a_row: int | None = 10
    usd_per_hour: float | None = 20.0

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> BreakerLimits:
        """These defaults with an agent's overrides applied."""
        if not overrides:
            return self
        return BreakerLimits(
            runs_per_hour=overrides.get("runs_per_hour", self.runs_per_hour),
            failures_in_a_row=overrides.get("failures_in_a_row", self.failures_in_a_row),
            usd_per_hour=overrides.get("usd_per_hour", self.usd_per_hour),
        )

    def as_dict(self) -> dict[str, Any]:
        """The limits by name."""
        return {
            "runs_per_hour": self.runs_per_hour,
            "failures_in_a_row": self.failures_in_a_row,
            "usd_per_hour": self.usd_per_hour,
        }
