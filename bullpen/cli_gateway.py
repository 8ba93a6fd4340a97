"""`bullpen providers …` and `bullpen routes …`: the gateway's providers and model routes.

They change the gateway through the HTTP API, so each change is authorized and audited like any
other client's. `bullpen.cli` mounts `providers_cli` and `routes_cli` as sub-commands.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

__all__ = ["providers_cli", "routes_cli"]

console = Console(stderr=True)

providers_cli = typer.Typer(
    help="The gateway's LLM providers, managed through a running server's API.",
    no_args_is_help=True,
)
routes_cli = typer.Typer(
    help="Model routes (a name and its provider fallback chain), through the API.",
    no_args_is_help=True,
)

ServerUrl = Annotated[
    str, typer.Option("--url", envvar="BULLPEN_URL", help="The Bullpen server (BULLPEN_URL).")
]
ServerKey = Annotated[
    str,
    typer.Option(
        "--api-key",
        envvar="BULLPEN_API_KEY",
        show_envvar=False,
        help="Bullpen API key; prefer BULLPEN_API_KEY, which stays out of shell history.",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the API's JSON body.")]
KeyEnv = Annotated[
    str | None,
    typer.Option("--api-key-env", metavar="VAR", help="Take the provider's key from $VAR."),
]
KeyStdin = Annotated[
    bool, typer.Option("--api-key-stdin", help="Read the provider's key from stdin.")
]
Models = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        metavar="NAME[:IN:OUT[:CACHED]]",
        help="A model and its USD prices per million input, output and cached input tokens "
        "(a bare name costs 0). Repeat for more. A name with a colon needs its prices.",
    ),
]
ConnectTimeout = Annotated[
    float | None, typer.Option(metavar="S", help="Seconds to connect (TCP and TLS).")
]
TtftTimeout = Annotated[
    float | None, typer.Option(metavar="S", help="Seconds from the request to the first token.")
]
IdleTimeout = Annotated[
    float | None, typer.Option(metavar="S", help="Seconds between two chunks of a stream.")
]
Deadline = Annotated[float | None, typer.Option(metavar="S", help="Seconds for a whole attempt.")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _fail(detail: str, errors: list[dict[str, Any]] | None = None) -> NoReturn:
    """Print `error: <detail>` (and any field problems) to stderr and exit 1."""
    from rich.text import Text

    console.print(Text.assemble(("error:", "red"), " ", detail), soft_wrap=True)
    for err in errors or []:
        where = err.get("field") or err.get("location") or "request"
        console.print(Text(f"  {where}: {err.get('message')}"), soft_wrap=True)
    raise typer.Exit(1)


def _call(
    url: str, key: str, method: str, path: str, body: Any = None, *, create: bool = False
) -> Any:
    """One API request; a refusal or an unreachable server ends the command with exit 1."""
    import uuid

    from bullpen.apiclient import ApiError, request
    from bullpen.errors import BullpenError

    try:
        # A fresh Idempotency-Key per invocation: a retried POST cannot create twice.
        idem = str(uuid.uuid4()) if create else None
        return request(method, url, path, api_key=key, body=body, idempotency_key=idem)[1]
    except ApiError as err:
        hint = " (check --api-key or BULLPEN_API_KEY)" if err.http_status == 401 else ""
        _fail(err.detail + hint, err.errors)
    except BullpenError as err:
        _fail(err.detail, err.errors)


def _find(url: str, key: str, collection: str, name: str) -> dict[str, Any]:
    """The item of /api/v1/<collection> called `name`."""
    for item in _call(url, key, "GET", f"/api/v1/{collection}")["items"]:
        if item["name"] == name:
            found: dict[str, Any] = item
            return found
    noun = "provider" if collection == "providers" else "route"
    _fail(f"no {noun} named {name!r}")


def _print_json(body: Any) -> None:
    print(json.dumps(body, ensure_ascii=False), flush=True)


def _print_table(table: Any) -> None:
    Console(width=max(Console().width, 120)).print(table)


def _price(value: float) -> str:
    return f"{value:g}"


def _parse_model(spec: str) -> dict[str, Any]:
    """`NAME[:INPUT:OUTPUT[:CACHED]]` as a ModelPrice body; prices are read from the right."""
    import re

    number = re.compile(r"^(\d+(\.\d*)?|\.\d+)$")
    parts = spec.split(":")
    prices: list[float] = []
    while len(parts) > 1 and len(prices) < 3 and number.match(parts[-1]):
        prices.insert(0, float(parts.pop()))
    name = ":".join(parts)
    if len(prices) == 1 or not name:
        raise typer.BadParameter(
            f"{spec!r} is not NAME, NAME:INPUT:OUTPUT or NAME:INPUT:OUTPUT:CACHED",
            param_hint="--model",
        )
    input_price, output_price, *cached = prices or [0.0, 0.0]
    model = {"name": name, "input_per_mtok": input_price, "output_per_mtok": output_price}
    if cached:  # else the server charges cached input at the input price
        model["cached_input_per_mtok"] = cached[0]
    return model


def read_secret(
    env_var: str | None, from_stdin: bool, *, what: str, flags: tuple[str, str]
) -> str | None:
    """A secret (`what`) from $env_var or stdin, never from argv (which `ps` and history show);
    `flags` are the two options' names, for the error."""
    import getpass
    import os
    import sys

    if env_var is not None and from_stdin:
        raise typer.BadParameter(f"give {flags[0]} or {flags[1]}, not both")
    if env_var is not None:
        value = os.environ.get(env_var, "").strip()
        if not value:
            _fail(f"environment variable {env_var} is not set or empty")
        return value
    if not from_stdin:
        return None
    value = getpass.getpass(f"{what}: ") if sys.stdin.isatty() else sys.stdin.read()
    if not value.strip():
        _fail(f"no {what} on stdin")
    return value.strip()


def _provider_key(env_var: str | None, from_stdin: bool) -> str | None:
    return read_secret(
        env_var,
        from_stdin,
        what="provider API key",
        flags=("--api-key-env", "--api-key-stdin"),
    )


def _provider_fields(
    key: str | None,
    models: list[str] | None,
    timeouts: tuple[float | None, ...],
) -> dict[str, Any]:
    """The body fields common to add and update, only those given."""
    names = ("connect_s", "ttft_s", "idle_s", "deadline_s")
    body: dict[str, Any] = {}
    if key is not None:
        body["api_key"] = key
    if models:
        body["models"] = [_parse_model(spec) for spec in models]
    given = {name: value for name, value in zip(names, timeouts, strict=True) if value is not None}
    if given:
        body["timeouts"] = given
    return body


@providers_cli.command("list")
def providers_list(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """List the workspace's providers (keys appear only as hints)."""
    from rich.table import Table
    from rich.text import Text

    body = _call(url, api_key, "GET", "/api/v1/providers")
    if as_json:
        _print_json(body)
        return
    table = Table("name", "base URL", "key", "models (USD/Mtok in/out)", "timeouts (s)")
    for p in body["items"]:
        models = "\n".join(
            f"{m['name']} {_price(m['input_per_mtok'])}/{_price(m['output_per_mtok'])}"
            + (
                f" (cached {_price(m['cached_input_per_mtok'])})"
                if m["cached_input_per_mtok"] != m["input_per_mtok"]
                else ""
            )
            for m in p["models"]
        )
        t = p["timeouts"]
        limits = (
            f"connect {_price(t['connect_s'])}, ttft {_price(t['ttft_s'])}, "
            f"idle {_price(t['idle_s'])}, deadline {_price(t['deadline_s'])}"
        )
        cells = (p["name"], p["base_url"], p["api_key_hint"] or "-", models or "-", limits)
        table.add_row(*(Text(cell) for cell in cells))
    _print_table(table)


@providers_cli.command("add")
def providers_add(
    name: Annotated[str, typer.Argument(help="Unique in the workspace; routes refer to it.")],
    base_url: Annotated[
        str, typer.Option("--base-url", help="OpenAI-style base URL, e.g. ending in /v1.")
    ],
    api_key_env: KeyEnv = None,
    api_key_stdin: KeyStdin = False,
    model: Models = None,
    connect_timeout: ConnectTimeout = None,
    ttft_timeout: TtftTimeout = None,
    idle_timeout: IdleTimeout = None,
    deadline: Deadline = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Add an OpenAI-compatible provider; its key is stored encrypted and never shown."""
    timeouts = (connect_timeout, ttft_timeout, idle_timeout, deadline)
    body = {"name": name, "base_url": base_url, "models": []}
    body |= _provider_fields(_provider_key(api_key_env, api_key_stdin), model, timeouts)
    made = _call(url, api_key, "POST", "/api/v1/providers", body, create=True)
    count = len(made["models"])
    console.print(
        f"added provider {made['name']} ({made['api_key_hint'] or 'no key'}, "
        f"{count} model{'' if count == 1 else 's'})",
        markup=False,
        highlight=False,
    )


@providers_cli.command("update")
def providers_update(
    name: Annotated[str, typer.Argument(help="The provider to change.")],
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="A new base URL. Another scheme, host or port needs the key again "
            "(--api-key-env, --api-key-stdin or --remove-api-key).",
        ),
    ] = None,
    api_key_env: KeyEnv = None,
    api_key_stdin: KeyStdin = False,
    remove_api_key: Annotated[
        bool, typer.Option("--remove-api-key", help="Call the provider without a key.")
    ] = False,
    model: Models = None,
    connect_timeout: ConnectTimeout = None,
    ttft_timeout: TtftTimeout = None,
    idle_timeout: IdleTimeout = None,
    deadline: Deadline = None,
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Change only what is given; --model replaces the whole model list."""
    if remove_api_key and (api_key_env is not None or api_key_stdin):
        raise typer.BadParameter("--remove-api-key cannot be combined with a new key")
    timeouts = (connect_timeout, ttft_timeout, idle_timeout, deadline)
    body = _provider_fields(_provider_key(api_key_env, api_key_stdin), model, timeouts)
    if base_url is not None:
        body["base_url"] = base_url
    if remove_api_key:
        body["api_key"] = None
    if not body:
        raise typer.BadParameter("nothing to change; give at least one option")
    provider = _find(url, api_key, "providers", name)
    _call(url, api_key, "PATCH", f"/api/v1/providers/{provider['id']}", body)
    console.print(f"updated provider {name}", markup=False, highlight=False)


@providers_cli.command("remove")
def providers_remove(
    name: Annotated[str, typer.Argument(help="The provider to delete.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Delete a provider; one that routes still use is refused."""
    provider = _find(url, api_key, "providers", name)
    _call(url, api_key, "DELETE", f"/api/v1/providers/{provider['id']}")
    console.print(f"removed provider {name}", markup=False, highlight=False)


def _chain_text(chain: list[dict[str, str]]) -> str:
    return " → ".join(f"{link['provider']}/{link['model']}" for link in chain)


@routes_cli.command("list")
def routes_list(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """List the workspace's model routes and their fallback chains."""
    from rich.table import Table
    from rich.text import Text

    body = _call(url, api_key, "GET", "/api/v1/model-routes")
    if as_json:
        _print_json(body)
        return
    table = Table("name", "chain (tried in order)", "updated")
    for route in body["items"]:
        cells = (route["name"], _chain_text(route["chain"]), route["updated_at"])
        table.add_row(*(Text(cell) for cell in cells))
    _print_table(table)


@routes_cli.command("set")
def routes_set(
    name: Annotated[str, typer.Argument(help="The route's name, as agents and callers use it.")],
    links: Annotated[
        list[str],
        typer.Argument(metavar="PROVIDER/MODEL...", help="The chain, tried in order."),
    ],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Create the route, or replace its chain if it exists."""
    chain = []
    for link in links:
        provider, slash, model_name = link.partition("/")  # model names may hold `/`
        if not (provider and slash and model_name):
            raise typer.BadParameter(f"{link!r} is not PROVIDER/MODEL", param_hint="chain")
        chain.append({"provider": provider, "model": model_name})
    existing = next(
        (
            r
            for r in _call(url, api_key, "GET", "/api/v1/model-routes")["items"]
            if r["name"] == name
        ),
        None,
    )
    if existing is None:
        route = {"name": name, "chain": chain}
        made = _call(url, api_key, "POST", "/api/v1/model-routes", route, create=True)
        verb = "created"
    else:
        path = f"/api/v1/model-routes/{existing['id']}"
        made = _call(url, api_key, "PATCH", path, {"chain": chain})
        verb = "updated"
    console.print(
        f"{verb} route {name}: {_chain_text(made['chain'])}", markup=False, highlight=False
    )


@routes_cli.command("remove")
def routes_remove(
    name: Annotated[str, typer.Argument(help="The route to delete.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Delete a model route (agents that name it fail until it exists again)."""
    route = _find(url, api_key, "model-routes", name)
    _call(url, api_key, "DELETE", f"/api/v1/model-routes/{route['id']}")
    console.print(f"removed route {name}", markup=False, highlight=False)
