"""`bullpen providers …` and `bullpen routes …`: the gateway's providers and model routes.

They change the gateway through the HTTP API, so each change is authorized and audited like any
other client's. `bullpen.cli.main` mounts `providers_cli` and `routes_cli` as sub-commands.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bullpen.cli.client import call
from bullpen.cli.options import DEFAULT_URL, ServerKey, ServerUrl, read_secret
from bullpen.cli.output import AsJson, fail, print_json, print_table, say

__all__ = ["providers_cli", "routes_cli"]

providers_cli = typer.Typer(
    help="The gateway's LLM providers, managed through a running server's API.",
    no_args_is_help=True,
)
routes_cli = typer.Typer(
    help="Model routes (a name and its provider fallback chain), through the API.",
    no_args_is_help=True,
)

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


def _find(url: str, key: str, collection: str, name: str) -> dict[str, Any]:
    """The item of /api/v1/<collection> called `name`."""
    for item in call(url, key, "GET", f"/api/v1/{collection}")["items"]:
        if item["name"] == name:
            found: dict[str, Any] = item
            return found
    noun = "provider" if collection == "providers" else "route"
    fail(f"no {noun} named {name!r}")


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

    body = call(url, api_key, "GET", "/api/v1/providers")
    if as_json:
        print_json(body)
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
    print_table(table)


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
    made = call(url, api_key, "POST", "/api/v1/providers", body, create=True)
    count = len(made["models"])
    say(
        f"added provider {made['name']} ({made['api_key_hint'] or 'no key'}, "
        f"{count} model{'' if count == 1 else 's'})"
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
    call(url, api_key, "PATCH", f"/api/v1/providers/{provider['id']}", body)
    say(f"updated provider {name}")


@providers_cli.command("remove")
def providers_remove(
    name: Annotated[str, typer.Argument(help="The provider to delete.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Delete a provider; one that routes still use is refused."""
    provider = _find(url, api_key, "providers", name)
    call(url, api_key, "DELETE", f"/api/v1/providers/{provider['id']}")
    say(f"removed provider {name}")


def _chain_text(chain: list[dict[str, str]]) -> str:
    return " → ".join(f"{link['provider']}/{link['model']}" for link in chain)


@routes_cli.command("list")
def routes_list(
    url: ServerUrl = DEFAULT_URL, *, api_key: ServerKey, as_json: AsJson = False
) -> None:
    """List the workspace's model routes and their fallback chains."""
    from rich.table import Table
    from rich.text import Text

    body = call(url, api_key, "GET", "/api/v1/model-routes")
    if as_json:
        print_json(body)
        return
    table = Table("name", "chain (tried in order)", "updated")
    for route in body["items"]:
        cells = (route["name"], _chain_text(route["chain"]), route["updated_at"])
        table.add_row(*(Text(cell) for cell in cells))
    print_table(table)


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
            for r in call(url, api_key, "GET", "/api/v1/model-routes")["items"]
            if r["name"] == name
        ),
        None,
    )
    if existing is None:
        route = {"name": name, "chain": chain}
        made = call(url, api_key, "POST", "/api/v1/model-routes", route, create=True)
        verb = "created"
    else:
        path = f"/api/v1/model-routes/{existing['id']}"
        made = call(url, api_key, "PATCH", path, {"chain": chain})
        verb = "updated"
    say(f"{verb} route {name}: {_chain_text(made['chain'])}")


@routes_cli.command("remove")
def routes_remove(
    name: Annotated[str, typer.Argument(help="The route to delete.")],
    url: ServerUrl = DEFAULT_URL,
    *,
    api_key: ServerKey,
) -> None:
    """Delete a model route (agents that name it fail until it exists again)."""
    route = _find(url, api_key, "model-routes", name)
    call(url, api_key, "DELETE", f"/api/v1/model-routes/{route['id']}")
    say(f"removed route {name}")
