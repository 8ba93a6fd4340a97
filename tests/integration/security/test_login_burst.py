"""Finding 1, the burst: 300 sign-ins at once (each its own email and client address) against a
real `bullpen up` process, which must keep answering `/healthz` and keep its memory bounded.

The server runs as its own process so that its memory (`/proc/<pid>/status`) and its event loop
are its alone. SQLite only: the store does one indexed read per admitted attempt.

Before the fix every attempt went to argon2 (64 MiB each, on the default thread pool), which
took `/healthz` to seconds and the server's memory up by hundreds of MiB. The goals are
`/healthz` under 100 ms and +50 MiB; the test asserts generous bounds (a noisy shared 2-core
machine) and prints what it measured.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import aiohttp
import pytest

from bullpen.bench.spawn import spawn_server

T = TypeVar("T")

BURST = 300
PROBES = 3  # a burst's stall is one event; three probes catch it more surely than one
HEALTHZ_BOUND_S = 1.0
CPU_BOUND_S = 10.0
GROWTH_BOUND_MIB = 100.0
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


def memory_mib(pid: int, field: str) -> float:
    """`VmRSS` (now) or `VmHWM` (the peak so far) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


class HealthProbe(threading.Thread):
    """Times `GET /healthz` back to back on one keep-alive connection until stopped.

    A thread with a blocking client, not the test's event loop: the loop is busy with the burst.
    """

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        host, port = base_url.removeprefix("http://").split(":")
        self._conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self._halt = threading.Event()
        self.latencies_s: list[float] = []
        self.statuses: list[int] = []

    def run(self) -> None:
        while not self._halt.is_set():
            started = time.perf_counter()
            self._conn.request("GET", "/healthz")
            resp = self._conn.getresponse()
            resp.read()
            self.latencies_s.append(time.perf_counter() - started)
            self.statuses.append(resp.status)
            self._halt.wait(0.01)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)
        self._conn.close()


Answer = tuple[int, str | None]  # status, Retry-After


async def sign_in(
    client: aiohttp.ClientSession,
    base_url: str,
    page: tuple[dict[str, str], dict[str, str]],
    email: str,
    via: str,
) -> Answer:
    """Submit the sign-in form (a wrong password) from client address `via`."""
    cookies, hidden = page
    headers = {**SAME_ORIGIN, "X-Forwarded-For": via}
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    async with client.post(
        f"{base_url}/login",
        data={**hidden, "email": email, "password": "not the password at all"},
        headers=headers,
        allow_redirects=False,
    ) as resp:
        await resp.read()
        return resp.status, resp.headers.get("Retry-After")


def cpu_s(pid: int) -> float:
    """CPU time (user + system) a process has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def probed(base_url: str, burst: Awaitable[list[T]]) -> tuple[list[T], float]:
    """Run `burst` while `/healthz` is timed; its results and the slowest answer (ms)."""
    probes = [HealthProbe(base_url) for _ in range(PROBES)]
    for probe in probes:
        probe.start()
    try:
        results = await burst
    finally:
        for probe in probes:
            probe.stop()
    statuses = {status for probe in probes for status in probe.statuses}
    assert statuses == {200}, statuses
    return results, max(max(probe.latencies_s) for probe in probes) * 1000


@pytest.mark.timeout(300)
async def test_a_burst_of_sign_ins_leaves_the_server_answering_with_bounded_memory() -> None:
    async with (
        spawn_server("sqlite", sim="none") as server,
        aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=120),
        ) as client,
    ):
        base_url = server.base_url
        async with client.get(f"{base_url}/login") as resp:
            html = await resp.text()
            page = (
                {name: morsel.value for name, morsel in resp.cookies.items()},
                dict(HIDDEN.findall(html)),
            )

        def burst(form: tuple[dict[str, str], dict[str, str]]) -> Awaitable[list[Answer]]:
            """BURST sign-ins at once, each its own email and client address."""
            return asyncio.gather(
                *(
                    sign_in(client, base_url, form, f"user{i}@example.com", f"198.51.{i % 250}.7")
                    for i in range(BURST)
                )
            )

        # Warm-up: argon2's threads have run and held their memory once before the baseline.
        for i in range(4):
            await sign_in(client, base_url, page, f"warm{i}@example.com", "192.0.2.1")
        # The control: the same burst without the form's token, turned away before any
        # password work. What it does to /healthz is what this machine, loaded as it is now,
        # does to any burst of 300 requests.
        forged, control_ms = await probed(base_url, burst(({}, {})))
        assert {status for status, _ in forged} == {403}

        baseline, cpu_before = memory_mib(server.pid, "VmRSS"), cpu_s(server.pid)
        started = time.perf_counter()
        results, slowest_ms = await probed(base_url, burst(page))
        burst_s, cpu_used = time.perf_counter() - started, cpu_s(server.pid) - cpu_before
        peak, after = memory_mib(server.pid, "VmHWM"), memory_mib(server.pid, "VmRSS")

    statuses = Counter(status for status, _ in results)
    figures = (
        f"burst of {BURST}: {dict(statuses)} in {burst_s:.2f} s, server CPU {cpu_used:.2f} s;"
        f" /healthz slowest {slowest_ms:.0f} ms (the same burst without tokens:"
        f" {control_ms:.0f} ms); RSS {baseline:.0f} MiB before, peak {peak:.0f} MiB"
        f" (+{peak - baseline:.0f}), {after:.0f} MiB after"
    )
    print(figures)
    # Every attempt is a wrong password: checked (401) or turned away at once (503, with when
    # to come back) when the argon2 pool and its queue are full. Nothing else.
    assert set(statuses) <= {401, 503}, figures
    assert statuses[401] >= 1, figures
    assert all(retry is not None and int(retry) >= 1 for s, retry in results if s == 503)
    # The turned-away attempts cost next to nothing (before: 300 argon2 runs, ~45 s of CPU).
    assert cpu_used < CPU_BOUND_S, figures
    # /healthz within 1 s; on a machine so loaded that the control burst alone holds it up
    # longer, no worse than a few times that.
    assert slowest_ms < max(HEALTHZ_BOUND_S * 1000, 5 * control_ms), figures
    assert peak - baseline < GROWTH_BOUND_MIB, figures
