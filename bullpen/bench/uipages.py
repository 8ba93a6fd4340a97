"""The dashboard's pages, as the `ui` bench measures them and the screenshots show them.

Adding a page is one line in `PAGES`. A path may name what the demo seed made
(`bullpen seed-demo --json`): `{task_id}` (a task with subtasks, tool calls and a comment),
`{agent_id}` (the org chart's root), `{provider_id}` and `{routine_id}` (one of each), and
the search words `{search_common}` (in about half of the tasks), `{search_rare}` (about one
in a thousand) and `{search_none}` (in none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PAGES", "UiPage"]


@dataclass(frozen=True, slots=True)
class UiPage:
    """One page: a name (its screenshot's file name), its path, whether it is screenshotted,
    and whether its screenshot is also taken at phone width."""

    name: str
    path: str
    shot: bool = True
    phone: bool = False

    def url_path(self, seeded: Mapping[str, Any]) -> str:
        """The path with the seed's ids and words filled in."""
        return self.path.format_map({k: str(v) for k, v in seeded.items()})


PAGES: tuple[UiPage, ...] = (
    UiPage("tasks", "/", phone=True),
    UiPage("tasks-search-common", "/?q={search_common}", shot=False),
    UiPage("tasks-search-rare", "/?q={search_rare}", shot=False),
    UiPage("tasks-search-none", "/?q={search_none}", shot=False),
    UiPage("tasks-failed-top", "/?status=failed&level=top", shot=False),
    UiPage("task", "/tasks/{task_id}"),
    UiPage("agents", "/agents"),
    UiPage("agent", "/agents/{agent_id}"),
    UiPage("approvals", "/approvals"),
    UiPage("providers", "/providers"),
    UiPage("provider", "/providers/{provider_id}", shot=False),
    UiPage("routines", "/routines"),
    UiPage("routine", "/routines/{routine_id}", shot=False),
    UiPage("costs", "/costs"),
    UiPage("audit", "/audit"),
    UiPage("settings-members", "/settings/members"),
    UiPage("settings-invitations", "/settings/invitations", shot=False),
    UiPage("settings-api-keys", "/settings/api-keys"),
    UiPage("account", "/account"),
)
