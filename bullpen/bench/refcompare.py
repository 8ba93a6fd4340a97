"""The reference scenario against a baseline revision: both servers, one after the other.

`run_reference_bench` starts a server on this checkout's code and one on an extracted
revision (`extract_revision`; same interpreter, same backend kind, each with its own fresh
database and its own simulator process), raises both agents' run caps to the peak, then runs
the reference schedule (`run_load`, always this checkout's load generator) against each in
turn: current, baseline, current, baseline… (`rounds` each), one server under load at a time.

Per stage and server it keeps the medians over rounds of created/s, create p50/p99 and the
TTFT Bullpen added p50/p99 (the client's time to first token minus the provider's own, which
the server records on the run: `overhead_ms` of the reference report), and over all rounds the
errors (summed), the database pool's peak saturation (PostgreSQL) and the server's peak RSS.
The ratios current / baseline are of those figures.
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

from bullpen.bench.createload import ServerInfo
from bullpen.bench.loadgen import run_load
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
}


@dataclass(frozen=True)
class ReferenceRound:
    """The whole schedule run once against one server."""

    server: str
    index: int
    result: BenchResult


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
        return out

    def ratio(self, stage: int) -> dict[str, float | None] | None:
        """Current / baseline of each figure of stage `stage` (None without a baseline)."""
        if not any(s.name == "baseline" for s in self.servers):
            return None
        current, baseline = self.figures("current", stage), self.figures("baseline", stage)
        keys = [*FIGURES, "pool_saturation_max_pct", "rss_max_mb"]
        return {k: ratio(current[k], baseline[k]) for k in keys}

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
                {"round": r.index, "server": r.server, "report": to_json(r.result)}
                for r in self.results
            ],
            "errors_total": self.errors_total,
            "machine": {
                "cpus": os.cpu_count(),
                "load_1m_before": round_or_none(self.load_before),
                "load_1m_after": round_or_none(self.load_after),
            },
        }


async def run_reference_bench(
    backend: Backend,
    *,
    baseline_ref: str,
    stages: Sequence[Stage],
    think_s: float = 1.0,
    sim: SimPlacement = "process",
    rounds: int = DEFAULT_ROUNDS,
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/test",
    on_tick: Callable[[Snapshot], None] | None = None,
    on_round: Callable[[ReferenceRound], None] | None = None,
) -> ReferenceComparison:
    """Start the current and the baseline server, run the schedule against each in turn."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if not stages:
        raise ValueError("at least one stage is required")
    cap = max(s.target for s in stages)
    async with contextlib.AsyncExitStack() as stack:
        tree = await stack.enter_async_context(extract_revision(baseline_ref))
        commit: str | None = None
        with contextlib.suppress(SpawnError):  # not a git checkout: measure all the same
            commit = await head_commit()
        infos = [
            ServerInfo("current", "working tree", commit),
            ServerInfo("baseline", tree.ref, tree.commit),
        ]
        sources: list[SourceTree | None] = [None, tree]
        # Both start at once (imports and `init` take seconds); neither is under load yet.
        started = await asyncio.gather(
            *(
                stack.enter_async_context(
                    spawn_server(
                        backend, pg_admin_url=pg_admin_url, sim=sim, env=KEY_UNLIMITED, source=src
                    )
                )
                for src in sources
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
                result = await run_load(
                    server.base_url,
                    server.api_key,
                    server.agent_id,
                    stages,
                    think_s=think_s,
                    on_tick=on_tick,
                )
                done = ReferenceRound(info.name, index, result)
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
        )


def render_reference_table(c: ReferenceComparison) -> Table:
    """Per stage: each server's figures and the ratios current / baseline."""
    table = Table(
        title=(
            f"bullpen bench reference vs baseline — {c.backend}, simulator {c.sim}, "
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
        "DB pool\nmax",
        "RSS max\nMB",
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
                _fmt(f["pool_saturation_max_pct"], 0, "%"),
                _fmt(f["rss_max_mb"], 0),
                style="bold" if stage == "total" else None,
            )
        ratio = c.ratio(i)
        if ratio is not None:
            table.add_row(
                "",
                "current / baseline",
                _fmt(ratio["created_per_s"], 2),
                _fmt(ratio["completed_per_s"], 2),
                _pair(ratio["create_p50_ms"], ratio["create_p99_ms"], 2),
                _pair(ratio["added_ttft_p50_ms"], ratio["added_ttft_p99_ms"], 2),
                "",
                _fmt(ratio["pool_saturation_max_pct"], 2),
                _fmt(ratio["rss_max_mb"], 2),
                style="italic",
            )
        table.add_section()
    lines = ["; ".join(f"{s.name} = {s.ref} ({(s.commit or '?')[:12]})" for s in c.servers)]
    lines.append(
        "figures are medians over rounds; errors summed; DB pool (PostgreSQL) and RSS at "
        "their peak over rounds"
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
