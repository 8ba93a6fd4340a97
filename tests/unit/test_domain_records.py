"""The typed records the store hands up, and the agent statuses: in step with the tables."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import Role
from bullpen.domain.records import (
    AgentRecord,
    CommentRecord,
    OpenDescendant,
    RoutineFireRecord,
    RoutineRecord,
    RunRecord,
    TaskLink,
    TaskRecord,
)
from bullpen.domain.records.accounts import (
    ApiKeyRecord,
    InvitationRecord,
    MemberRecord,
    MembershipRecord,
    RevokedKey,
    UserLogin,
    UserRecord,
    WorkspaceRecord,
)
from bullpen.domain.records.audit import AuditEventRecord, IdempotencyRecord
from bullpen.domain.records.gateway import ProviderRecord, RouteRecord
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store.tables import (
    agents,
    api_keys,
    audit_events,
    idempotency_keys,
    invitations,
    memberships,
    model_routes,
    providers,
    routine_fires,
    routines,
    runs,
    task_comments,
    tasks,
    users,
    workspaces,
)

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
    assert _names(OpenDescendant) <= {column.name for column in tasks.c}


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
        "breakers": None,
        "paused_reason": None,
        "breaker_since": None,
        "failures_in_a_row": 0,
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


# ---- accounts, gateway, audit and idempotency records ------------------------------------


@pytest.mark.parametrize(
    ("record", "table", "left_out", "extra"),
    [
        (UserRecord, users, {"password_hash"}, set()),  # never leaves the sign-in lookup
        (WorkspaceRecord, workspaces, set(), set()),
        (ApiKeyRecord, api_keys, {"digest"}, set()),  # never selected outside authentication
        (InvitationRecord, invitations, set(), {"workspace_name", "workspace_slug"}),
        (ProviderRecord, providers, set(), set()),
        (RouteRecord, model_routes, set(), set()),
        (AuditEventRecord, audit_events, set(), set()),
        (IdempotencyRecord, idempotency_keys, set(), set()),
    ],
)
def test_each_account_and_gateway_record_matches_its_table(
    record: type, table: sa.Table, left_out: set[str], extra: set[str]
) -> None:
    assert _names(record) == ({column.name for column in table.c} - left_out) | extra


def test_member_and_membership_records_read_their_joined_columns() -> None:
    assert _names(MemberRecord) <= {c.name for c in memberships.c} | {c.name for c in users.c}
    assert _names(MembershipRecord) <= {c.name for c in workspaces.c} | {"role"}
    assert _names(UserLogin) <= {c.name for c in users.c}
    assert _names(RevokedKey) <= {c.name for c in api_keys.c}


def test_roles_are_typed_and_secrets_stay_out_of_reprs() -> None:
    member = MemberRecord.of(
        {"user_id": uuid.uuid4(), "email": "a@b.c", "name": "A", "role": "admin", "created_at": NOW}
    )
    assert member.role is Role.ADMIN
    invitation_row = {name: None for name in _names(InvitationRecord)} | {"role": "viewer"}
    del invitation_row["workspace_name"], invitation_row["workspace_slug"]
    invitation = InvitationRecord.of(invitation_row)  # read without its workspace
    assert invitation.role is Role.VIEWER and invitation.workspace_name is None
    provider_row = {name: None for name in _names(ProviderRecord)}
    provider = ProviderRecord.of(provider_row | {"api_key_ciphertext": b"sealed-secret"})
    assert provider.api_key_ciphertext == b"sealed-secret"
    assert "sealed-secret" not in repr(provider)
    login = UserLogin.of({"id": uuid.uuid4(), "password_hash": "$argon2id$secret"})
    assert "argon2id" not in repr(login)
