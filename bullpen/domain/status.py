"""Task and run statuses and the one state machine every module asks."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Where a task is in its life."""

    BACKLOG = "backlog"
    QUEUED = "queued"
    RUNNING = "running"
    BLOCKED = "blocked"
    AWAITING_APPROVAL = "awaiting_approval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    """Where one attempt of an agent on a task is."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_TASK = frozenset({TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})
TERMINAL_RUN = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED})

_TASK_MOVES: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.BACKLOG: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED}),
    TaskStatus.QUEUED: frozenset(
        {TaskStatus.RUNNING, TaskStatus.CANCELLED, TaskStatus.FAILED, TaskStatus.BLOCKED}
    ),
    TaskStatus.RUNNING: frozenset(
        {
            TaskStatus.DONE,
            TaskStatus.FAILED,
            TaskStatus.CANCELLED,
            TaskStatus.QUEUED,
            TaskStatus.BLOCKED,
            TaskStatus.AWAITING_APPROVAL,  # a tool call waits for a decision
        }
    ),
    TaskStatus.BLOCKED: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    TaskStatus.AWAITING_APPROVAL: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED}),
    TaskStatus.DONE: frozenset(),
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED}),
    TaskStatus.CANCELLED: frozenset({TaskStatus.QUEUED}),
}

_RUN_MOVES: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.QUEUED}
    ),
    RunStatus.DONE: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def task_can_move(src: TaskStatus, dst: TaskStatus) -> bool:
    """Whether a task may go from `src` to `dst`."""
    return dst in _TASK_MOVES[src]


def run_can_move(src: RunStatus, dst: RunStatus) -> bool:
    """Whether a run may go from `src` to `dst`."""
    return dst in _RUN_MOVES[src]


def task_sources(dst: TaskStatus) -> frozenset[TaskStatus]:
    """Every status a task may reach `dst` from (for guarded UPDATEs)."""
    return frozenset(src for src, dsts in _TASK_MOVES.items() if dst in dsts)


def run_sources(dst: RunStatus) -> frozenset[RunStatus]:
    """Every status a run may reach `dst` from (for guarded UPDATEs)."""
    return frozenset(src for src, dsts in _RUN_MOVES.items() if dst in dsts)
