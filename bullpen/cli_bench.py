"""The `bullpen bench` scenarios besides the reference one: create, queue and relay.

`bullpen.cli` parses and checks the options and calls one of these; each imports its benchmark
module only when it runs, so the rest of the CLI starts fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import typer
import uvloop
from rich.console import Console

__all__ = ["bench_create", "bench_queue", "bench_relay"]

console = Console(stderr=True)


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
            on_round=progress,
        )
    )
    if as_json:
        print(json.dumps(comparison.as_dict()), flush=True)
    else:
        Console(width=max(Console().width, 110)).print(render_create_table(comparison))


def bench_queue(
    backend: str, *, pg_url: str, runs: int, workers: str, samples: int, as_json: bool
) -> None:
    """`bullpen bench --scenario queue`: the run queue with real worker processes."""
    from bullpen.bench.runqueue import queue_report_json, queue_report_lines, run_queue_bench

    counts = _counts(workers, "--workers")
    if runs < 1 or samples < 1:
        raise typer.BadParameter("--runs and --samples must be >= 1")
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
