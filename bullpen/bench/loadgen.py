"""The reference scenario as a k6-style load test against a running Bullpen server.

Each virtual user loops: create a task, watch its event stream to `end`, think, repeat. A
controller adds and retires VUs every 100 ms to follow the stage schedule; a retired VU finishes
its current request then exits. Samples belong to the stage in which their iteration started.
Failures never leave a VU: they are counted by kind (see `ERROR_KINDS`).

The client is kept cheap so it is not what limits the figures: one pooled aiohttp session with
keep-alive, pre-encoded headers, a hand-written SSE parser that splits on blank lines, orjson
for payloads; `BenchResult.client_cpu_s` and `loop_lag_max_ms` show whether it kept up.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from bullpen.bench.report import BenchResult, Snapshot, StageSamples, summarize
from bullpen.bench.stages import Stage, stage_at, target_at, total_duration

__all__ = ["ERROR_KINDS", "SSEParser", "Snapshot", "make_prompt", "parse_gauges", "run_load"]

TICK_S = 0.1
METRICS_INTERVAL_S = 1.0
# After `end` the server closes the stream; waiting for that lets the connection be reused.
_MARKERS = frozenset({"run", "close"})  # task stream events without an id
_CLOSE_WAIT_S = 2.0
_RETRY_AFTER_CAP_S = 5.0
_EXAMPLE_CHARS = 300

#: Error kinds; `create_http_<status>` and `stream_http_<status>` carry the HTTP status and
#: `end_<status>` the final status the server reported (e.g. `end_failed`).
ERROR_KINDS = {
    "create_http_<status>": "POST /tasks answered something other than 201",
    "create_connection": "connecting or sending the create failed",
    "create_timeout": "the create did not answer in time",
    "create_client_error": "another HTTP client error during the create",
    "create_bad_response": "a 201 whose body has no task id",
    "stream_http_<status>": "GET /tasks/{id}/events answered something other than 200",
    "stream_connection": "the event stream could not be opened or was dropped",
    "stream_timeout": "the event stream stalled or ran past the request timeout",
    "stream_client_error": "another HTTP client error while streaming",
    "seq_gap": "an event id was not the next of 1.1, 1.2, ... (the task's first run)",
    "bad_event": "an event's data was not the JSON the contract promises",
    "truncated": "the stream closed without an `end` event",
    "end_<status>": "the run ended with a status other than done",
    "stream_not_closed": "the server kept the stream open after `end` (the run still counts)",
    "drain_timeout": "an iteration was still running long after the schedule ended",
    "unexpected": "a bug in the client (the example shows the exception)",
}

_GAUGES = ("process_resident_memory_bytes", "bullpen_db_pool_in_use", "bullpen_db_pool_size")

_DATASETS = (
    ("quarterly sales by region", "region, quarter, units, revenue_usd, discount_pct"),
    ("customer churn cohorts", "cohort_month, customers, churned, mrr_usd, plan"),
    ("web traffic logs", "timestamp, path, status, latency_ms, country, referrer"),
    ("support ticket backlog", "opened_at, priority, team, first_response_h, resolved"),
    ("warehouse inventory", "sku, warehouse, on_hand, reorder_point, lead_time_days"),
    ("ad campaign spend", "campaign, channel, impressions, clicks, spend_usd, conversions"),
    ("payment attempts", "attempted_at, method, amount_usd, outcome, decline_code"),
    ("sensor telemetry", "device_id, recorded_at, temperature_c, humidity_pct, battery_v"),
)


def make_prompt(n: int) -> str:
    """Return the n-th benchmark prompt: realistic, varied, 10–2000 characters."""
    name, columns = _DATASETS[n % len(_DATASETS)]
    rows = 1_000 + (n * 7_919) % 250_000
    return (
        f"Analyze this dataset and extract key metrics: {name}, {rows} rows, columns "
        f"{columns}. Report totals, period-over-period trends, the three largest outliers "
        f"and anything that looks like a data-quality problem. Reference #{n}."
    )


class SSEParser:
    """Incremental `text/event-stream` parser: feed bytes, get complete events."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, str, bytes]]:
        """Return the `(id, event, data)` of every event completed by `chunk`."""
        data = self._buf + chunk if self._buf else chunk
        if b"\r" in data:
            # A trailing CR may be the first half of a CRLF: keep it for the next chunk.
            hold = data.endswith(b"\r")
            body = (data[:-1] if hold else data).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            data = body + b"\r" if hold else body
        blocks = data.split(b"\n\n")
        self._buf = blocks.pop()
        events: list[tuple[bytes | None, str, bytes]] = []
        for block in blocks:
            event_id: bytes | None = None
            kind = "message"
            lines: list[bytes] = []
            for line in block.split(b"\n"):
                if not line or line[0] == 0x3A:  # ":" starts a comment (keep-alive)
                    continue
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    lines.append(value)
                elif name == b"event":
                    kind = value.decode()
                elif name == b"id":
                    event_id = value
            if lines:
                events.append((event_id, kind, b"\n".join(lines)))
        return events


def parse_gauges(text: str, names: Sequence[str] = _GAUGES) -> dict[str, float]:
    """Return the named samples of a Prometheus text page, summed over label sets."""
    wanted = frozenset(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < name_end:
                name_end = i
        name = line[:name_end]
        if name not in wanted:
            continue
        # The value follows the label set, whose values may contain spaces.
        rest = line[line.rindex("}") + 1 :] if line.startswith("{", name_end) else line[name_end:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass(eq=False)
class _VU:
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stage: int | None = None  # stage of the iteration in progress
    task: asyncio.Task[None] | None = None


class _Failed(Exception):
    """Ends an iteration with an error kind (never leaves the VU)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind = kind
        self.detail = detail


class _Load:
    """State shared by the controller, the VUs and the metrics sampler of one run."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        agent_id: str,
        stages: Sequence[Stage],
        *,
        think_s: float,
        keep_texts: bool,
        request_timeout_s: float,
    ) -> None:
        self.session = session
        self.tasks_url = f"{base_url}/api/v1/tasks"
        self.metrics_url = f"{base_url}/metrics"
        self.agent_id = agent_id
        self.stages = stages
        self.total_s = total_duration(stages)
        self.think_s = think_s
        self.samples = [StageSamples() for _ in stages]
        self.texts: dict[str, str] | None = {} if keep_texts else None
        # task id -> (stage, client TTFT s), joined after the load with the server's own record
        # of the provider's TTFT for that run: the difference is what Bullpen added.
        self.client_ttft: dict[str, tuple[int, float]] = {}
        self.examples: dict[str, str] = {}
        self.created = 0
        self.completed = 0
        self.errors = 0
        self.metrics_errors = 0
        self.start = time.perf_counter()
        self._prompts = itertools.count()
        self._create_timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=min(10.0, request_timeout_s)
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            total=request_timeout_s,
            sock_connect=min(10.0, request_timeout_s),
            sock_read=min(60.0, request_timeout_s),
        )
        self._post_headers = {"Content-Type": "application/json"}
        self._sse_headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fail(self, stage: int, kind: str, detail: str = "") -> None:
        self.samples[stage].errors[kind] += 1
        self.errors += 1
        if kind not in self.examples:
            self.examples[kind] = detail[:_EXAMPLE_CHARS]

    async def vu(self, vu: _VU) -> None:
        """Run iterations until told to stop; sleep `think_s` (or Retry-After) between them."""
        while not vu.stop.is_set():
            stage = stage_at(self.stages, self.elapsed())
            vu.stage = stage
            try:
                pause = await self.iteration(stage)
            except _Failed as exc:
                self.fail(stage, exc.kind, exc.detail)
                pause = 0.0
            except Exception as exc:  # a client bug must not silently shrink the load
                self.fail(stage, "unexpected", repr(exc))
                pause = 0.0
            vu.stage = None
            pause = max(pause, self.think_s)
            if pause > 0 and not vu.stop.is_set():
                try:
                    async with asyncio.timeout(pause):
                        await vu.stop.wait()
                except TimeoutError:
                    pass

    async def iteration(self, stage: int) -> float:
        """Create one task and follow it to `end`; return how long the server asked us to wait."""
        samples = self.samples[stage]
        body = orjson.dumps({"prompt": make_prompt(next(self._prompts)), "agent_id": self.agent_id})
        sent = time.perf_counter()
        try:
            async with self.session.post(
                self.tasks_url, data=body, headers=self._post_headers, timeout=self._create_timeout
            ) as resp:
                raw = await resp.read()
                if resp.status != 201:
                    self.fail(stage, f"create_http_{resp.status}", raw.decode(errors="replace"))
                    return _retry_after(resp.headers.get("Retry-After"))
        except Exception as exc:
            raise _client_failure("create", exc) from exc
        samples.create_s.append(time.perf_counter() - sent)
        samples.created += 1
        self.created += 1
        try:
            task_id = orjson.loads(raw)["id"]
            if not isinstance(task_id, str):
                raise TypeError(f"id is {type(task_id).__name__}")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise _Failed("create_bad_response", f"{exc!r}: {raw[:200]!r}") from exc
        try:
            async with self.session.get(
                f"{self.tasks_url}/{task_id}/events",
                headers=self._sse_headers,
                timeout=self._stream_timeout,
            ) as resp:
                if resp.status != 200:
                    detail = (await resp.read()).decode(errors="replace")
                    self.fail(stage, f"stream_http_{resp.status}", detail)
                    return _retry_after(resp.headers.get("Retry-After"))
                await self._follow(resp, stage, task_id, sent)
        except _Failed:
            raise
        except Exception as exc:
            raise _client_failure("stream", exc) from exc
        return 0.0

    async def _follow(
        self, resp: aiohttp.ClientResponse, stage: int, task_id: str, sent: float
    ) -> None:
        parser = SSEParser()
        expected = 1
        first_text: float | None = None
        parts: list[str] = []
        async for chunk in resp.content.iter_any():
            for event_id, kind, data in parser.feed(chunk):
                if event_id is None and kind in _MARKERS:
                    continue
                if event_id != b"1.%d" % expected:
                    raise _Failed(
                        "seq_gap", f"task {task_id}: expected id 1.{expected}, got {event_id!r}"
                    )
                expected += 1
                if kind == "text":
                    if first_text is None:
                        first_text = time.perf_counter()
                    parts.append(_field(data, "text", task_id))
                elif kind == "end":
                    ended = time.perf_counter()
                    status = _field(data, "status", task_id)
                    if not await _await_close(resp):
                        self.fail(stage, "stream_not_closed", f"task {task_id}")
                    if self.texts is not None:
                        self.texts[task_id] = "".join(parts)
                    if status != "done":
                        raise _Failed(f"end_{status}", f"task {task_id} ended {status}")
                    samples = self.samples[stage]
                    if first_text is not None:
                        samples.ttft_s.append(first_text - sent)
                        self.client_ttft[task_id] = (stage, first_text - sent)
                    samples.completion_s.append(ended - sent)
                    samples.completed += 1
                    self.completed += 1
                    return
        raise _Failed("truncated", f"task {task_id}: stream closed after id {expected - 1}")

    async def join_provider_ttft(self) -> None:
        """Read every run's provider TTFT as the server recorded it (after the load ends)."""
        url: str | None = f"{self.tasks_url}?limit=100"
        timeout = aiohttp.ClientTimeout(total=30.0)
        while url is not None and self.client_ttft:
            try:
                async with self.session.get(url, timeout=timeout) as resp:
                    if resp.status != 200:
                        self.metrics_errors += 1
                        return
                    page = orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                self.metrics_errors += 1
                return
            for item in page.get("items", []):
                seen = self.client_ttft.pop(str(item.get("id")), None)
                run = item.get("run") or {}
                if seen is not None and isinstance(run.get("ttft_ms"), int | float):
                    stage, client_s = seen
                    provider_s = run["ttft_ms"] / 1000.0
                    self.samples[stage].provider_ttft_s.append(provider_s)
                    self.samples[stage].overhead_s.append(client_s - provider_s)
            cursor = page.get("next_cursor")
            url = f"{self.tasks_url}?limit=100&cursor={cursor}" if cursor else None

    async def sample_metrics(self) -> None:
        """Poll /metrics once a second until the schedule ends; and how busy the machine's
        cores were over each second (everything on it: server, client, database)."""
        timeout = aiohttp.ClientTimeout(total=5.0)
        next_at = self.start
        cores = machine_cpu()
        while (t := self.elapsed()) < self.total_s:
            stage = stage_at(self.stages, t)
            now = machine_cpu()
            if cores is not None and now is not None and now[1] > cores[1]:
                busy = (now[0] - cores[0]) / (now[1] - cores[1])
                self.samples[stage].machine_busy.append(busy)
            cores = now
            try:
                async with self.session.get(self.metrics_url, timeout=timeout) as resp:
                    text = await resp.text()
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                self._record_gauges(stage, parse_gauges(text))
            else:
                self.metrics_errors += 1
            next_at += METRICS_INTERVAL_S
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    def _record_gauges(self, stage: int, gauges: dict[str, float]) -> None:
        samples = self.samples[stage]
        if (rss := gauges.get("process_resident_memory_bytes")) is not None:
            samples.rss_bytes.append(rss)
        in_use = gauges.get("bullpen_db_pool_in_use")
        size = gauges.get("bullpen_db_pool_size")
        if in_use is not None and size is not None:
            samples.pool_in_use.append(in_use)
            samples.pool_size.append(size)
            if size > 0:
                samples.pool_saturation.append(in_use / size)

    def snapshot(self, t: float, target: int, active: int, *, finished: bool = False) -> Snapshot:
        stage = stage_at(self.stages, t)
        return Snapshot(
            elapsed_s=min(t, self.total_s),
            total_s=self.total_s,
            stage_index=stage,
            stage_name=self.stages[stage].name,
            target_vus=target,
            active_vus=active,
            created=self.created,
            completed=self.completed,
            errors=self.errors,
            finished=finished,
        )


def machine_cpu() -> tuple[int, int] | None:
    """The machine's CPU time since boot, busy and in all, in clock ticks over every core
    (`/proc/stat`; idle and waiting on I/O are not busy); None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            first = stat.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(n) for n in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _field(data: bytes, key: str, task_id: str) -> str:
    try:
        value = orjson.loads(data)[key]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise _Failed("bad_event", f"task {task_id}: {data[:200]!r}") from exc
    if not isinstance(value, str):
        raise _Failed("bad_event", f"task {task_id}: {key} is {type(value).__name__}")
    return value


async def _await_close(resp: aiohttp.ClientResponse) -> bool:
    """Read to the end of the stream so the connection can be reused; False if it stays open."""
    try:
        async with asyncio.timeout(_CLOSE_WAIT_S):
            await resp.content.read()
    except TimeoutError:
        return False
    except aiohttp.ClientError:
        pass  # the run is already complete; the connection is simply not reused
    return True


def _client_failure(phase: str, exc: Exception) -> _Failed:
    # aiohttp's ServerTimeoutError is also a connection error: check timeouts first.
    if isinstance(exc, TimeoutError):
        return _Failed(f"{phase}_timeout", repr(exc))
    if isinstance(exc, aiohttp.ClientConnectionError):
        return _Failed(f"{phase}_connection", repr(exc))
    if isinstance(exc, aiohttp.ClientError):
        return _Failed(f"{phase}_client_error", repr(exc))
    return _Failed("unexpected", repr(exc))


def _retry_after(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        return 0.0  # an HTTP date: not worth parsing for a bench
    return min(max(seconds, 0.0), _RETRY_AFTER_CAP_S) if math.isfinite(seconds) else 0.0


async def run_load(
    base_url: str,
    api_key: str,
    agent_id: str,
    stages: Sequence[Stage],
    *,
    think_s: float = 1.0,
    on_tick: Callable[[Snapshot], None] | None = None,
    sample_metrics: bool = True,
    keep_texts: bool = False,
    request_timeout_s: float = 120.0,
) -> BenchResult:
    """Drive the reference scenario through `stages` against `base_url` and return the result.

    `on_tick` is called on the event loop about every 100 ms (keep it quick); `keep_texts`
    keeps the streamed text of every task whose stream reached `end`. Latency figures cover
    successful requests and runs that ended `done`; everything else is an error by kind.
    """
    if not stages:
        raise ValueError("at least one stage is required")
    if think_s < 0 or request_timeout_s <= 0:
        raise ValueError("think_s must be >= 0 and request_timeout_s > 0")
    base_url = base_url.rstrip("/")
    peak = max(s.target for s in stages)
    connector = aiohttp.TCPConnector(
        limit=2 * peak + 8, limit_per_host=0, keepalive_timeout=30.0, ttl_dns_cache=300
    )
    cpu_start = time.process_time()
    async with aiohttp.ClientSession(
        connector=connector, headers={"Authorization": f"Bearer {api_key}"}
    ) as session:
        load = _Load(
            session,
            base_url,
            agent_id,
            stages,
            think_s=think_s,
            keep_texts=keep_texts,
            request_timeout_s=request_timeout_s,
        )
        vus: list[_VU] = []
        sampler = asyncio.create_task(load.sample_metrics()) if sample_metrics else None
        try:
            lag_max = await _control(load, vus, on_tick)
            await _drain(load, vus, timeout_s=2 * request_timeout_s + _CLOSE_WAIT_S)
            if on_tick is not None:
                on_tick(load.snapshot(load.elapsed(), 0, 0, finished=True))
            wall_s = load.elapsed()
            await load.join_provider_ttft()
        finally:
            pending = [v.task for v in vus if v.task is not None and not v.task.done()]
            if sampler is not None:
                pending.append(sampler)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    result = summarize(
        base_url,
        think_s,
        stages,
        load.samples,
        wall_s=wall_s,
        client_cpu_s=time.process_time() - cpu_start,
        loop_lag_max_ms=lag_max * 1000.0,
        metrics_errors=load.metrics_errors,
        texts=load.texts,
        error_examples=load.examples,
    )
    return result


async def _control(
    load: _Load, vus: list[_VU], on_tick: Callable[[Snapshot], None] | None
) -> float:
    """Follow the schedule until it ends; return the worst lateness of a tick in seconds."""
    lag_max = 0.0
    next_tick = load.start
    while True:
        now = time.perf_counter()
        lag_max = max(lag_max, now - next_tick)
        t = now - load.start
        if t >= load.total_s:
            return lag_max
        target = target_at(load.stages, t)
        vus[:] = [v for v in vus if v.task is None or not v.task.done()]
        active = [v for v in vus if not v.stop.is_set()]
        if len(active) < target:
            missing = target - len(active)
            for v in vus:  # bring back a retiring VU before starting a new one
                if missing and v.stop.is_set():
                    v.stop.clear()
                    missing -= 1
            for _ in range(missing):
                v = _VU()
                v.task = asyncio.create_task(load.vu(v))
                vus.append(v)
        elif len(active) > target:
            for v in active[target:]:
                v.stop.set()
        # Retiring VUs still finishing an iteration count: they still load the server.
        samples = load.samples[stage_at(load.stages, t)]
        samples.vus_max = max(samples.vus_max, len(vus))
        if on_tick is not None:
            on_tick(load.snapshot(t, target, len(vus)))
        next_tick += TICK_S
        await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))


async def _drain(load: _Load, vus: list[_VU], *, timeout_s: float) -> None:
    """Retire every VU, let in-flight iterations finish, cancel the ones that overstay."""
    for v in vus:
        v.stop.set()
    tasks = [v.task for v in vus if v.task is not None]
    if not tasks:
        return
    await asyncio.wait(tasks, timeout=timeout_s)
    for v in vus:
        if v.task is not None and not v.task.done() and v.stage is not None:
            load.fail(v.stage, "drain_timeout", "iteration still running after the schedule")
