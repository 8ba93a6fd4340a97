"""The `bullpen` command line: up, worker, migrate, init, sim-provider, bench, providers,
routes.

The bench scenarios besides the reference one are in `bullpen.cli_bench`; the `providers` and
`routes` sub-commands are in `bullpen.cli_gateway`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvloop
from rich.console import Console

from bullpen import gcpolicy
from bullpen.cli_agents import agents_cli
from bullpen.cli_gateway import providers_cli, routes_cli

if TYPE_CHECKING:  # imported where used: they cost the API commands a second or more at start
    from bullpen.services.bootstrap import Bootstrap
    from bullpen.settings import Settings

cli = typer.Typer(
    name="bullpen",
    help="Bullpen: a self-hosted control plane for teams of LLM agents.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)

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
    from bullpen.settings import Settings

    return Settings(**overrides)


async def _bootstrap(settings: Settings) -> Bootstrap:
    from bullpen.app import open_store, utcnow
    from bullpen.security.secrets import load_secret
    from bullpen.services.bootstrap import ensure_bootstrap

    async with open_store(settings) as store:
        return await ensure_bootstrap(
            store, load_secret(settings.secret_key, settings.data_dir), utcnow
        )


def _banner(settings: Settings, boot: Bootstrap, url: str) -> None:
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
    console.print(f"[bold]Bullpen[/] is up at [link={url}]{url}[/link]")
    console.print(
        f"  store:     {'SQLite' if settings.is_sqlite else 'PostgreSQL'}"
        f"{' in ' + str(settings.data_dir) if settings.is_sqlite else ''}"
    )
    console.print("  provider:  [yellow]simulated[/] (built in, no network, clearly labelled)")
    console.print(f"  login:     {boot.email}", highlight=False)
    if boot.created:
        console.print(f"  password:  {boot.password}   [dim](shown once)[/]", highlight=False)
        console.print(f"  API key:   {boot.api_key}   [dim](shown once)[/]", highlight=False)
    else:
        console.print("  password and API key: as printed on first start", highlight=False)
    console.print("\nCreate a task and stream its tokens:", highlight=False)
    print(stream, flush=True)


@cli.command()
def up(
    host: Annotated[str | None, typer.Option(help="Bind address (BULLPEN_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (BULLPEN_PORT).")] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    quiet: Annotated[bool, typer.Option(help="Print no banner.")] = False,
) -> None:
    """Run Bullpen in one process: API, worker and the simulated provider."""
    import uvicorn

    from bullpen import logs
    from bullpen.api.app import create_app
    from bullpen.api.edge import server_config

    logs.configure()
    settings = _settings(data_dir, database_url, host=host, port=port)
    boot = uvloop.run(_bootstrap(settings))
    if not quiet:
        _banner(settings, boot, f"http://{settings.host}:{settings.port}")
    config = server_config(
        create_app(settings),
        settings,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    uvicorn.Server(config).run()


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

    logs.configure()
    settings = _settings(
        data_dir, database_url, worker_enabled=True, worker_concurrency=concurrency
    )

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
                    console.print(
                        f"worker {services.worker.owner} ready "
                        f"({settings.worker_concurrency} at once, lease {settings.lease_s:g} s)",
                        highlight=False,
                    )
                    await stop.wait()
                    console.print("draining", highlight=False)
                    await services.worker.drain(settings.drain_grace_s)
            except Unavailable as err:  # not up yet, or restarting: wait for it, do not exit
                console.print(f"waiting for the database: {err.detail}", highlight=False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        console.print("worker stopped", highlight=False)

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
    from bullpen.bench.simprovider import SimConfig, serve_forever

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
    console.print(f"simulated provider at http://{host}:{port}/v1 (models: {config.models})")
    try:
        uvloop.run(serve_forever(config, host, port))
    except KeyboardInterrupt:
        pass


@cli.command()
def bench(
    ctx: typer.Context,
    scenario: Annotated[
        str,
        typer.Option(
            help="reference (create, stream, think; ramp to 80), create (create throughput), "
            "queue (the run queue), relay (the relay's added latency), streams (live "
            "streams one API process holds) or workflow (three-level agent workflows)."
        ),
    ] = "reference",
    backend: Annotated[
        str, typer.Option(help="Server to start and measure: sqlite or postgres.")
    ] = "sqlite",
    url: Annotated[
        str | None,
        typer.Option(help="[reference] Measure a running server instead of starting one."),
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="[reference] API key for --url.")] = None,
    agent_id: Annotated[str | None, typer.Option(help="[reference] Agent UUID for --url.")] = None,
    pg_url: Annotated[
        str, typer.Option(help="PostgreSQL server where a scratch database is made.")
    ] = "postgresql://postgres@127.0.0.1:5432/test",
    scale: Annotated[float, typer.Option(help="[reference] Multiply every stage duration.")] = 1.0,
    peak: Annotated[int, typer.Option(help="[reference] Virtual users at the peak stage.")] = 80,
    hold: Annotated[
        int, typer.Option(help="[reference] Virtual users at the first hold stage.")
    ] = 50,
    think: Annotated[
        float, typer.Option(help="[reference] Seconds each user waits between tasks.")
    ] = 1.0,
    sim: Annotated[
        str,
        typer.Option(help="[reference] Simulator placement: process (own process) or inprocess."),
    ] = "process",
    baseline_ref: Annotated[
        str | None,
        typer.Option(
            help="[create] Also measure this git revision (e.g. cebf6e6), rounds alternating."
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="[create] Clients creating tasks back to back.")
    ] = 32,
    duration: Annotated[
        float,
        typer.Option(
            help="[create, relay, streams, workflow] Measured seconds per round (streams, "
            "workflow: per level)."
        ),
    ] = 15.0,
    warmup: Annotated[
        float,
        typer.Option(help="[create, relay, workflow] Warm-up seconds before each round."),
    ] = 3.0,
    rounds: Annotated[
        int, typer.Option(help="[create, relay] Rounds per server (relay: per side and level).")
    ] = 3,
    runs: Annotated[
        int, typer.Option(help="[queue] Runs enqueued for each throughput measurement.")
    ] = 5000,
    workers: Annotated[
        str,
        typer.Option(help="[queue] Worker process counts to measure, e.g. 1,2,4 (SQLite: 1)."),
    ] = "1,2,4",
    samples: Annotated[
        int, typer.Option(help="[queue] Runs enqueued one at a time for the latency.")
    ] = 200,
    streams: Annotated[
        str,
        typer.Option(
            help="[relay, streams] Concurrent streams per level (relay default 50,200; "
            "streams default 500,1000,2000)."
        ),
    ] = "50,200",
    bus: Annotated[
        str,
        typer.Option(help="[streams] PostgreSQL's bus between API and worker: postgres or redis."),
    ] = "postgres",
    redis_url: Annotated[
        str, typer.Option(help="[streams] Redis for --bus redis.")
    ] = "redis://127.0.0.1:6379/0",
    workflows: Annotated[
        str, typer.Option(help="[workflow] Workflows kept in flight, per level, e.g. 10,50.")
    ] = "10,50",
    api_processes: Annotated[
        int,
        typer.Option(
            help="[relay] API processes (`bullpen up`) serving the relayed streams, the "
            "clients spread over them (PostgreSQL only beyond 1)."
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, no progress bar.")] = False,
) -> None:
    """Load tests: the reference scenario (default), create throughput (--scenario create),
    the run queue (--scenario queue: runs/s per worker count, claim latency, noisy neighbour),
    the relay (--scenario relay: latency it adds over calling the provider directly), live
    streams (--scenario streams: streams held, delivery latency, memory, database writes) or
    agent workflows (--scenario workflow: workflows/s, how soon a parent wakes)."""
    only: dict[str, tuple[str, ...]] = {
        "reference": ("url", "api_key", "agent_id", "scale", "peak", "hold", "think", "sim"),
        "create": ("baseline_ref", "concurrency", "duration", "warmup", "rounds"),
        "queue": ("runs", "workers", "samples"),
        "relay": ("streams", "duration", "warmup", "rounds", "api_processes"),
        "streams": ("streams", "duration", "bus", "redis_url"),
        "workflow": ("workflows", "duration", "warmup"),
    }
    if scenario not in only:
        raise typer.BadParameter(
            "--scenario must be reference, create, queue, relay, streams or workflow"
        )
    if backend not in ("sqlite", "postgres"):
        raise typer.BadParameter("--backend must be sqlite or postgres")
    for other, names in only.items():
        for name in names:
            source = ctx.get_parameter_source(name)
            # By name: typer vendors its own copy of click's ParameterSource enum.
            given = source is not None and source.name != "DEFAULT"
            if given and name not in only[scenario]:
                option = "--" + name.replace("_", "-")
                raise typer.BadParameter(f"{option} applies to --scenario {other} only")
    if scenario == "create":
        from bullpen.cli_bench import bench_create

        bench_create(
            backend,
            pg_url=pg_url,
            baseline_ref=baseline_ref,
            concurrency=concurrency,
            duration=duration,
            warmup=warmup,
            rounds=rounds,
            as_json=as_json,
        )
        return
    if scenario == "relay":
        from bullpen.cli_bench import bench_relay

        bench_relay(
            backend,
            pg_url=pg_url,
            streams=streams,
            duration=duration,
            warmup=warmup,
            rounds=rounds,
            api_processes=api_processes,
            as_json=as_json,
        )
        return
    if scenario == "streams":
        from bullpen.cli_bench import bench_streams

        levels_source = ctx.get_parameter_source("streams")
        bench_streams(
            backend,
            pg_url=pg_url,
            streams=streams
            if levels_source is not None and levels_source.name != "DEFAULT"
            else None,
            hold=duration,
            bus=bus,
            redis_url=redis_url,
            as_json=as_json,
        )
        return
    if scenario == "workflow":
        from bullpen.cli_bench import bench_workflow

        bench_workflow(
            backend,
            pg_url=pg_url,
            workflows=workflows,
            duration=duration,
            warmup=warmup,
            as_json=as_json,
        )
        return
    if scenario == "queue":
        from bullpen.cli_bench import bench_queue

        bench_queue(
            backend, pg_url=pg_url, runs=runs, workers=workers, samples=samples, as_json=as_json
        )
        return

    import aiohttp

    from bullpen.bench.loadgen import run_load
    from bullpen.bench.report import live_progress, render_table, to_json
    from bullpen.bench.spawn import KEY_UNLIMITED, raise_run_cap, spawn_server
    from bullpen.bench.stages import default_stages, total_duration

    if sim not in ("process", "inprocess"):
        raise typer.BadParameter("--sim must be process or inprocess")
    if url is not None and (api_key is None or agent_id is None):
        raise typer.BadParameter("--url needs --api-key and --agent-id")
    if think < 0 or peak < 1 or hold < 1:
        raise typer.BadParameter("--think must be >= 0; --peak and --hold >= 1")
    try:
        stages = default_stages(scale=scale, peak=peak, hold=hold)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None

    async def measure(base_url: str, key: str, agent: str) -> dict[str, Any]:
        if as_json:
            result = await run_load(base_url, key, agent, stages, think_s=think)
        else:
            with live_progress(total_duration(stages)) as progress:
                result = await run_load(
                    base_url, key, agent, stages, think_s=think, on_tick=progress.update
                )
            Console(width=max(Console().width, 150)).print(render_table(result))
        return to_json(result)

    async def run() -> dict[str, Any]:
        if url is not None:
            assert api_key is not None and agent_id is not None
            report = await measure(url.rstrip("/"), api_key, agent_id)
            report["backend"] = "external"
            return report
        async with spawn_server(
            backend,  # type: ignore[arg-type]
            pg_admin_url=pg_url,
            sim=sim,  # type: ignore[arg-type]
            env=KEY_UNLIMITED,
        ) as server:
            async with aiohttp.ClientSession() as http:  # each user has one task open at most
                await raise_run_cap(http, server, max(peak, hold))
            report = await measure(server.base_url, server.api_key, server.agent_id)
        report["backend"] = backend
        report["simulator"] = sim
        return report

    report = uvloop.run(run())
    if as_json:
        print(json.dumps(report), flush=True)


cli.add_typer(providers_cli, name="providers")
cli.add_typer(routes_cli, name="routes")
cli.add_typer(agents_cli, name="agents")


def main() -> None:
    """Entry point of the `bullpen` script; Bullpen's own errors print without a traceback."""
    from bullpen.errors import BullpenError

    try:
        cli()
    except BullpenError as err:
        console.print(f"[red]error:[/] {err.detail}", highlight=False)
        raise SystemExit(1) from None
