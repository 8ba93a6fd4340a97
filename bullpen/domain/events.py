"""Run event kinds: the vocabulary of every stream."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from uuid import UUID


class EventKind(StrEnum):
    """What a run event says."""

    STATUS = "status"
    TEXT = "text"
    USAGE = "usage"
    LOG = "log"  # an agent's own output line (a process's stdout/stderr, a webhook's log)
    TOOL_CALL = "tool_call"  # an `llm` agent called a tool: {step, name, arguments}
    TOOL_RESULT = "tool_result"  # what the tool returned: {step, name, result}
    ERROR = "error"
    END = "end"


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One stored, sequenced event of a run."""

    run_id: UUID
    task_id: UUID
    seq: int
    kind: EventKind
    data: dict[str, Any]

    @property
    def is_end(self) -> bool:
        """True for the last event of a run."""
        return self.kind is EventKind.END
