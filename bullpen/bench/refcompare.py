"""The reference scenario on two servers, one after the other: this checkout against a
baseline revision, or this checkout without tracing against the same code tracing.

`run_reference_bench` starts a server on this checkout's code and one on an extracted
revision (`extract_revision`; same interpreter, same backend kind, each with its own fresh
database and its own simulator process), raises both agents' run caps to the peak, then runs
the reference schedule (`run_load`, always this checkout's load generator) against each in
turn: current, baseline, current, baseline… (`rounds` each), one server under load at a time.
With `traced` the second server runs this checkout too, with OpenTelemetry tracing on and
exporting every span over OTLP/HTTP to a receiver in the bench (`otlp_sink`); the first has
it off.

Per stage and server it keeps the medians over rounds of created/s, create p50/p99 and the
TTFT Bullpen added p50/p99 (the client's time to first token minus the provider's own, which
the server records on the run: `overhead_ms` of the reference report), and over all rounds the
errors (summed), the database pool's peak saturation (PostgreSQL) and the server's peak RSS.
Over whole rounds it keeps the server process's CPU per completed task (median over rounds;
the simulator's and the database's CPU are not in it). The ratios are of those figures:
current / baseline, or traced / current.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from rich.table import Table

from bullpen.bench.createload import ServerInfo, process_cpu_s
from bullpen.bench.loadgen import run_load
from bullpen.bench.otlpsink import OtlpSink, otlp_sink
from bullpen.bench.report import (
    BenchResult,
    Snapshot,
    StageResult,
    load_1m,
    median_of,
    ratio,
    round_or_none,
    rounded,
    to_json,
)
from bullpen.bench.spawn import (
    KEY_UNLIMITED,
    Backend,
    SimPlacement,
    SourceTree,
    SpawnedServer,
    SpawnError,
    extract_revision,
    head_commit,
    raise_run_cap,
    spawn_server,
)
from bullpen.bench.stages import Stage

__all__ = [
    "DEFAULT_ROUNDS",
    "FIGURES",
    "ReferenceComparison",
    "ReferenceRound",
    "render_reference_table",
    "run_reference_bench",
]

JSON_VERSION = 1
#: A round is the whole schedule (~3 min at --scale 1) per server: one each by default.
DEFAULT_ROUNDS = 1
_MB = 1024 * 1024
_DASH = "–"

#: The figures compared per stage: name -> how it is read from a stage's row.
FIGURES: dict[str, Callable[[StageResult], float | None]] = {
    "created_per_s": lambda r: r.created_per_s,
    "completed_per_s": lambda r: r.completed_per_s,
    "create_p50_ms": lambda r: r.create_ms.p50,
    "create_p99_ms": lambda r: r.create_ms.p99,
    "added_ttft_p50_ms": lambda r: r.overhead_ms.p50,
    "added_ttft_p99_ms": lambda r: r.overhead_ms.p99,
    "machine_busy_pct": lambda r: (
        None if r.machine_busy_mean is None else 100 * r.machine_busy_mean
    ),
}


@dataclass(frozen=True)
class ReferenceRound:
    """The whole schedule run once against one server."""

    server: str
    index: int
    result: BenchResult
    server_cpu_s: float | None = None  # the server process's CPU over the round

    @property
    def cpu_ms_per_task(self) -> float | None:
        """Server CPU per task completed in the round."""
        done = self.result.total.completed
        return None if self.server_cpu_s is None or not done else 1000 * self.server_cpu_s / done


@dataclass(frozen=True)
class ReferenceComparison:
    """Every round of a reference comparison, per-stage figures per server and the ratios."""

    backend: str
    sim: str
    think_s: float
    stages: list[Stage]
    rounds: int
    servers: list[ServerInfo]
    results: list[ReferenceRound]
    load_before: float | None = None
    load_after: float | None = None
    exported: OtlpSink | None = None  # what the traced server exported (with `traced`)

    def _rows(self, server: str, stage: int) -> list[StageResult]:
        """`server`'s rows of stage `stage` (len(stages) is the total row), one per round."""
        return [
            r.result.total if stage == len(self.stages) else r.result.rows[stage]
            for r in self.results
            if r.server == server
        ]

    def figures(self, server: str, stage: int) -> dict[str, Any]:
        """Medians over rounds, errors summed, pool saturation and RSS at their peak."""
        rows = self._rows(server, stage)
        out: dict[str, Any] = {k: median_of([get(r) for r in rows]) for k, get in FIGURES.items()}
        out["errors_total"] = sum(r.errors_total for r in rows)
        saturation = [r.pool_saturation_max for r in rows if r.pool_saturation_max is not None]
        out["pool_saturation_max_pct"] = 100 * max(saturation) if saturation else None
        rss = [r.rss_max_bytes for r in rows if r.rss_max_bytes is not None]
        out["rss_max_mb"] = max(rss) / _MB if rss else None
        out["cpu_ms_per_task"] = None
        if stage == len(self.stages):  # measured over whole rounds only
            out["cpu_ms_per_task"] = median_of(
                [r.cpu_ms_per_task for r in self.results if r.server == server]
            )
        return out

    @property
    def compared(self) -> tuple[str, str] | None:
        """The server measured and the one it is measured against: current and baseline, or
        traced and current (None with one server)."""
        names = [s.name for s in self.servers]
        if "baseline" in names:
            return "current", "baseline"
        if "traced" in names:
            return "traced", "current"
        return None

    def ratio(self, stage: int) -> dict[str, float | None] | None:
        """Each figure of stage `stage`, the measured server's over the other's (current /
        baseline, traced / current); None with one server."""
        pair = self.compared
        if pair is None:
            return None
        measured, against = (self.figures(name, stage) for name in pair)
        keys = [*FIGURES, "pool_saturation_max_pct", "rss_max_mb", "cpu_ms_per_task"]
        return {k: ratio(measured[k], against[k]) for k in keys}

    def stage_names(self) -> list[str]:
        """Each stage's name, then `total`."""
        return [s.name for s in self.stages] + ["total"]

    @property
    def errors_total(self) -> int:
        """Every error of every round."""
        return sum(r.result.total.errors_total for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        """The JSON `bullpen bench --baseline-ref REV --json` prints."""
        compared = []
        for i, name in enumerate(self.stage_names()):
            entry: dict[str, Any] = {"stage": name}
            for s in self.servers:
                entry[s.name] = rounded(self.figures(s.name, i))
            ratio = self.ratio(i)
            entry["ratio"] = None if ratio is None else rounded(ratio)
            compared.append(entry)
        return {
            "version": JSON_VERSION,
            "scenario": "reference",
            "backend": self.backend,
            "simulator": self.sim,
            "think_s": self.think_s,
            "rounds": self.rounds,
            "servers": [s.as_dict() for s in self.servers],
            "stages": compared,
            "results": [
                {
                    "round": r.index,
                    "server": r.server,
                    "server_cpu_s": round_or_none(r.server_cpu_s),
                    "report": to_json(r.result),
                }
                for r in self.results
            ],
            "errors_total": self.errors_total,
            "exported": None if self.exported is None else self.exported.as_dict(),
            "machine": {
                "cpus": os.cpu_count(),
                "load_1m_before": round_or_none(self.load_before),
                "load_1m_after": round_or_none(self.load_after),
            },
        }


async def run_reference_bench(
    backend: Backend,
    *,
    baseline_ref: str | None = None,
    traced: bool = False,
    stages: Sequence[Stage],
    think_s: float = 1.0,
    sim: SimPlacement = "process",
    rounds: int = DEFAULT_ROUNDS,
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/test",
    on_tick: Callable[[Snapshot], None] | None = None,
    on_round: Callable[[ReferenceRound], None] | None = None,
) -> ReferenceComparison:
    """Start the two servers (current and baseline, or untraced and traced), run the
    schedule against each in turn."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if not stages:
        raise ValueError("at least one stage is required")
    if (baseline_ref is None) == (not traced):
        raise ValueError("compare with a baseline revision or with tracing, one of the two")
    cap = max(s.target for s in stages)
    async with contextlib.AsyncExitStack() as stack:
        commit: str | None = None
        with contextlib.suppress(SpawnError):  # not a git checkout: measure all the same
            commit = await head_commit()
        sink: OtlpSink | None = None
        if baseline_ref is not None:
            tree = await stack.enter_async_context(extract_revision(baseline_ref))
            infos = [
                ServerInfo("current", "working tree", commit),
                ServerInfo("baseline", tree.ref, tree.commit),
            ]
            sources: list[SourceTree | None] = [None, tree]
            envs = [KEY_UNLIMITED, KEY_UNLIMITED]
        else:
            sink = await stack.enter_async_context(otlp_sink())
            infos = [
                ServerInfo("current", "working tree, tracing off", commit),
                ServerInfo("traced", "working tree, tracing on, exporting", commit),
            ]
            sources = [None, None]
            envs = [{**KEY_UNLIMITED, **_UNTRACED}, {**KEY_UNLIMITED, **_traced_env(sink)}]
        # Both start at once (imports and `init` take seconds); neither is under load yet.
        started = await asyncio.gather(
            *(
                stack.enter_async_context(
                    spawn_server(backend, pg_admin_url=pg_admin_url, sim=sim, env=env, source=src)
                )
                for src, env in zip(sources, envs, strict=True)
            ),
            return_exceptions=True,
        )
        servers: list[tuple[ServerInfo, SpawnedServer]] = []
        for info, item in zip(infos, started, strict=True):
            if isinstance(item, BaseException):
                raise item  # the stack stops whichever server did start
            servers.append((info, item))
        async with aiohttp.ClientSession() as http:  # each user has one task open at most
            for _, server in servers:
                await raise_run_cap(http, server, max(cap, 1))
        results: list[ReferenceRound] = []
        load_before = load_1m()
        for index in range(1, rounds + 1):
            for info, server in servers:  # one server under load at a time
                cpu_from = await process_cpu_s(server.pid)
                result = await run_load(
                    server.base_url,
                    server.api_key,
                    server.agent_id,
                    stages,
                    think_s=think_s,
                    on_tick=on_tick,
                )
                cpu_until = await process_cpu_s(server.pid)
                cpu = None if cpu_from is None or cpu_until is None else cpu_until - cpu_from
                done = ReferenceRound(info.name, index, result, cpu)
                results.append(done)
                if on_round is not None:
                    on_round(done)
        return ReferenceComparison(
            backend=backend,
            sim=sim,
            think_s=think_s,
            stages=list(stages),
            rounds=rounds,
            servers=infos,
            results=results,
            load_before=load_before,
            load_after=load_1m(),
            exported=sink,
        )


#: The untraced side: off whatever OTEL_* variables the bench itself was started with.
_UNTRACED = {"OTEL_SDK_DISABLED": "true"}


def _traced_env(sink: OtlpSink) -> dict[str, str]:
    """The traced side: every span sampled and exported over OTLP/HTTP to `sink`."""
    return {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url + "/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SERVICE_NAME": "bullpen-bench",
    }


def render_reference_table(c: ReferenceComparison) -> Table:
    """Per stage: each server's figures and the ratios (current / baseline, traced /
    current)."""
    versus = "traced vs untraced" if c.exported is not None else "vs baseline"
    measured, against = c.compared or ("", "")
    table = Table(
        title=(
            f"bullpen bench reference {versus} — {c.backend}, simulator {c.sim}, "
            f"{c.rounds} round(s) per server"
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("stage", overflow="fold")
    table.add_column("server", overflow="fold")
    for name in (
        "created/s",
        "done/s",
        "create ms\np50/p99",
        "added TTFT ms\np50/p99",
        "errors",
        "machine\nbusy",
        "DB pool\nmax",
        "RSS max\nMB",
        "server CPU\nms/task",
    ):
        table.add_column(name, justify="right", overflow="fold")
    for i, stage in enumerate(c.stage_names()):
        for s in c.servers:
            f = c.figures(s.name, i)
            table.add_row(
                stage,
                s.name,
                _fmt(f["created_per_s"]),
                _fmt(f["completed_per_s"]),
                _pair(f["create_p50_ms"], f["create_p99_ms"]),
                _pair(f["added_ttft_p50_ms"], f["added_ttft_p99_ms"]),
                str(f["errors_total"]),
                _fmt(f["machine_busy_pct"], 0, "%"),
                _fmt(f["pool_saturation_max_pct"], 0, "%"),
                _fmt(f["rss_max_mb"], 0),
                _fmt(f["cpu_ms_per_task"], 2),
                style="bold" if stage == "total" else None,
            )
        ratio = c.ratio(i)
        if ratio is not None:
            table.add_row(
                "",
                f"{measured} / {against}",
                _fmt(ratio["created_per_s"], 2),
                _fmt(ratio["completed_per_s"], 2),
                _pair(ratio["create_p50_ms"], ratio["create_p99_ms"], 2),
                _pair(ratio["added_ttft_p50_ms"], ratio["added_ttft_p99_ms"], 2),
                "",
                _fmt(ratio["machine_busy_pct"], 2),
                _fmt(ratio["pool_saturation_max_pct"], 2),
                _fmt(ratio["rss_max_mb"], 2),
                _fmt(ratio["cpu_ms_per_task"], 2),
                style="italic",
            )
        table.add_section()
    lines = ["; ".join(f"{s.name} = {s.ref} ({(s.commit or '?')[:12]})" for s in c.servers)]
    lines.append(
        "figures are medians over rounds; errors summed; DB pool (PostgreSQL) and RSS at "
        "their peak over rounds"
    )
    if c.exported is not None:
        e = c.exported
        lines.append(
            f"the traced server exported {e.spans} spans in {e.requests} OTLP requests "
            f"({e.bytes / _MB:.1f} MB); {e.refused} refused"
        )
    if c.load_before is not None and c.load_after is not None:
        lines.append(
            f"load average {c.load_before:.2f} before, {c.load_after:.2f} after "
            f"({os.cpu_count()} CPUs)"
        )
    table.caption = "\n".join(lines)
    return table


def _fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    return _DASH if value is None else f"{value:.{digits}f}{unit}"


def _pair(a: float | None, b: float | None, digits: int = 1) -> str:
    return f"{_fmt(a, digits)} / {_fmt(b, digits)}"
