"""The `bullpen` command line: up, worker, migrate, init, sim-provider, bench, providers,
routes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import uvloop
from rich.console import Console

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
    from bullpen.services.bootstrap import ensure_bootstrap
    from bullpen.services.secrets import load_secret

    async with open_store(settings) as store:
        return await ensure_bootstrap(
            store, load_secret(settings.secret_key, settings.data_dir), utcnow
        )


def _banner(settings: Settings, boot: Bootstrap, url: str) -> None:
    key = boot.api_key or "$BULLPEN_API_KEY"
    body = json.dumps(
        {"prompt": "Analyze this dataset and extract key metrics", "agent_id": str(boot.agent_id)}
    )
    auth = shlex.quote(f"Authorization: Bearer {key}")
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

    logs.configure()
    settings = _settings(data_dir, database_url, host=host, port=port)
    boot = uvloop.run(_bootstrap(settings))
    if not quiet:
        _banner(settings, boot, f"http://{settings.host}:{settings.port}")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=5,
        backlog=4096,
        forwarded_allow_ips=settings.forwarded_allow_ips,
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
) -> None:
    """Run the simulated OpenAI-compatible provider on its own."""
    from bullpen.bench.simprovider import SimConfig, serve_forever

    try:
        config = SimConfig(
            ttft_ms=ttft_ms,
            tokens_per_second=tokens_per_second,
            response_tokens=response_tokens,
            models=tuple(model) if model else ("sim-1",),
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
            "queue (the run queue) or relay (the relay's added latency)."
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
        float, typer.Option(help="[create, relay] Measured seconds per round.")
    ] = 15.0,
    warmup: Annotated[
        float, typer.Option(help="[create, relay] Warm-up seconds before each round.")
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
        str, typer.Option(help="[relay] Concurrent streams per level, e.g. 50,200.")
    ] = "50,200",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, no progress bar.")] = False,
) -> None:
    """Load tests: the reference scenario (default), create throughput (--scenario create),
    the run queue (--scenario queue: runs/s per worker count, claim latency, noisy neighbour)
    or the relay (--scenario relay: latency it adds over calling the provider directly)."""
    only: dict[str, tuple[str, ...]] = {
        "reference": ("url", "api_key", "agent_id", "scale", "peak", "hold", "think", "sim"),
        "create": ("baseline_ref", "concurrency", "duration", "warmup", "rounds"),
        "queue": ("runs", "workers", "samples"),
        "relay": ("streams", "duration", "warmup", "rounds"),
    }
    if scenario not in only:
        raise typer.BadParameter("--scenario must be reference, create, queue or relay")
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
        _bench_create(
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
        _bench_relay(
            backend,
            pg_url=pg_url,
            streams=streams,
            duration=duration,
            warmup=warmup,
            rounds=rounds,
            as_json=as_json,
        )
        return
    if scenario == "queue":
        _bench_queue(
            backend, pg_url=pg_url, runs=runs, workers=workers, samples=samples, as_json=as_json
        )
        return

    from bullpen.bench.loadgen import run_load
    from bullpen.bench.report import live_progress, render_table, to_json
    from bullpen.bench.spawn import spawn_server
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
        async with spawn_server(backend, pg_admin_url=pg_url, sim=sim) as server:  # type: ignore[arg-type]
            report = await measure(server.base_url, server.api_key, server.agent_id)
        report["backend"] = backend
        report["simulator"] = sim
        return report

    report = uvloop.run(run())
    if as_json:
        print(json.dumps(report), flush=True)


def _bench_create(
    backend: str,
    *,
    pg_url: str,
    baseline_ref: str | None,
    concurrency: int,
    duration: float,
    warmup: float,
    rounds: int,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario create`: closed-loop creates, optionally against a baseline."""
    import math

    from bullpen.bench.createload import CreateRound, render_create_table, run_create_bench

    if concurrency < 1 or rounds < 1:
        raise typer.BadParameter("--concurrency and --rounds must be >= 1")
    if not (math.isfinite(duration) and duration > 0 and math.isfinite(warmup) and warmup >= 0):
        raise typer.BadParameter("--duration must be > 0 and --warmup >= 0")
    if baseline_ref is not None and (not baseline_ref or baseline_ref.startswith("-")):
        raise typer.BadParameter("--baseline-ref must name a git revision")

    def progress(r: CreateRound) -> None:
        if not as_json:
            console.print(
                f"round {r.index}/{rounds} {r.server}: {r.created_per_s or 0:.0f} creates/s, "
                f"p99 {r.latency_ms.p99 or 0:.1f} ms, errors {r.errors_total}",
                highlight=False,
            )

    comparison = uvloop.run(
        run_create_bench(
            backend,  # type: ignore[arg-type]
            baseline_ref=baseline_ref,
            pg_admin_url=pg_url,
            concurrency=concurrency,
            duration_s=duration,
            warmup_s=warmup,
            rounds=rounds,
            on_round=progress,
        )
    )
    if as_json:
        print(json.dumps(comparison.as_dict()), flush=True)
    else:
        Console(width=max(Console().width, 110)).print(render_create_table(comparison))


def _bench_queue(
    backend: str, *, pg_url: str, runs: int, workers: str, samples: int, as_json: bool
) -> None:
    """`bullpen bench --scenario queue`: the run queue with real worker processes."""
    from bullpen.bench.runqueue import queue_report_json, queue_report_lines, run_queue_bench

    try:
        counts = [int(part) for part in workers.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter("--workers must be a comma-separated list of counts") from None
    if not counts or min(counts) < 1 or runs < 1 or samples < 1:
        raise typer.BadParameter("--workers counts, --runs and --samples must be >= 1")
    if backend == "sqlite" and counts != [1]:
        if workers != "1,2,4":
            raise typer.BadParameter("SQLite has one worker process (one writer): --workers 1")
        counts = [1]

    def step(line: str) -> None:
        if not as_json:
            console.print(line, highlight=False)

    report = uvloop.run(
        run_queue_bench(
            backend,  # type: ignore[arg-type]
            runs_total=runs,
            worker_counts=counts,
            samples=samples,
            pg_admin_url=pg_url,
            on_step=step,
        )
    )
    if as_json:
        print(json.dumps(queue_report_json(report, backend)), flush=True)  # type: ignore[arg-type]
    else:
        for line in queue_report_lines(report, backend):  # type: ignore[arg-type]
            print(line, flush=True)


def _bench_relay(
    backend: str,
    *,
    pg_url: str,
    streams: str,
    duration: float,
    warmup: float,
    rounds: int,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario relay`: the relay's added latency, direct and relayed rounds."""
    import math

    from bullpen.bench.relaybench import run_relay_bench

    try:
        levels = [int(part) for part in streams.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter("--streams must be a comma-separated list of counts") from None
    if not levels or min(levels) < 1 or rounds < 1:
        raise typer.BadParameter("--streams counts and --rounds must be >= 1")
    if not (math.isfinite(duration) and duration > 0 and math.isfinite(warmup) and warmup >= 0):
        raise typer.BadParameter("--duration must be > 0 and --warmup >= 0")

    def step(line: str) -> None:
        if not as_json:
            console.print(line, highlight=False)

    measured = uvloop.run(
        run_relay_bench(
            backend,  # type: ignore[arg-type]
            pg_admin_url=pg_url,
            concurrencies=levels,
            rounds=rounds,
            duration_s=duration,
            warmup_s=warmup,
            on_step=step,
        )
    )
    summaries = [level.summary() for level in measured]
    if as_json:
        print(json.dumps({"backend": backend, "levels": summaries}), flush=True)
        return
    for level in summaries:
        print(
            f"{level['concurrency']} streams: added ttft p50 {level['ttft_p50_added_ms']} ms, "
            f"p99 {level['ttft_p99_added_ms']} ms; added total p50 "
            f"{level['total_p50_added_ms']} ms, p99 {level['total_p99_added_ms']} ms "
            f"(direct ttft p50/p99 {level['ttft_p50_direct_ms']}/{level['ttft_p99_direct_ms']}"
            f" ms; {level['requests_relay']} relayed, {level['errors']} errors; server CPU "
            f"{level['server_cpu_ms_per_relay_request']} ms a relayed stream)",
            flush=True,
        )


# `bullpen providers …` and `bullpen routes …` change the gateway through the HTTP API, so each
# change is authorized and audited like any other client's.

providers_cli = typer.Typer(
    help="The gateway's LLM providers, managed through a running server's API.",
    no_args_is_help=True,
)
routes_cli = typer.Typer(
    help="Model routes (a name and its provider fallback chain), through the API.",
    no_args_is_help=True,
)
cli.add_typer(providers_cli, name="providers")
cli.add_typer(routes_cli, name="routes")

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


def _provider_key(env_var: str | None, from_stdin: bool) -> str | None:
    """The provider key from $env_var or stdin (never from argv, which `ps` and history show)."""
    import getpass
    import os
    import sys

    if env_var is not None and from_stdin:
        raise typer.BadParameter("give --api-key-env or --api-key-stdin, not both")
    if env_var is not None:
        key = os.environ.get(env_var, "").strip()
        if not key:
            _fail(f"environment variable {env_var} is not set or empty")
        return key
    if not from_stdin:
        return None
    key = getpass.getpass("provider API key: ") if sys.stdin.isatty() else sys.stdin.read()
    if not key.strip():
        _fail("no provider API key on stdin")
    return key.strip()


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
    base_url: Annotated[str | None, typer.Option("--base-url", help="A new base URL.")] = None,
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


def main() -> None:
    """Entry point of the `bullpen` script; Bullpen's own errors print without a traceback."""
    from bullpen.errors import BullpenError

    try:
        cli()
    except BullpenError as err:
        console.print(f"[red]error:[/] {err.detail}", highlight=False)
        raise SystemExit(1) from None
