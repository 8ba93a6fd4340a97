"""The typed records the store hands up, and the agent statuses: in step with the tables."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from bullpen.domain.agents import AgentStatus
from bullpen.domain.records import (
    AgentRecord,
    CommentRecord,
    RoutineFireRecord,
    RoutineRecord,
    RunRecord,
    TaskLink,
    TaskRecord,
)
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store.tables import agents, routine_fires, routines, runs, task_comments, tasks

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _names(record: type) -> set[str]:
    return {field.name for field in dataclasses.fields(record)}


@pytest.mark.parametrize(
    ("record", "table", "extra"),
    [
        (TaskRecord, tasks, {"task_key"}),
        (RunRecord, runs, set()),
        (AgentRecord, agents, set()),
        (CommentRecord, task_comments, set()),
        (RoutineRecord, routines, set()),
        (RoutineFireRecord, routine_fires, set()),
    ],
)
def test_each_record_holds_every_column_of_its_table(
    record: type, table: sa.Table, extra: set[str]
) -> None:
    assert _names(record) == {column.name for column in table.c} | extra


def test_a_task_link_reads_task_columns_and_the_assignee() -> None:
    assert _names(TaskLink) <= {column.name for column in tasks.c} | {"task_key", "agent"}


def test_agent_statuses_are_the_stored_strings() -> None:
    assert [status.value for status in AgentStatus] == ["active", "paused", "terminated"]
    (check,) = [c for c in agents.constraints if isinstance(c, sa.CheckConstraint)]
    assert str(check.sqltext) == "status IN ('active', 'paused', 'terminated')"
    assert agents.c.status.server_default is not None
    assert f"{AgentStatus.PAUSED}" == "paused" and AgentStatus.PAUSED == "paused"


def _agent_row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": uuid.uuid4(),
        "workspace_id": uuid.uuid4(),
        "name": "ada",
        "title": "",
        "adapter": "llm",
        "config": {"model": "sim-1"},
        "status": "paused",
        "max_concurrent_runs": 10,
        "created_at": NOW,
        "reports_to": None,
        "description": "",
    }
    return row | changes


def test_a_record_is_built_from_a_row_with_typed_statuses_and_stays_frozen() -> None:
    agent = AgentRecord.of(_agent_row(unrelated="ignored"))
    assert agent.status is AgentStatus.PAUSED
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.status = AgentStatus.ACTIVE  # type: ignore[misc]
    run = RunRecord.of({name: None for name in _names(RunRecord)} | {"status": "queued"})
    assert run.status is RunStatus.QUEUED
    task_row = {name: None for name in _names(TaskRecord)} | {"status": "blocked"}
    assert TaskRecord.of(task_row).status is TaskStatus.BLOCKED


def test_a_row_missing_a_column_is_refused() -> None:
    row = _agent_row()
    del row["description"]
    with pytest.raises(KeyError):
        AgentRecord.of(row)
