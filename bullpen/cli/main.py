"""The `bullpen` command line: the root app and its server commands (up, serve, worker,
migrate, init, sim-provider).

`bench` is in `bullpen.cli.bench`, `providers` and `routes` in `bullpen.cli.gateway`, `agents`
in `bullpen.cli.agents`, `approvals` in `bullpen.cli.approvals`, `budgets` and `costs` in
`bullpen.cli.budgets`; what they share is in
`bullpen.cli.output`, `.options` and `.client`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvloop

from bullpen import gcpolicy
from bullpen.cli.agents import agents_cli
from bullpen.cli.approvals import approvals_cli
from bullpen.cli.bench import bench
from bullpen.cli.budgets import budgets_cli, costs
from bullpen.cli.demo import seed_demo
from bullpen.cli.gateway import providers_cli, routes_cli
from bullpen.cli.mcp import mcp_cli
from bullpen.cli.output import console, say, styled

if TYPE_CHECKING:  # imported where used: they cost the API commands a second or more at start
    from bullpen.services.bootstrap import Bootstrap
    from bullpen.settings import Settings

cli = typer.Typer(
    name="bullpen",
    help="Bullpen: a self-hosted control plane for teams of LLM agents.",
    no_args_is_help=True,
    add_completion=False,
)

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="Data directory (BULLPEN_DATA_DIR).")
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option("--database-url", help="postgresql://… (BULLPEN_DATABASE_URL); default SQLite."),
]


def _settings(data_dir: Path | None, database_url: str | None, **extra: Any) -> Settings:
    overrides: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["database_url"] = database_url
    from pydantic import ValidationError

    from bullpen.errors import InvalidInput
    from bullpen.settings import Settings

    try:
        return Settings(**overrides)
    except ValidationError as err:
        # One line a problem, named as it is set; never the value, which may be a secret.
        problems = [
            f"{_variable(str(e['loc'][0])) + ': ' if e['loc'] else ''}"
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        ]
        raise InvalidInput("invalid settings: " + "; ".join(problems)) from None


def _variable(field: str) -> str:
    """The environment variable a settings field is read from (OpenTelemetry's keep their
    standard names)."""
    return field if field.startswith("OTEL_") else "BULLPEN_" + field.upper()


async def _bootstrap(settings: Settings) -> Bootstrap:
    from bullpen.app import open_store, utcnow
    from bullpen.security.secrets import load_secret
    from bullpen.services.bootstrap import ensure_bootstrap

    async with open_store(settings) as store:
        return await ensure_bootstrap(
            store, load_secret(settings.secret_key, settings.data_dir), utcnow
        )


def _banner(settings: Settings, boot: Bootstrap, url: str, processes: int) -> None:
    body = json.dumps(
        {"prompt": "Analyze this dataset and extract key metrics", "agent_id": str(boot.agent_id)}
    )
    # A later start has no key to print: the line names the variable, in double quotes so
    # that the shell it is pasted into expands it.
    auth = (
        shlex.quote(f"Authorization: Bearer {boot.api_key}")
        if boot.api_key
        else '"Authorization: Bearer $BULLPEN_API_KEY"'
    )
    create = (
        f"curl -s -H {auth} -H 'Content-Type: application/json' -d {shlex.quote(body)} "
        f"{url}/api/v1/tasks"
    )
    pick_id = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"id\"])'"
    stream = f'curl -sN -H {auth} "{url}/api/v1/tasks/$({create} | {pick_id})/events"'
    # Plain writes, not rich: a server that never loads rich keeps about 2 MB less memory.
    simulated = styled("simulated", "33")
    once = styled("(shown once)", "2")
    say(f"{styled('Bullpen', '1')} is up at {url}")
    say(
        f"  store:     {'SQLite' if settings.is_sqlite else 'PostgreSQL'}"
        f"{' in ' + str(settings.data_dir) if settings.is_sqlite else ''}"
    )
    if processes > 1:
        say(f"  processes: {processes} on one port")
    if settings.sim_url:
        say(f"  provider:  {simulated} at {settings.sim_url}")
    elif settings.sim_enabled:
        say(f"  provider:  {simulated} (built in, no network, clearly labelled)")
    if not settings.worker_enabled:
        say("  worker:    none here: tasks run in `bullpen worker` processes")
    say(f"  login:     {boot.email}")
    if boot.created:
        say(f"  password:  {boot.password}   {once}")
        say(f"  API key:   {boot.api_key}   {once}")
    else:
        say("  password and API key: as printed on first start")
    say("\nCreate a task and stream its tokens:")
    print(stream, flush=True)


Host = Annotated[str | None, typer.Option(help="Bind address (BULLPEN_HOST).")]
Port = Annotated[int | None, typer.Option(help="Port (BULLPEN_PORT).")]
Quiet = Annotated[bool, typer.Option(help="Print no banner.")]
Processes = Annotated[
    int,
    typer.Option(
        min=1,
        envvar="BULLPEN_PROCESSES",
        help="API processes sharing the one port, no balancer needed; more than 1 needs "
        "PostgreSQL.",
        show_default=True,
    ),
]


def _run_api(settings: Settings, *, processes: int, quiet: bool) -> None:
    """Bootstrap and print the banner once, then serve from one process or `processes`."""
    from bullpen.errors import InvalidInput

    if processes > 1 and settings.is_sqlite:
        raise InvalidInput(
            f"--processes {processes} needs PostgreSQL (--database-url or "
            "BULLPEN_DATABASE_URL): a SQLite data directory has one writer process"
        )

    import logging

    import uvicorn

    from bullpen import logs
    from bullpen.store.migrate import log as migration_log

    logs.configure(settings.log_format)
    boot = uvloop.run(_bootstrap(settings))
    # The bootstrap has migrated and said so in one line; the app's own pass finds nothing to do.
    migration_log.setLevel(logging.WARNING)
    if not quiet:
        _banner(settings, boot, f"http://{settings.host}:{settings.port}", processes)
    options: dict[str, Any] = {"loop": "uvloop", "timeout_graceful_shutdown": 5, "backlog": 4096}
    if processes > 1:
        from bullpen.api.processes import supervise

        code = supervise(settings, processes, **options)
        if code:
            raise typer.Exit(code)
        return
    from bullpen.api.app import create_app
    from bullpen.api.edge import server_config

    config = server_config(
        create_app(settings), settings, host=settings.host, port=settings.port, **options
    )
    uvicorn.Server(config).run()


@cli.command()
def up(
    host: Host = None,
    port: Port = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    quiet: Quiet = False,
    processes: Processes = 1,
) -> None:
    """Run Bullpen in one command: API, worker and the simulated provider.

    With --processes N (PostgreSQL only) N processes serve the port, each running all that
    one `up` process runs; see docs/operations.md, "Several API processes on one port".
    """
    settings = _settings(data_dir, database_url, host=host, port=port)  # refused before imports
    _run_api(settings, processes=processes, quiet=quiet)


@cli.command()
def serve(
    host: Host = None,
    port: Port = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    quiet: Quiet = False,
    processes: Processes = 1,
    simulator: Annotated[
        bool,
        typer.Option(
            envvar="BULLPEN_SIM_ENABLED",
            help="Start the built-in simulated provider in each process (BULLPEN_SIM_URL "
            "names one running elsewhere instead).",
        ),
    ] = False,
) -> None:
    """Run the API only (PostgreSQL), for production beside `bullpen worker` processes.

    No worker runs here, so no run executes and no routine fires in these processes: start
    one or more `bullpen worker` on the same database. With --processes N, N processes serve
    the port. On SIGTERM or SIGINT every process stops accepting, finishes its requests and
    exits; a process that dies is replaced, and if one fails to start the command stops and
    exits 1. See docs/operations.md, "Several API processes on one port".
    """
    settings = _settings(
        data_dir, database_url, host=host, port=port, worker_enabled=False, sim_enabled=simulator
    )
    if settings.is_sqlite:
        from bullpen.errors import InvalidInput

        raise InvalidInput(
            "bullpen serve needs PostgreSQL (--database-url or BULLPEN_DATABASE_URL): a SQLite "
            "data directory has one process, so no `bullpen worker` could run beside it; "
            "use `bullpen up`"
        )
    _run_api(settings, processes=processes, quiet=quiet)


@cli.command()
def worker(
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Runs at once (BULLPEN_WORKER_CONCURRENCY).")
    ] = None,
) -> None:
    """Run a worker process (no API): claim and execute runs until SIGTERM, then drain.

    While the database is unreachable at start it waits for it. On SIGTERM or SIGINT it stops
    claiming, lets in-flight runs finish for BULLPEN_DRAIN_GRACE_S, releases what still runs
    back to the queue and exits 0. Run several per machine, and on PostgreSQL on any number of
    machines.
    """
    import asyncio
    import contextlib
    import signal

    from bullpen import logs
    from bullpen.app import build
    from bullpen.errors import Unavailable

    settings = _settings(
        data_dir, database_url, worker_enabled=True, worker_concurrency=concurrency
    )
    logs.configure(settings.log_format)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            try:
                async with build(settings) as services:
                    assert services.worker is not None
                    gcpolicy.settle()
                    say(
                        f"worker {services.worker.owner} ready "
                        f"({settings.worker_concurrency} at once, lease {settings.lease_s:g} s)"
                    )
                    await stop.wait()
                    say("draining")
                    await services.worker.drain(settings.drain_grace_s)
            except Unavailable as err:  # not up yet, or restarting: wait for it, do not exit
                say(f"waiting for the database: {err.detail}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        say("worker stopped")

    uvloop.run(run())


@cli.command()
def migrate(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """Bring the database schema to the newest version."""
    from bullpen.app import open_store

    async def run() -> None:
        async with open_store(_settings(data_dir, database_url)):
            pass

    uvloop.run(run())
    console.print("database is at the newest schema version")


@cli.command()
def init(
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line.")] = False,
) -> None:
    """Migrate and create the first admin, workspace, API key and demo agent (idempotent)."""
    boot = uvloop.run(_bootstrap(_settings(data_dir, database_url)))
    info = {
        "created": boot.created,
        "email": boot.email,
        "password": boot.password,
        "api_key": boot.api_key,
        "workspace_id": str(boot.workspace_id),
        "agent_id": str(boot.agent_id),
    }
    if as_json:
        print(json.dumps(info), flush=True)
    else:
        for name, value in info.items():
            console.print(f"{name}: {value}", highlight=False)


@cli.command("sim-provider")
def sim_provider(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9100,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    ttft_ms: Annotated[
        float, typer.Option(help="Time to first token, ms.", envvar="BULLPEN_SIM_TTFT_MS")
    ] = 380.0,
    tokens_per_second: Annotated[
        float, typer.Option(help="Streaming rate.", envvar="BULLPEN_SIM_TOKENS_PER_SECOND")
    ] = 50.0,
    response_tokens: Annotated[
        int, typer.Option(help="Tokens per response.", envvar="BULLPEN_SIM_RESPONSE_TOKENS")
    ] = 64,
    model: Annotated[list[str] | None, typer.Option(help="Model names served.")] = None,
    fault: Annotated[
        str | None,
        typer.Option(
            help="A fault spec for every request (e.g. 429, slow:5, stamp).",
            envvar="BULLPEN_SIM_FAULT",
        ),
    ] = None,
) -> None:
    """Run the simulated OpenAI-compatible provider on its own."""
    from bullpen.simulator.provider import SimConfig, serve_forever

    try:
        config = SimConfig(
            ttft_ms=ttft_ms,
            tokens_per_second=tokens_per_second,
            response_tokens=response_tokens,
            models=tuple(model) if model else ("sim-1",),
            fault=fault or None,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    say(f"simulated provider at http://{host}:{port}/v1 (models: {config.models})")
    try:
        uvloop.run(serve_forever(config, host, port))
    except KeyboardInterrupt:
        pass


cli.command()(bench)
cli.add_typer(providers_cli, name="providers")
cli.add_typer(routes_cli, name="routes")
cli.add_typer(mcp_cli, name="mcp")
cli.add_typer(agents_cli, name="agents")
cli.add_typer(approvals_cli, name="approvals")
cli.add_typer(budgets_cli, name="budgets")
cli.command("costs")(costs)
cli.command("seed-demo")(seed_demo)


def main() -> None:
    """Entry point of the `bullpen` script; Bullpen's own errors print without a traceback."""
    from bullpen.errors import BullpenError

    try:
        cli()
    except BullpenError as err:
        console.print(f"[red]error:[/] {err.detail}", highlight=False)
        raise SystemExit(1) from None
