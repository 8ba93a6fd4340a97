"""Bench results: raw per-stage samples, their summary, the table, the JSON and live progress.

Percentiles use the nearest-rank method: the p-th percentile of n sorted values is the value at
1-based rank ceil(p/100 * n). It never invents a latency that was not observed and is exact for
small samples (one sample is its own p99; the p95 of 10 samples is the largest).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from bullpen.bench.stages import Stage

__all__ = [
    "BenchResult",
    "Distribution",
    "LiveProgress",
    "Snapshot",
    "StageResult",
    "StageSamples",
    "live_progress",
    "percentile",
    "render_table",
    "summarize",
    "to_json",
]

JSON_VERSION = 1
_MB = 1024 * 1024
_DASH = "–"


@dataclass(frozen=True)
class Snapshot:
    """Progress of a running bench, handed to `on_tick` about ten times a second."""

    elapsed_s: float
    total_s: float
    stage_index: int
    stage_name: str
    target_vus: int
    active_vus: int
    created: int
    completed: int
    errors: int
    finished: bool = False


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Return the nearest-rank p-th percentile of already sorted values (None when empty)."""
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    if not sorted_values:
        return None
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


@dataclass(frozen=True)
class Distribution:
    """Summary of a latency sample in milliseconds; every figure is None when it is empty."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of_seconds(cls, samples: Sequence[float]) -> Distribution:
        """Summarize durations given in seconds as milliseconds."""
        ms = sorted(s * 1000.0 for s in samples)
        if not ms:
            return cls(0, None, None, None, None, None)
        return cls(
            count=len(ms),
            mean=math.fsum(ms) / len(ms),
            p50=percentile(ms, 50),
            p95=percentile(ms, 95),
            p99=percentile(ms, 99),
            max=ms[-1],
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "count": self.count,
            "mean": round_or_none(self.mean),
            "p50": round_or_none(self.p50),
            "p95": round_or_none(self.p95),
            "p99": round_or_none(self.p99),
            "max": round_or_none(self.max),
        }


@dataclass
class StageSamples:
    """Raw observations for one stage, appended to while the bench runs."""

    created: int = 0
    completed: int = 0
    create_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    provider_ttft_s: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    completion_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    rss_bytes: list[float] = field(default_factory=list)
    pool_in_use: list[float] = field(default_factory=list)
    pool_size: list[float] = field(default_factory=list)
    pool_saturation: list[float] = field(default_factory=list)
    machine_busy: list[float] = field(default_factory=list)  # both cores, each second
    vus_max: int = 0

    def merge(self, other: StageSamples) -> None:
        """Add another stage's observations to these (for the total row)."""
        self.created += other.created
        self.completed += other.completed
        self.create_s += other.create_s
        self.ttft_s += other.ttft_s
        self.provider_ttft_s += other.provider_ttft_s
        self.overhead_s += other.overhead_s
        self.completion_s += other.completion_s
        self.errors.update(other.errors)
        self.rss_bytes += other.rss_bytes
        self.pool_in_use += other.pool_in_use
        self.pool_size += other.pool_size
        self.pool_saturation += other.pool_saturation
        self.machine_busy += other.machine_busy
        self.vus_max = max(self.vus_max, other.vus_max)


@dataclass(frozen=True)
class StageResult:
    """One row of the report: a stage (or the whole run) summarized."""

    name: str
    vus_from: int
    vus_target: int
    vus_max: int
    duration_s: float
    created: int
    completed: int
    create_ms: Distribution
    ttft_ms: Distribution
    provider_ttft_ms: Distribution
    overhead_ms: Distribution
    completion_ms: Distribution
    rss_max_bytes: float | None
    rss_mean_bytes: float | None
    pool_in_use_max: float | None
    pool_in_use_mean: float | None
    pool_size_max: float | None
    pool_saturation_max: float | None
    pool_saturation_mean: float | None
    errors: dict[str, int]
    machine_busy_mean: float | None = None  # of all the machine's cores, 0 to 1

    @property
    def created_per_s(self) -> float | None:
        """Tasks created per second of the stage."""
        return self.created / self.duration_s if self.duration_s > 0 else None

    @property
    def completed_per_s(self) -> float | None:
        """Runs completed `done` per second of the stage (by the stage they started in)."""
        return self.completed / self.duration_s if self.duration_s > 0 else None

    @property
    def errors_total(self) -> int:
        """All errors of the stage, whatever their kind."""
        return sum(self.errors.values())

    @classmethod
    def from_samples(
        cls, name: str, vus_from: int, vus_target: int, duration_s: float, s: StageSamples
    ) -> StageResult:
        """Summarize raw samples."""
        return cls(
            name=name,
            vus_from=vus_from,
            vus_target=vus_target,
            vus_max=s.vus_max,
            duration_s=duration_s,
            created=s.created,
            completed=s.completed,
            create_ms=Distribution.of_seconds(s.create_s),
            ttft_ms=Distribution.of_seconds(s.ttft_s),
            provider_ttft_ms=Distribution.of_seconds(s.provider_ttft_s),
            overhead_ms=Distribution.of_seconds(s.overhead_s),
            completion_ms=Distribution.of_seconds(s.completion_s),
            rss_max_bytes=max(s.rss_bytes, default=None),
            rss_mean_bytes=_mean(s.rss_bytes),
            pool_in_use_max=max(s.pool_in_use, default=None),
            pool_in_use_mean=_mean(s.pool_in_use),
            pool_size_max=max(s.pool_size, default=None),
            pool_saturation_max=max(s.pool_saturation, default=None),
            pool_saturation_mean=_mean(s.pool_saturation),
            errors=dict(sorted(s.errors.items())),
            machine_busy_mean=_mean(s.machine_busy),
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form (milliseconds, megabytes, percentages)."""
        return {
            "name": self.name,
            "vus_from": self.vus_from,
            "vus_target": self.vus_target,
            "vus_max": self.vus_max,
            "duration_s": round_or_none(self.duration_s),
            "created": self.created,
            "completed": self.completed,
            "created_per_s": round_or_none(self.created_per_s),
            "completed_per_s": round_or_none(self.completed_per_s),
            "create_ms": self.create_ms.as_dict(),
            "ttft_ms": self.ttft_ms.as_dict(),
            "provider_ttft_ms": self.provider_ttft_ms.as_dict(),
            "ttft_overhead_ms": self.overhead_ms.as_dict(),
            "completion_ms": self.completion_ms.as_dict(),
            "rss_max_mb": round_or_none(_scale(self.rss_max_bytes, 1 / _MB)),
            "rss_mean_mb": round_or_none(_scale(self.rss_mean_bytes, 1 / _MB)),
            "pool_in_use_max": self.pool_in_use_max,
            "pool_in_use_mean": round_or_none(self.pool_in_use_mean),
            "pool_size_max": self.pool_size_max,
            "pool_saturation_max_pct": round_or_none(_scale(self.pool_saturation_max, 100)),
            "pool_saturation_mean_pct": round_or_none(_scale(self.pool_saturation_mean, 100)),
            "errors": self.errors,
            "errors_total": self.errors_total,
            "machine_busy_mean_pct": round_or_none(_scale(self.machine_busy_mean, 100)),
        }


@dataclass(frozen=True)
class BenchResult:
    """What one `run_load` produced: a row per stage, a total row and client-side health."""

    base_url: str
    think_s: float
    stages: list[Stage]
    rows: list[StageResult]
    total: StageResult
    wall_s: float
    client_cpu_s: float
    loop_lag_max_ms: float
    metrics_errors: int
    error_examples: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] | None = None

    @property
    def error_kinds(self) -> list[str]:
        """Every error kind seen during the run, sorted."""
        return sorted(self.total.errors)


def summarize(
    base_url: str,
    think_s: float,
    stages: Sequence[Stage],
    samples: Sequence[StageSamples],
    *,
    wall_s: float,
    client_cpu_s: float,
    loop_lag_max_ms: float,
    metrics_errors: int,
    texts: dict[str, str] | None,
    error_examples: dict[str, str] | None = None,
) -> BenchResult:
    """Turn per-stage raw samples into a `BenchResult` with a total row."""
    if len(stages) != len(samples):
        raise ValueError("one StageSamples per stage is required")
    rows: list[StageResult] = []
    everything = StageSamples()
    previous = 0
    for stage, sample in zip(stages, samples, strict=True):
        rows.append(
            StageResult.from_samples(stage.name, previous, stage.target, stage.duration_s, sample)
        )
        everything.merge(sample)
        previous = stage.target
    total = StageResult.from_samples(
        "total",
        0,
        max((s.target for s in stages), default=0),
        math.fsum(s.duration_s for s in stages),
        everything,
    )
    return BenchResult(
        base_url=base_url,
        think_s=think_s,
        stages=list(stages),
        rows=rows,
        total=total,
        wall_s=wall_s,
        client_cpu_s=client_cpu_s,
        loop_lag_max_ms=loop_lag_max_ms,
        metrics_errors=metrics_errors,
        error_examples=dict(sorted((error_examples or {}).items())),
        texts=texts,
    )


def to_json(result: BenchResult) -> dict[str, Any]:
    """Return the result as plain JSON-able data with stable keys."""
    previous = 0
    stage_defs = []
    for i, stage in enumerate(result.stages):
        stage_defs.append(
            {
                "index": i,
                "name": stage.name,
                "duration_s": stage.duration_s,
                "from": previous,
                "target": stage.target,
            }
        )
        previous = stage.target
    return {
        "version": JSON_VERSION,
        "base_url": result.base_url,
        "think_s": result.think_s,
        "duration_s": round_or_none(math.fsum(s.duration_s for s in result.stages)),
        "wall_s": round_or_none(result.wall_s),
        "stages": stage_defs,
        "results": [row.as_dict() for row in result.rows],
        "total": result.total.as_dict(),
        "error_kinds": result.error_kinds,
        "error_examples": result.error_examples,
        "client": {
            "cpu_s": round_or_none(result.client_cpu_s),
            "cpu_pct": round_or_none(100 * result.client_cpu_s / result.wall_s)
            if result.wall_s > 0
            else None,
            "loop_lag_max_ms": round_or_none(result.loop_lag_max_ms),
            "metrics_errors": result.metrics_errors,
        },
    }


def render_table(result: BenchResult) -> Table:
    """Return the per-stage table (latencies as mean / p95 / p99 in ms)."""
    table = Table(title=f"bullpen bench — {result.base_url}", title_justify="left")
    # Fold rather than truncate: a narrow terminal must never hide a figure.
    table.add_column("stage", overflow="fold")
    table.add_column("VUs", justify="right", overflow="fold")
    table.add_column("created/s", justify="right", overflow="fold")
    table.add_column("done/s", justify="right", overflow="fold")
    table.add_column("create ms\nmean/p95/p99", justify="right", overflow="fold")
    table.add_column("TTFT ms\nmean/p95/p99", justify="right", overflow="fold")
    table.add_column("provider TTFT ms\nmean/p95/p99", justify="right", overflow="fold")
    table.add_column("added ms\nmean/p95/p99", justify="right", overflow="fold")
    table.add_column("completion ms\nmean/p95/p99", justify="right", overflow="fold")
    table.add_column("RSS max\nMB", justify="right", overflow="fold")
    table.add_column("DB pool\nmax", justify="right", overflow="fold")
    table.add_column("machine\nbusy", justify="right", overflow="fold")
    table.add_column("errors", justify="right", overflow="fold")
    for row in result.rows:
        _add_row(table, row)
    table.add_section()
    _add_row(table, result.total, style="bold")
    if result.total.errors:
        kinds = ", ".join(f"{k}={n}" for k, n in result.total.errors.items())
        table.caption = f"errors: {kinds}"
    return table


def _add_row(table: Table, row: StageResult, style: str | None = None) -> None:
    if row.name == "total" or row.vus_from == row.vus_target:
        vus = str(row.vus_target) if row.name != "total" else f"≤{row.vus_target}"
    else:
        vus = f"{row.vus_from}→{row.vus_target}"
    table.add_row(
        row.name,
        vus,
        _fmt(row.created_per_s),
        _fmt(row.completed_per_s),
        _fmt_dist(row.create_ms),
        _fmt_dist(row.ttft_ms),
        _fmt_dist(row.provider_ttft_ms),
        _fmt_dist(row.overhead_ms),
        _fmt_dist(row.completion_ms),
        _fmt(_scale(row.rss_max_bytes, 1 / _MB), 0),
        _fmt_pool(row),
        _fmt_pct(row.machine_busy_mean),
        str(row.errors_total),
        style=style,
    )


def _fmt_pool(row: StageResult) -> str:
    return _fmt_pct(row.pool_saturation_max, "n/a")


def _fmt_pct(share: float | None, missing: str = _DASH) -> str:
    return missing if share is None else f"{share * 100:.0f}%"


def _fmt_dist(d: Distribution) -> str:
    if d.count == 0:
        return _DASH
    return " / ".join(_fmt_ms(v) for v in (d.mean, d.p95, d.p99))


def _fmt_ms(value: float | None) -> str:
    # About three significant digits keeps the column narrow from 0.25 ms to 2500 ms.
    if value is None:
        return _DASH
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _fmt(value: float | None, digits: int = 1) -> str:
    return _DASH if value is None else f"{value:.{digits}f}"


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


# Shared by the scenarios that compare servers side by side (create, reference).


def load_1m() -> float | None:
    """The machine's 1-minute load average, where the platform has one."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values present, or None."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None without both (or with b zero)."""
    return a / b if a is not None and b else None


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    """`value` rounded, None kept."""
    return None if value is None else round(value, digits)


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures with every float rounded to 3 digits."""
    return {k: round_or_none(v) if isinstance(v, float) else v for k, v in figures.items()}


class LiveProgress:
    """A Rich progress bar over the schedule, fed with `Snapshot`s; use as a context manager."""

    def __init__(self, total_s: float, *, console: Console | None = None) -> None:
        # stderr, so `--json` output on stdout stays clean even if someone leaves this on.
        self._progress = Progress(
            TextColumn("[bold]bench"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("/"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task("bench", total=max(total_s, 0.001), status="")

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, snap: Snapshot) -> None:
        """Show one snapshot."""
        status = (
            f"{snap.stage_name} · VUs {snap.active_vus}/{snap.target_vus} · "
            f"created {snap.created} · done {snap.completed} · errors {snap.errors}"
        )
        if snap.finished:
            status += " · finished"
        self._progress.update(
            self._task, completed=min(snap.elapsed_s, snap.total_s), status=status
        )

    __call__ = update


def live_progress(total_s: float, *, console: Console | None = None) -> LiveProgress:
    """Return a progress display for a schedule of `total_s` seconds (pass `.update` as on_tick)."""
    return LiveProgress(total_s, console=console)
