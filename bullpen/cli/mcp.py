"""`bullpen mcp …`: the workspace's MCP servers, whose tools `llm` agents may call.

Through the HTTP API, so each change is authorized and audited like any other client's. A
header's value is read from an environment variable (`--header-env NAME=VAR`), never from the
command line. `bullpen.cli.main` mounts `mcp_cli` as a sub-command.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bullpen.cli.client import call
from bullpen.cli.options import DEFAULT_URL, ServerKey, ServerUrl
from bullpen.cli.output import AsJson, fail, print_json, print_table, say

__all__ = ["mcp_cli"]

mcp_cli = typer.Typer(
    help="MCP servers whose tools llm agents may call, through a running server's API.",
    no_args_is_help=True,
)

HeaderEnv = Annotated[
    list[str] | None,
    typer.Option(
        "--header-env",
        metavar="NAME=VAR",
        help="Send header NAME with the value of $VAR (stored encrypted, shown as a hint). "
        "Repeat for more.",
    ),
]
Env = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        metavar="NAME=VALUE",
        help="stdio: an environment variable for the command (not secret; names on "
        "BULLPEN_PROCESS_ENV_ALLOW). Repeat for more.",
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option("--timeout", metavar="S", help="Seconds for each listing or tool call."),
]
Command = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[-- COMMAND ARGS...]",
        help="stdio: the command (an absolute path on BULLPEN_PROCESS_ALLOW) and its arguments.",
    ),
]


def _find(url: str, key: str, name: str) -> dict[str, Any]:
    for item in call(url, key, "GET", "/api/v1/mcp-servers")["items"]:
        if item["name"] == name:
            found: dict[str, Any] = item
            return found
    fail(f"no MCP server named {name!r}")


def _pairs(specs: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs or []:
        name, eq, value = spec.partition("=")
        if not (name and eq and value):
            raise typer.BadParameter(f"{spec!r} is not NAME=VALUE", param_hint=flag)
        out[name] = value
    return out


def _headers(specs: list[str] | None) -> dict[str, str]:
    import os

    headers = {}
    for name, var in _pairs(specs, "--header-env").items():
        value = os.environ.get(var, "").strip()
        if not value:
            fail(f"environment variable {var} is not set or empty")
        headers[name] = value
    return headers


def _where(server: dict[str, Any]) -> str:
    if server["transport"] == "http":
        return str(server["url"])
    return " ".join(server["command"] or [])


@mcp_cli.command("list")
def mcp_list(url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False) -> None:
    """List the workspace's MCP servers (header values appear only as hints)."""
    from rich.table import Table
    from rich.text import Text

    body = call(url, api_key, "GET", "/api/v1/mcp-servers")
    if as_json:
        print_json(body)
        return
    table = Table("name", "transport", "url or command", "headers", "timeout (s)")
    for s in body["items"]:
        hints = ", ".join(f"{k}: {v}" for k, v in s["header_hints"].items()) or "-"
        cells = (s["name"], s["transport"], _where(s), hints, f"{s['timeout_s']:g}")
        table.add_row(*(Text(cell) for cell in cells))
    print_table(table)


@mcp_cli.command("add")
def mcp_add(
    name: Annotated[
        str,
        typer.Argument(
            help="Lower-case letters, digits and -; tools are offered to models as NAME__TOOL."
        ),
    ],
    command: Command = None,
    server_url: Annotated[
        str | None, typer.Option("--endpoint", help="http: the MCP server's URL.")
    ] = None,
    header_env: HeaderEnv = None,
    env: Env = None,
    timeout: Timeout = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Add a server: `--endpoint URL` (streamable HTTP), or `-- COMMAND ARGS...` (stdio)."""
    if (server_url is None) == (not command):
        raise typer.BadParameter("give --endpoint (http) or a command after -- (stdio), not both")
    body: dict[str, Any] = {"name": name}
    if server_url is not None:
        if env:
            raise typer.BadParameter("--env is for stdio servers", param_hint="--env")
        body |= {"transport": "http", "url": server_url, "headers": _headers(header_env)}
    else:
        if header_env:
            raise typer.BadParameter("--header-env is for http servers")
        body |= {"transport": "stdio", "command": command, "env": _pairs(env, "--env")}
    if timeout is not None:
        body["timeout_s"] = timeout
    made = call(url, api_key, "POST", "/api/v1/mcp-servers", body, create=True)
    say(f"added MCP server {made['name']} ({made['transport']}); try it: bullpen mcp test {name}")


@mcp_cli.command("test")
def mcp_test(
    name: Annotated[str, typer.Argument(help="The server to connect to.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
    as_json: AsJson = False,
) -> None:
    """Connect to the server now and list its tools (or say why it cannot)."""
    from rich.table import Table
    from rich.text import Text

    server = _find(url, api_key, name)
    body = call(url, api_key, "POST", f"/api/v1/mcp-servers/{server['id']}/test")
    if as_json:
        print_json(body)
        return
    table = Table("tool", "agents call it", "description")
    for t in body["items"]:
        table.add_row(*(Text(cell) for cell in (t["name"], t["wire_name"], t["description"])))
    print_table(table)


@mcp_cli.command("update")
def mcp_update(
    name: Annotated[str, typer.Argument(help="The server to change.")],
    command: Command = None,
    new_name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    server_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help="http: a new URL. Another scheme, host or port needs the headers again "
            "(--header-env or --remove-headers).",
        ),
    ] = None,
    header_env: HeaderEnv = None,
    remove_headers: Annotated[
        bool, typer.Option("--remove-headers", help="http: send no headers.")
    ] = False,
    env: Env = None,
    timeout: Timeout = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Change only what is given (--header-env replaces every header, --env all of them)."""
    if remove_headers and header_env:
        raise typer.BadParameter("--remove-headers cannot be combined with --header-env")
    body: dict[str, Any] = {}
    if new_name is not None:
        body["name"] = new_name
    if server_url is not None:
        body["url"] = server_url
    if header_env:
        body["headers"] = _headers(header_env)
    if remove_headers:
        body["headers"] = {}
    if command:
        body["command"] = command
    if env:
        body["env"] = _pairs(env, "--env")
    if timeout is not None:
        body["timeout_s"] = timeout
    if not body:
        raise typer.BadParameter("nothing to change; give at least one option")
    server = _find(url, api_key, name)
    call(url, api_key, "PATCH", f"/api/v1/mcp-servers/{server['id']}", body)
    say(f"updated MCP server {name}")


@mcp_cli.command("remove")
def mcp_remove(
    name: Annotated[str, typer.Argument(help="The server to delete.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Delete a server; agents that list it get a tool error for its tools."""
    server = _find(url, api_key, name)
    call(url, api_key, "DELETE", f"/api/v1/mcp-servers/{server['id']}")
    say(f"removed MCP server {name}")
