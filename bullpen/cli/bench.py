"""`bullpen bench`: the load tests, one scenario each (reference, create, queue, relay,
streams, workflow, ui).

`bench` parses and checks the options and calls one `bench_<scenario>`; each imports its
benchmark module only when it runs, so the rest of the CLI starts fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Annotated, Any

import typer
import uvloop

from bullpen.cli.output import console, print_table

__all__ = ["bench"]


def bench(
    ctx: typer.Context,
    scenario: Annotated[
        str,
        typer.Option(
            help="reference (create, stream, think; ramp to 80), create (create throughput), "
            "queue (the run queue), relay (the relay's added latency), streams (live "
            "streams one API process holds), workflow (three-level agent workflows) or ui "
            "(the dashboard's pages on a large workspace)."
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
            help="[reference, create] Also measure this git revision (e.g. cebf6e6), rounds "
            "alternating."
        ),
    ] = None,
    floor: Annotated[
        bool,
        typer.Option(
            help="[create] Also measure the floor: a bare endpoint (same framework and driver, "
            "one insert per request) in its own process, rounds alternating."
        ),
    ] = True,
    idempotency_key: Annotated[
        bool,
        typer.Option(
            help="[create] Send a fresh Idempotency-Key with each create (--no-idempotency-key: "
            "none, the path of a client that sends none)."
        ),
    ] = True,
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
        int,
        typer.Option(
            help="[reference with --baseline-ref or --tracing, create, relay] Rounds per server "
            "(relay: per "
            "side and level). Default 3; 1 for the reference scenario (a round is ~3 min at "
            "--scale 1)."
        ),
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
    wake_runs: Annotated[
        int,
        typer.Option(
            help="[queue] Runs of an agent capped at one run at a time, for the freed-slot "
            "wake latency (0: not measured)."
        ),
    ] = 100,
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
    budgets: Annotated[
        bool,
        typer.Option(
            "--budgets",
            help="[relay] Also relay the same calls with a key a budget covers (a priced "
            "provider), side by side: what budgets cost per stream.",
        ),
    ] = False,
    tracing: Annotated[
        bool,
        typer.Option(
            "--tracing",
            help="[reference] Run this code twice, side by side: tracing off, and tracing on "
            "exporting every span over OTLP/HTTP to a receiver in the bench.",
        ),
    ] = False,
    tasks: Annotated[
        int, typer.Option(help="[ui] Tasks the workspace is seeded with (with their runs).")
    ] = 100_000,
    events: Annotated[int, typer.Option(help="[ui] Run events, spread over the runs.")] = (
        1_000_000
    ),
    agents: Annotated[int, typer.Option(help="[ui] Agents in the seeded org chart.")] = 200,
    requests: Annotated[
        int, typer.Option(help="[ui] Requests per page for its server time (one at a time).")
    ] = 200,
    loads: Annotated[
        int,
        typer.Option(help="[ui] Loads per page in Chromium for its first paint (0: none)."),
    ] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, no progress bar.")] = False,
) -> None:
    """Load tests: the reference scenario (default), create throughput (--scenario create),
    the run queue (--scenario queue: runs/s per worker count, claim latency, freed-slot wake,
    noisy neighbour),
    the relay (--scenario relay: latency it adds over calling the provider directly), live
    streams (--scenario streams: streams held, delivery latency, memory, database writes),
    agent workflows (--scenario workflow: workflows/s, how soon a parent wakes) or the
    dashboard on a large workspace (--scenario ui: each page's server time, first paint and
    JavaScript + CSS)."""
    only: dict[str, tuple[str, ...]] = {
        "reference": (
            "url",
            "api_key",
            "agent_id",
            "scale",
            "peak",
            "hold",
            "think",
            "sim",
            "baseline_ref",
            "rounds",
            "tracing",
        ),
        "create": (
            "baseline_ref",
            "floor",
            "idempotency_key",
            "concurrency",
            "duration",
            "warmup",
            "rounds",
        ),
        "queue": ("runs", "workers", "samples", "wake_runs"),
        "relay": ("streams", "duration", "warmup", "rounds", "api_processes", "budgets"),
        "streams": ("streams", "duration", "bus", "redis_url"),
        "workflow": ("workflows", "duration", "warmup"),
        "ui": ("tasks", "events", "agents", "requests", "loads"),
    }
    if scenario not in only:
        raise typer.BadParameter(
            "--scenario must be reference, create, queue, relay, streams, workflow or ui"
        )
    if backend not in ("sqlite", "postgres"):
        raise typer.BadParameter("--backend must be sqlite or postgres")

    def given(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        # By name: typer vendors its own copy of click's ParameterSource enum.
        return source is not None and source.name != "DEFAULT"

    for name in sorted({name for names in only.values() for name in names}):
        if given(name) and name not in only[scenario]:
            option = "--" + name.replace("_", "-")
            owners = [other for other, names in only.items() if name in names]
            listed = " or ".join(", ".join(owners).rsplit(", ", 1))
            raise typer.BadParameter(f"{option} applies to --scenario {listed} only")
    if scenario == "create":
        bench_create(
            backend,
            pg_url=pg_url,
            baseline_ref=baseline_ref,
            floor=floor,
            keyed=idempotency_key,
            concurrency=concurrency,
            duration=duration,
            warmup=warmup,
            rounds=rounds,
            as_json=as_json,
        )
        return
    if scenario == "relay":
        bench_relay(
            backend,
            pg_url=pg_url,
            streams=streams,
            duration=duration,
            warmup=warmup,
            rounds=rounds,
            api_processes=api_processes,
            budgets=budgets,
            as_json=as_json,
        )
        return
    if scenario == "streams":
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
        bench_workflow(
            backend,
            pg_url=pg_url,
            workflows=workflows,
            duration=duration,
            warmup=warmup,
            as_json=as_json,
        )
        return
    if scenario == "ui":
        bench_ui(
            backend,
            pg_url=pg_url,
            tasks=tasks,
            events=events,
            agents=agents,
            requests=requests,
            loads=loads,
            as_json=as_json,
        )
        return
    if scenario == "queue":
        bench_queue(
            backend,
            pg_url=pg_url,
            runs=runs,
            workers=workers,
            samples=samples,
            wake_runs=wake_runs,
            as_json=as_json,
        )
        return
    if tracing and baseline_ref is not None:
        raise typer.BadParameter("--tracing compares this code with itself: no --baseline-ref")
    if baseline_ref is not None or tracing:
        if url is not None:
            which = "--tracing" if tracing else "--baseline-ref"
            raise typer.BadParameter(f"{which} starts both servers: it cannot use --url")
        bench_reference_compare(
            backend,
            pg_url=pg_url,
            baseline_ref=baseline_ref,
            tracing=tracing,
            rounds=rounds if given("rounds") else 1,
            scale=scale,
            peak=peak,
            hold=hold,
            think=think,
            sim=sim,
            as_json=as_json,
        )
        return
    if given("rounds"):
        raise typer.BadParameter(
            "--rounds applies to the reference scenario with --baseline-ref or --tracing"
        )
    bench_reference(
        backend,
        pg_url=pg_url,
        url=url,
        api_key=api_key,
        agent_id=agent_id,
        scale=scale,
        peak=peak,
        hold=hold,
        think=think,
        sim=sim,
        as_json=as_json,
    )


def bench_reference(
    backend: str,
    *,
    pg_url: str,
    url: str | None,
    api_key: str | None,
    agent_id: str | None,
    scale: float,
    peak: int,
    hold: int,
    think: float,
    sim: str,
    as_json: bool,
) -> None:
    """`bullpen bench` (--scenario reference): create, stream and think, ramping to `peak`."""
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
            print_table(render_table(result), 150)
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


def bench_reference_compare(
    backend: str,
    *,
    pg_url: str,
    baseline_ref: str | None,
    tracing: bool,
    rounds: int,
    scale: float,
    peak: int,
    hold: int,
    think: float,
    sim: str,
    as_json: bool,
) -> None:
    """`bullpen bench --baseline-ref REV`: the reference scenario on this code and on REV;
    `--tracing`: on this code without tracing and with it."""
    from bullpen.bench.refcompare import (
        ReferenceRound,
        render_reference_table,
        run_reference_bench,
    )
    from bullpen.bench.report import LiveProgress, Snapshot, live_progress
    from bullpen.bench.stages import default_stages, total_duration

    if sim not in ("process", "inprocess"):
        raise typer.BadParameter("--sim must be process or inprocess")
    if think < 0 or peak < 1 or hold < 1 or rounds < 1:
        raise typer.BadParameter("--think must be >= 0; --peak, --hold and --rounds >= 1")
    if baseline_ref is not None and (not baseline_ref or baseline_ref.startswith("-")):
        raise typer.BadParameter("--baseline-ref must name a git revision")
    try:
        stages = default_stages(scale=scale, peak=peak, hold=hold)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    bar: list[LiveProgress] = []  # the current round's progress bar, if one is showing

    def tick(snap: Snapshot) -> None:
        if not bar:
            bar.append(live_progress(total_duration(stages)).__enter__())
        bar[0].update(snap)
        if snap.finished:
            bar.pop().__exit__(None, None, None)

    def progress(r: ReferenceRound) -> None:
        total = r.result.total
        console.print(
            f"round {r.index}/{rounds} {r.server}: {total.created} created, "
            f"{total.completed} done, {total.errors_total} errors",
            highlight=False,
        )

    comparison = uvloop.run(
        run_reference_bench(
            backend,  # type: ignore[arg-type]
            baseline_ref=baseline_ref,
            traced=tracing,
            stages=stages,
            think_s=think,
            sim=sim,  # type: ignore[arg-type]
            rounds=rounds,
            pg_admin_url=pg_url,
            on_tick=None if as_json else tick,
            on_round=None if as_json else progress,
        )
    )
    if as_json:
        print(json.dumps(comparison.as_dict()), flush=True)
    else:
        print_table(render_reference_table(comparison), 130)


def _counts(value: str, option: str) -> list[int]:
    """A comma-separated list of counts, each at least 1."""
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} must be a comma-separated list of counts") from None
    if not counts or min(counts) < 1:
        raise typer.BadParameter(f"{option} counts must be >= 1")
    return counts


def _check_window(duration: float, warmup: float) -> None:
    if not (math.isfinite(duration) and duration > 0 and math.isfinite(warmup) and warmup >= 0):
        raise typer.BadParameter("--duration must be > 0 and --warmup >= 0")


def _stepper(as_json: bool) -> Callable[[str], None]:
    """Progress lines on stderr, unless the output is JSON."""

    def step(line: str) -> None:
        if not as_json:
            console.print(line, highlight=False)

    return step


def bench_create(
    backend: str,
    *,
    pg_url: str,
    baseline_ref: str | None,
    floor: bool,
    keyed: bool,
    concurrency: int,
    duration: float,
    warmup: float,
    rounds: int,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario create`: closed-loop creates, optionally against a baseline."""
    from bullpen.bench.createload import CreateRound, render_create_table, run_create_bench

    if concurrency < 1 or rounds < 1:
        raise typer.BadParameter("--concurrency and --rounds must be >= 1")
    _check_window(duration, warmup)
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
            floor=floor,
            keyed=keyed,
            on_round=progress,
        )
    )
    if as_json:
        print(json.dumps(comparison.as_dict()), flush=True)
    else:
        print_table(render_create_table(comparison), 110)


def bench_queue(
    backend: str,
    *,
    pg_url: str,
    runs: int,
    workers: str,
    samples: int,
    wake_runs: int,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario queue`: the run queue with real worker processes."""
    from bullpen.bench.runqueue import queue_report_json, queue_report_lines, run_queue_bench

    counts = _counts(workers, "--workers")
    if runs < 1 or samples < 1:
        raise typer.BadParameter("--runs and --samples must be >= 1")
    if wake_runs != 0 and wake_runs < 2:
        raise typer.BadParameter("--wake-runs must be 0 (not measured) or >= 2")
    if backend == "sqlite" and counts != [1]:
        if workers != "1,2,4":
            raise typer.BadParameter("SQLite has one worker process (one writer): --workers 1")
        counts = [1]

    report = uvloop.run(
        run_queue_bench(
            backend,  # type: ignore[arg-type]
            runs_total=runs,
            worker_counts=counts,
            samples=samples,
            pg_admin_url=pg_url,
            wake_runs=wake_runs,
            on_step=_stepper(as_json),
        )
    )
    if as_json:
        print(json.dumps(queue_report_json(report, backend)), flush=True)  # type: ignore[arg-type]
    else:
        for line in queue_report_lines(report, backend):  # type: ignore[arg-type]
            print(line, flush=True)


def bench_relay(
    backend: str,
    *,
    pg_url: str,
    streams: str,
    duration: float,
    warmup: float,
    rounds: int,
    api_processes: int,
    budgets: bool,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario relay`: the relay's added latency, direct and relayed rounds."""
    from bullpen.bench.relaybench import run_relay_bench
    from bullpen.bench.spawn import check_api_processes

    levels = _counts(streams, "--streams")
    if rounds < 1:
        raise typer.BadParameter("--rounds must be >= 1")
    try:
        check_api_processes(backend, api_processes, "--api-processes")
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    _check_window(duration, warmup)

    measured = uvloop.run(
        run_relay_bench(
            backend,  # type: ignore[arg-type]
            pg_admin_url=pg_url,
            concurrencies=levels,
            rounds=rounds,
            duration_s=duration,
            warmup_s=warmup,
            api_processes=api_processes,
            budgets=budgets,
            on_step=_stepper(as_json),
        )
    )
    summaries = [level.summary() for level in measured]
    if as_json:
        print(
            json.dumps({"backend": backend, "api_processes": api_processes, "levels": summaries}),
            flush=True,
        )
        return
    for level in summaries:
        print(
            f"{level['concurrency']} streams: added ttft p50 {level['ttft_p50_added_ms']} ms, "
            f"p99 {level['ttft_p99_added_ms']} ms; added total p50 "
            f"{level['total_p50_added_ms']} ms, p99 {level['total_p99_added_ms']} ms "
            f"(direct ttft p50/p99 {level['ttft_p50_direct_ms']}/{level['ttft_p99_direct_ms']}"
            f" ms; {level['requests_relay']} relayed, {level['errors']} errors; server CPU "
            f"{level['server_cpu_ms_per_relay_request']} ms a relayed stream); a bare TCP hop "
            f"adds ttft p50 {level.get('ttft_p50_hop_added_ms')} ms, p99 "
            f"{level.get('ttft_p99_hop_added_ms')} ms, total p50 "
            f"{level.get('total_p50_hop_added_ms')} ms, p99 {level.get('total_p99_hop_added_ms')}"
            f" ms (hop CPU {level['hop_cpu_ms_per_request']} ms a stream)",
            flush=True,
        )
        if budgets:
            print(
                f"{level['concurrency']} streams under a budget: ttft p50/p99 "
                f"{level['ttft_p50_budgeted_ms']}/{level['ttft_p99_budgeted_ms']} ms against "
                f"{level['ttft_p50_relay_ms']}/{level['ttft_p99_relay_ms']} ms without; server "
                f"CPU {level['server_cpu_ms_per_budgeted_request']} ms a stream, "
                f"{level['budgeted_cpu_ratio']} times the same calls without a budget "
                f"(median of the rounds' ratios; {level['requests_budgeted']} streams)",
                flush=True,
            )


def bench_streams(
    backend: str,
    *,
    pg_url: str,
    streams: str | None,
    hold: float,
    bus: str,
    redis_url: str,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario streams`: live streams held, delivery latency, memory."""
    from bullpen.bench.streamsbench import run_streams_bench

    levels = _counts(streams or "500,1000,2000", "--streams")
    if bus not in ("postgres", "redis"):
        raise typer.BadParameter("--bus must be postgres or redis")
    if backend == "sqlite" and bus != "postgres":
        raise typer.BadParameter("--bus applies to --backend postgres only")
    if hold <= 0:
        raise typer.BadParameter("--duration must be > 0")
    measured = uvloop.run(
        run_streams_bench(
            backend,  # type: ignore[arg-type]
            bus=bus,  # type: ignore[arg-type]
            redis_url=redis_url,
            pg_admin_url=pg_url,
            levels=levels,
            hold_s=hold,
            on_step=_stepper(as_json),
        )
    )
    summaries = [level.summary() for level in measured]
    if as_json:
        print(json.dumps({"backend": backend, "bus": bus, "levels": summaries}), flush=True)
        return
    for s in summaries:
        print(
            f"{s['streams']} streams ({s['live']} live): delivery p50 {s['delivery_p50_ms']} ms, "
            f"p99 {s['delivery_p99_ms']} ms; {s['tokens_per_s']} tokens/s in "
            f"{s['text_events_per_s']} events/s; RSS API+worker {s['bullpen_rss_mb']} MB "
            f"{s['rss_mb']}; CPU cores {s['cpu_cores']}; database {s['db_commits_per_s']} "
            f"commits/s, {s['db_rows_per_s']} rows/s; errors {s['errors']}",
            flush=True,
        )
        d = s["direct"]
        print(
            f"  baseline, the simulator read directly: delivery p50 {d['delivery_p50_ms']} ms, "
            f"p99 {d['delivery_p99_ms']} ms; {d['tokens_per_s']} tokens/s; "
            f"CPU cores {d['cpu_cores']}; errors {d['errors']}",
            flush=True,
        )


def bench_workflow(
    backend: str,
    *,
    pg_url: str,
    workflows: str,
    duration: float,
    warmup: float,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario workflow`: three-level workflows/s and the parents' wake-up."""
    from bullpen.bench.workflowbench import run_workflow_bench

    levels = _counts(workflows, "--workflows")
    _check_window(duration, warmup)
    measured = uvloop.run(
        run_workflow_bench(
            backend,  # type: ignore[arg-type]
            pg_admin_url=pg_url,
            in_flight=levels,
            duration_s=duration,
            warmup_s=warmup,
            on_step=_stepper(as_json),
        )
    )
    summaries = [level.summary() for level in measured]
    if as_json:
        print(json.dumps({"backend": backend, "levels": summaries}), flush=True)
        return
    for s in summaries:
        print(
            f"{s['in_flight']} in flight: {s['workflows_per_s']} workflows/s "
            f"({s['completed']} done, {s['failed']} failed in {s['duration_s']:g} s); "
            f"workflow p50 {s['workflow_p50_s']} s, p99 {s['workflow_p99_s']} s; "
            f"parent wake p50 {s['wake_p50_ms']} ms, p99 {s['wake_p99_ms']} ms, "
            f"max {s['wake_max_ms']} ms ({s['wakes']} wakes)",
            flush=True,
        )


def bench_ui(
    backend: str,
    *,
    pg_url: str,
    tasks: int,
    events: int,
    agents: int,
    requests: int,
    loads: int,
    as_json: bool,
) -> None:
    """`bullpen bench --scenario ui`: every dashboard page on a large seeded workspace."""
    from bullpen.bench.uibench import report_lines, run_ui_bench

    if tasks < 1 or agents < 1 or requests < 1:
        raise typer.BadParameter("--tasks, --agents and --requests must be >= 1")
    if events < 0 or loads < 0:
        raise typer.BadParameter("--events and --loads must be >= 0")
    report = uvloop.run(
        run_ui_bench(
            backend,  # type: ignore[arg-type]
            pg_admin_url=pg_url,
            tasks=tasks,
            events=events,
            agents=agents,
            requests=requests,
            loads=loads,
            on_step=_stepper(as_json),
        )
    )
    if as_json:
        print(json.dumps(report), flush=True)
    else:
        for line in report_lines(report):
            print(line, flush=True)
