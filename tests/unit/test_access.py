"""Roles, scopes and effective permissions."""

from __future__ import annotations

import itertools

import pytest

from bullpen.domain.access import (
    AGENT_PERMISSIONS,
    ROLE_PERMISSIONS,
    Permission,
    effective,
    parse_scopes,
)
from bullpen.domain.principal import Role


def test_each_role_includes_the_one_below() -> None:
    order = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]
    for lower, higher in itertools.pairwise(order):
        assert ROLE_PERMISSIONS[lower] < ROLE_PERMISSIONS[higher]
    assert Permission.TASKS_WRITE not in ROLE_PERMISSIONS[Role.VIEWER]
    owner_only = ROLE_PERMISSIONS[Role.OWNER] - ROLE_PERMISSIONS[Role.ADMIN]
    assert owner_only == {Permission.WORKSPACE_DELETE}
    assert Permission.KEYS_ADMIN not in AGENT_PERMISSIONS


def test_scopes_narrow_but_never_widen() -> None:
    member = ROLE_PERMISSIONS[Role.MEMBER]
    assert effective(member, parse_scopes(["*"])) == member
    narrowed = effective(member, parse_scopes(["tasks:read", "audit:read"]))
    assert narrowed == {Permission.TASKS_READ}


@pytest.mark.parametrize("scopes", [["tasks:delete"], ["*", "tasks:read"], ["TASKS:READ"]])
def test_unknown_or_mixed_scopes_are_refused(scopes: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_scopes(scopes)
