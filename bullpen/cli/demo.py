"""`bullpen seed-demo`: fill the first workspace with a demo team and weeks of history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import uvloop

from bullpen.cli.output import console

__all__ = ["seed_demo"]


def seed_demo(
    tasks: Annotated[int, typer.Option(min=1, help="Tasks (with their runs).")] = 100_000,
    events: Annotated[int, typer.Option(min=0, help="Run events, spread over the runs.")] = (
        1_000_000
    ),
    agents: Annotated[int, typer.Option(min=1, help="Agents in the org chart.")] = 200,
    days: Annotated[int, typer.Option(min=1, help="Days of history, up to now.")] = 30,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Data directory (BULLPEN_DATA_DIR).")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="postgresql://… (BULLPEN_DATABASE_URL).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line.")] = False,
) -> None:
    """Fill the first workspace (`bullpen init` makes it) with a demo org chart of agents,
    providers, routes, routines, budgets and --days of tasks, runs, run events, costs,
    approvals and audit events, written straight into the tables. For trying the dashboard
    at size and for `bullpen bench --scenario ui`; not for a workspace in use."""
    from bullpen.app import open_store
    from bullpen.cli.main import _bootstrap, _settings
    from bullpen.store.demo import DemoSize, seed_demo

    settings = _settings(data_dir, database_url)

    async def run() -> dict[str, object]:
        boot = await _bootstrap(settings)
        async with open_store(settings) as store:
            seeded = await seed_demo(
                store,
                boot.workspace_id,
                size=DemoSize(tasks=tasks, events=events, agents=agents, days=days),
            )
        return seeded.as_dict()

    info = uvloop.run(run())
    if as_json:
        print(json.dumps(info), flush=True)
    else:
        console.print(f"seeded in {info['seconds']} s: {info['counts']}", highlight=False)
