"""`bullpen agents …`: the workspace's agents and their org chart.

Every command talks to a running server's agents API, so each change is authorized and audited
there like any other client's. An agent is named by its name or its id; names are resolved
through the agent list. `bullpen.cli.main` mounts `agents_cli` as a sub-command.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bullpen.cli.client import call
from bullpen.cli.options import DEFAULT_URL, ServerKey, ServerUrl, read_secret
from bullpen.cli.output import AsJson, fail, print_json, print_table, say

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["agents_cli"]

agents_cli = typer.Typer(
    help="The workspace's agents and their org chart, through a running server's API.",
    no_args_is_help=True,
)


class Adapter(StrEnum):
    """How an agent runs (the API's `adapter`)."""

    LLM = "llm"
    HTTP = "http"
    PROCESS = "process"


AgentRef = Annotated[str, typer.Argument(metavar="AGENT", help="The agent's name or id.")]
Title = Annotated[str | None, typer.Option("--title", help="A job title for the org chart.")]
Description = Annotated[
    str | None,
    typer.Option("--description", help="What the agent does; an llm agent's instructions."),
]
MaxRuns = Annotated[
    int | None, typer.Option("--max-runs", metavar="N", help="Runs of this agent at once.")
]
ReportsTo = Annotated[
    str | None,
    typer.Option("--reports-to", metavar="AGENT", help="Its manager in the org chart."),
]

RequiresApproval = Annotated[
    bool | None,
    typer.Option(
        "--requires-approval/--no-approval",
        help="Each new task waits for an approval before it is queued (see `bullpen approvals`).",
    ),
]

_STATUS_STYLE = {"active": "green", "paused": "yellow", "terminated": "red"}


def _status(status: str) -> Text:
    from rich.text import Text

    return Text(status, style=_STATUS_STYLE.get(status, ""))


def _agents(url: str, key: str) -> list[dict[str, Any]]:
    """Every agent of the workspace, as `GET /api/v1/agents` lists them."""
    items: list[dict[str, Any]] = call(url, key, "GET", "/api/v1/agents")["items"]
    return items


def _resolve(agents: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """The agent called `ref`, else the one whose id it is; exit 1 if there is none."""
    for agent in agents:
        if agent["name"] == ref:
            return agent
    for agent in agents:
        if agent["id"] == ref.lower():
            return agent
    fail(f"no agent named {ref!r}")


def _find(url: str, key: str, ref: str) -> dict[str, Any]:
    """The agent named or identified by `ref`."""
    return _resolve(_agents(url, key), ref)


def _done(verb: str, agent: dict[str, Any], as_json: bool) -> None:
    """Print the API's agent with --json, else one line saying what happened to it."""
    if as_json:
        print_json(agent)
    else:
        say(f"{verb} agent {agent['name']} ({agent['adapter']}, {agent['status']})")


@agents_cli.command("list")
def agents_list(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """List the workspace's agents by name."""
    from rich.table import Table
    from rich.text import Text

    body = call(url, api_key, "GET", "/api/v1/agents")
    if as_json:
        print_json(body)
        return
    names = {agent["id"]: agent["name"] for agent in body["items"]}
    table = Table("name", "title", "adapter", "status", "reports to", "max runs")
    for agent in body["items"]:
        manager = names.get(agent["reports_to"], "-") if agent["reports_to"] else "-"
        table.add_row(
            Text(agent["name"]),
            Text(agent["title"] or "-"),
            Text(agent["adapter"]),
            _status(agent["status"]),
            Text(manager),
            Text(str(agent["max_concurrent_runs"])),
        )
    print_table(table)


@agents_cli.command("tree")
def agents_tree(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """Draw the org chart: each agent under the agent it reports to."""
    from rich.text import Text
    from rich.tree import Tree

    body = call(url, api_key, "GET", "/api/v1/agents/tree")
    if as_json:
        print_json(body)
        return
    if not body["roots"]:
        say("no agents")
        return

    def grow(branch: Tree, nodes: list[dict[str, Any]]) -> None:
        for node in nodes:
            label = Text.assemble(
                (node["name"], "bold"),
                f" · {node['title']}" if node["title"] else "",
                f" ({node['adapter']}, ",
                _status(node["status"]),
                ")",
            )
            grow(branch.add(label), node["reports"])

    chart = Tree("agents", hide_root=True)
    grow(chart, body["roots"])
    print_table(chart)


@agents_cli.command("show")
def agents_show(
    agent: AgentRef, url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """Show one agent: its settings, its manager, its reports and its config."""
    from rich.table import Table
    from rich.text import Text

    agents = _agents(url, api_key)
    found = _resolve(agents, agent)
    if as_json:
        print_json(found)
        return
    names = {other["id"]: other["name"] for other in agents}
    reports = [other["name"] for other in agents if other["reports_to"] == found["id"]]
    rows = (
        ("name", Text(found["name"])),
        ("id", Text(found["id"])),
        ("title", Text(found["title"] or "-")),
        ("adapter", Text(found["adapter"])),
        ("status", _status(found["status"])),
        ("reports to", Text(names.get(found["reports_to"], "-") if found["reports_to"] else "-")),
        ("reports", Text(", ".join(reports) or "-")),
        ("max runs", Text(str(found["max_concurrent_runs"]))),
        ("paused by", Text(found.get("paused_reason") or "-")),
        ("breakers", Text(_limits(found.get("breaker_limits") or {}))),
        ("created", Text(found["created_at"])),
        ("description", Text(found["description"] or "-")),
        ("config", Text(json.dumps(found["config"], indent=2, ensure_ascii=False))),
    )
    grid = Table.grid(padding=(0, 2))
    for key, value in rows:
        grid.add_row(Text(key, style="bold"), value)
    print_table(grid)


def _limits(limits: dict[str, Any]) -> str:
    """An agent's breaker limits in one line (`none` where there is no limit)."""
    shown = {
        "runs_per_hour": "runs/h",
        "failures_in_a_row": "failures in a row",
        "usd_per_hour": "USD/h",
    }
    return ", ".join(
        f"{label} {'none' if limits.get(key) is None else limits[key]}"
        for key, label in shown.items()
        if key in limits
    )


def _secret(env_var: str | None, from_stdin: bool) -> str | None:
    """A webhook's signing secret from $env_var or stdin (never argv, which `ps` shows)."""
    return read_secret(
        env_var, from_stdin, what="webhook secret", flags=("--secret-env", "--secret-stdin")
    )


def _secret_env(specs: list[str]) -> dict[str, str]:
    """A process agent's `secret_env` from the caller's environment: each `NAME` or `NAME=VAR`
    takes $VAR (default $NAME) as NAME's value (never argv, which `ps` shows)."""
    values: dict[str, str] = {}
    for spec in specs:
        name, _, var = spec.partition("=")
        if not name or name in values:
            raise typer.BadParameter(f"{spec!r}: give NAME or NAME=VAR, each NAME once")
        value = read_secret(var or name, False, what=name, flags=("--secret-env", ""))
        assert value is not None  # read_secret fails on an unset or empty variable
        values[name] = value
    return values


def _config_object(text: str) -> dict[str, Any]:
    """--config-json as a JSON object."""
    return _json_object(text, "--config-json")


def _json_object(text: str, flag: str) -> dict[str, Any]:
    """An option's value as a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise typer.BadParameter(f"not JSON: {err}", param_hint=flag) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=flag)
    return value


def _read_prompt(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        fail(f"{path} is not UTF-8 text")
    except OSError as err:
        fail(f"cannot read {path}: {err.strerror}")


@agents_cli.command("create")
def agents_create(
    name: Annotated[str, typer.Argument(help="Unique in the workspace.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="llm: a model route, provider/model, or with --provider that provider's model.",
        ),
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="llm: call this provider, without fallback.")
    ] = None,
    system_prompt_file: Annotated[
        Path | None,
        typer.Option(
            "--system-prompt-file",
            metavar="PATH",
            exists=True,
            dir_okay=False,
            help="llm: the system prompt, from a UTF-8 file (default: Bullpen's own).",
        ),
    ] = None,
    adapter: Annotated[Adapter, typer.Option("--adapter", help="How the agent runs.")] = (
        Adapter.LLM
    ),
    config_json: Annotated[
        str | None,
        typer.Option(
            "--config-json",
            metavar="JSON",
            help="The adapter's config as a JSON object, e.g. http: url and timeouts; process: "
            "command, cwd, env, timeout_s; llm: further settings such as max_steps.",
        ),
    ] = None,
    secret_env: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-env",
            metavar="VAR",
            help="http: the signing secret from $VAR. process: NAME or NAME=VAR, repeatable: "
            "the secret env variable NAME, from $VAR (default $NAME).",
        ),
    ] = None,
    secret_stdin: Annotated[
        bool, typer.Option("--secret-stdin", help="http: read the signing secret from stdin.")
    ] = False,
    title: Title = None,
    description: Description = None,
    reports_to: ReportsTo = None,
    max_runs: MaxRuns = None,
    requires_approval: RequiresApproval = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    as_json: AsJson = False,
) -> None:
    """Create an agent: an llm agent with --model, an http or process one with --config-json."""
    config = _config_object(config_json) if config_json is not None else {}
    if "secret" in config:
        raise typer.BadParameter(
            "give the secret with --secret-env or --secret-stdin, where `ps` cannot see it",
            param_hint="--config-json",
        )
    if "secret_env" in config:
        raise typer.BadParameter(
            "give secret env values with --secret-env NAME[=VAR], where `ps` cannot see them",
            param_hint="--config-json",
        )
    if adapter is Adapter.LLM:
        if model is None and "model" not in config:
            raise typer.BadParameter("needed for llm agents", param_hint="--model")
        if model is not None:
            config["model"] = model
        if provider is not None:
            config["provider"] = provider
        if system_prompt_file is not None:
            config["system_prompt"] = _read_prompt(system_prompt_file)
    elif model is not None or provider is not None or system_prompt_file is not None:
        raise typer.BadParameter("--model, --provider and --system-prompt-file are for llm agents")
    elif config_json is None:
        raise typer.BadParameter(f"needed for {adapter.value} agents", param_hint="--config-json")
    if adapter is Adapter.PROCESS:
        if secret_stdin:
            raise typer.BadParameter("--secret-stdin is for http agents")
        if secret_env:
            config["secret_env"] = _secret_env(secret_env)
    elif adapter is Adapter.HTTP:
        if secret_env is not None and len(secret_env) > 1:
            raise typer.BadParameter("an http agent has one secret: give --secret-env once")
        secret = _secret(secret_env[0] if secret_env else None, secret_stdin)
        if secret is not None:
            config["secret"] = secret
    elif secret_env or secret_stdin:
        raise typer.BadParameter("--secret-env and --secret-stdin are for http and process agents")
    body: dict[str, Any] = {"name": name, "adapter": adapter.value, "config": config}
    if title is not None:
        body["title"] = title
    if description is not None:
        body["description"] = description
    if max_runs is not None:
        body["max_concurrent_runs"] = max_runs
    if requires_approval is not None:
        body["requires_approval"] = requires_approval
    if reports_to is not None:
        body["reports_to"] = _find(url, api_key, reports_to)["id"]
    made = call(url, api_key, "POST", "/api/v1/agents", body, create=True)
    _done("created", made, as_json)


@agents_cli.command("set")
def agents_set(
    agent: AgentRef,
    title: Title = None,
    description: Description = None,
    reports_to: ReportsTo = None,
    no_manager: Annotated[
        bool, typer.Option("--no-manager", help="Report to nobody (a root of the chart).")
    ] = False,
    max_runs: MaxRuns = None,
    requires_approval: RequiresApproval = None,
    breakers_json: Annotated[
        str | None,
        typer.Option(
            "--breakers-json",
            help='Breaker overrides as a JSON object, e.g. \'{"runs_per_hour": 200, '
            '"usd_per_hour": null}\' (null: no limit; a limit left out: the default; '
            "{}: every default).",
        ),
    ] = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    as_json: AsJson = False,
) -> None:
    """Change only what is given; a manager that would make a cycle is refused."""
    if reports_to is not None and no_manager:
        raise typer.BadParameter("give --reports-to or --no-manager, not both")
    body: dict[str, Any] = {}
    if title is not None:
        body["title"] = title
    if description is not None:
        body["description"] = description
    if max_runs is not None:
        body["max_concurrent_runs"] = max_runs
    if requires_approval is not None:
        body["requires_approval"] = requires_approval
    if no_manager:
        body["reports_to"] = None
    if breakers_json is not None:
        body["breakers"] = _json_object(breakers_json, "--breakers-json")
    if not body and reports_to is None:
        raise typer.BadParameter("nothing to change; give at least one option")
    agents = _agents(url, api_key)
    found = _resolve(agents, agent)
    if reports_to is not None:
        body["reports_to"] = _resolve(agents, reports_to)["id"]
    made = call(url, api_key, "PATCH", f"/api/v1/agents/{found['id']}", body)
    _done("updated", made, as_json)


def _set_status(url: str, key: str, found: dict[str, Any], action: str, as_json: bool) -> None:
    """POST the agent's pause, resume or terminate action and print its new status."""
    made = call(url, key, "POST", f"/api/v1/agents/{found['id']}/{action}")
    if as_json:
        print_json(made)
    else:
        say(f"agent {made['name']} is {made['status']}")


@agents_cli.command("pause")
def agents_pause(
    agent: AgentRef, url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """Pause an agent: it takes no new runs; running ones finish."""
    _set_status(url, api_key, _find(url, api_key, agent), "pause", as_json)


@agents_cli.command("resume")
def agents_resume(
    agent: AgentRef, url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """Resume a paused agent; its queued runs are claimed again."""
    _set_status(url, api_key, _find(url, api_key, agent), "resume", as_json)


@agents_cli.command("terminate")
def agents_terminate(
    agent: AgentRef,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    as_json: AsJson = False,
) -> None:
    """Terminate an agent for good: its open tasks are cancelled and it cannot be resumed."""
    found = _find(url, api_key, agent)
    question = (
        f"Terminate agent {found['name']}? Its open tasks are cancelled and it cannot be resumed."
    )
    if not yes and not typer.confirm(question, err=True):
        say(f"agent {found['name']} was not terminated")
        raise typer.Exit(1)
    _set_status(url, api_key, found, "terminate", as_json)


@agents_cli.command("delete")
def agents_delete(agent: AgentRef, url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey) -> None:
    """Delete an agent with no tasks and no reports (else refused: pause or terminate it, or
    give its reports another manager first)."""
    found = _find(url, api_key, agent)
    call(url, api_key, "DELETE", f"/api/v1/agents/{found['id']}")
    say(f"deleted agent {found['name']}")
