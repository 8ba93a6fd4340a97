"""Fault tests' harness: real `bullpen worker` processes on one PostgreSQL database, and a ledger.

The ledger is what the database holds after the storm, checked per task created:
- lost: a task whose run did not end `done`;
- duplicated: a run with more than one end event, or a task with more than one run;
- unexpected: a result that is not exactly the text its final attempt streamed (text of two
  attempts run together, or a stale attempt's text stored), or a gap in a run's seq.
A run's effect (its final state and end event) commits once, under its run id and fenced by
its attempt, so a delivery made twice can only ever record one outcome.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import sqlalchemy as sa

from bullpen.app import open_store
from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.tables import run_events, runs, tasks
from tests.support.processes import log_file, process_env, read_log
from tests.support.queueload import bootstrap, enqueue

TERMINAL = ("done", "failed", "cancelled")


def worker_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment of a worker process on the test's database (fast simulator, short lease)."""
    defaults: dict[str, Any] = {
        "sim_ttft_ms": 20,
        "sim_tokens_per_second": 400,
        "sim_response_tokens": 8,
        "lease_s": 2,
        "poll_interval_s": 0.5,
        "retry_backoff_s": 0.2,
        "retry_backoff_max_s": 2,
        "max_attempts": 20,
        "worker_concurrency": 64,
        "drain_grace_s": 10,
        "housekeeping_interval_s": 3600,
        # A worker paused mid-transaction lets go of its row locks (and runs) this soon.
        "db_idle_transaction_timeout_s": 5,
    }
    return process_env(settings, **{**defaults, **extra})


class Workers:
    """A set of `bullpen worker` processes that can be killed, paused and replaced."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[str] = []
        self.collected: set[int] = set()
        self._log_files: dict[int, IO[str]] = {}

    def start(self, count: int = 1) -> list[subprocess.Popen[str]]:
        """Start `count` more workers."""
        started = []
        for _ in range(count):
            stderr = log_file()
            proc = subprocess.Popen(
                [sys.executable, "-m", "bullpen", "worker"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                text=True,
            )
            self._log_files[proc.pid] = stderr
            self.procs.append(proc)
            started.append(proc)
        return started

    async def ready(self, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
        """Wait until a worker has said it is ready (its claims and its listener are up)."""
        log = self._log_files[proc.pid]
        deadline = time.monotonic() + timeout_s
        while b"ready" not in os.pread(log.fileno(), os.fstat(log.fileno()).st_size, 0):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker {proc.pid} did not start")
            await asyncio.sleep(0.1)

    def alive(self) -> list[subprocess.Popen[str]]:
        """The workers still running."""
        return [p for p in self.procs if p.poll() is None]

    def collect(self, proc: subprocess.Popen[str], timeout: float = 30) -> str:
        """Wait for a worker to exit and keep its log."""
        err = read_log(proc, self._log_files.pop(proc.pid), timeout)
        self.logs.append(err)
        self.collected.add(proc.pid)
        return err

    def stop_all(self) -> None:
        """Kill whatever still runs and collect every log."""
        for proc in self.procs:
            if proc.poll() is None:
                if _is_stopped(proc.pid):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            if proc.pid not in self.collected:
                self.collect(proc)


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].startswith("T")
    except OSError:
        return False


@contextmanager
def workers(env: dict[str, str]) -> Iterator[Workers]:
    """Workers that are all killed (and their logs collected) when the block ends."""
    pool = Workers(env)
    try:
        yield pool
    finally:
        pool.stop_all()


async def wait_terminal(store: Store, task_ids: list[uuid.UUID], seconds: float) -> int:
    """Wait until every task's run is terminal or time runs out; returns how many are not."""
    deadline = time.monotonic() + seconds
    while True:
        async with store.read() as conn:
            left = (
                await conn.execute(
                    sa.select(sa.func.count())
                    .select_from(runs)
                    .where(runs.c.task_id.in_(task_ids), runs.c.status.not_in(TERMINAL))
                )
            ).scalar_one()
        if left == 0 or time.monotonic() > deadline:
            return int(left)
        await asyncio.sleep(0.5)


@dataclass
class Ledger:
    """What the database recorded for the tasks a test created."""

    lost: list[uuid.UUID] = field(default_factory=list)
    duplicated: list[uuid.UUID] = field(default_factory=list)
    unexpected: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    attempts: dict[uuid.UUID, int] = field(default_factory=dict)
    # How each lost task's run ended: status, failed deliveries and error.
    endings: dict[uuid.UUID, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """No lost, duplicated or unexpected outcome."""
        return not (self.lost or self.duplicated or self.unexpected)

    def summary(self) -> str:
        """A line for assertion messages."""
        return (
            f"lost={len(self.lost)} duplicated={len(self.duplicated)} "
            f"unexpected={self.unexpected[:5]} redelivered="
            f"{sum(1 for a in self.attempts.values() if a > 1)}"
            + "".join(f"\n  lost {task}: {how}" for task, how in list(self.endings.items())[:5])
        )


async def ledger(store: Store, task_ids: list[uuid.UUID], *, expect: str = "done") -> Ledger:
    """Check every task's outcome against its stored events (see the module docstring)."""
    out = Ledger()
    wanted = set(task_ids)
    async with store.read() as conn:
        run_rows = list(
            await conn.execute(
                sa.select(
                    runs.c.id,
                    runs.c.task_id,
                    runs.c.status,
                    runs.c.attempt,
                    runs.c.failures,
                    runs.c.error,
                ).where(runs.c.task_id.in_(task_ids))
            )
        )
        results = {
            row.id: row.result
            for row in await conn.execute(
                sa.select(tasks.c.id, tasks.c.result).where(tasks.c.id.in_(task_ids))
            )
        }
        events: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for row in await conn.execute(
            sa.select(run_events.c.run_id, run_events.c.seq, run_events.c.kind, run_events.c.data)
            .where(run_events.c.task_id.in_(task_ids))
            .order_by(run_events.c.run_id, run_events.c.seq)
        ):
            events[row.run_id].append(row)
    per_task: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for row in run_rows:
        per_task[row.task_id].append(row)
    for task_id in wanted:
        task_runs = per_task.get(task_id, [])
        if len(task_runs) != 1:
            out.duplicated.append(task_id)
            continue
        (run,) = task_runs
        out.attempts[task_id] = int(run.attempt)
        if run.status != expect:
            out.lost.append(task_id)
            out.endings[task_id] = (
                f"{run.status}, attempt {run.attempt}, failures {run.failures}: {run.error}"
            )
            continue
        evs = events.get(run.id, [])
        ends = [e for e in evs if e.kind == "end"]
        if len(ends) != 1:
            out.duplicated.append(task_id)
            continue
        if [e.seq for e in evs] != list(range(1, len(evs) + 1)):
            out.unexpected.append((task_id, "seq gap"))
            continue
        if expect == "done":
            # The text after the last attempt marker is the result, exactly.
            starts = [i for i, e in enumerate(evs) if e.kind == "status" and e.data.get("attempt")]
            last = starts[-1] if starts else 0
            if evs[last].data.get("attempt") != run.attempt:
                out.unexpected.append((task_id, "last marker is not the final attempt"))
                continue
            text = "".join(e.data["text"] for e in evs[last:] if e.kind == "text")
            if text != results[task_id]:
                out.unexpected.append((task_id, "result differs from the final attempt's text"))
    return out


__all__ = [
    "Ledger",
    "Workers",
    "bootstrap",
    "enqueue",
    "ledger",
    "open_store",
    "wait_terminal",
]
