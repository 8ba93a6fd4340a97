"""Agent statuses: whether an agent takes new work."""

from __future__ import annotations

from enum import StrEnum


class AgentStatus(StrEnum):
    """Where an agent is in its life (the values are stored and shown as they are)."""

    ACTIVE = "active"  # its tasks are queued and claimed
    PAUSED = "paused"  # it keeps its tasks; none is claimed until it is active again
    TERMINATED = "terminated"  # retired for good: its open tasks were cancelled
