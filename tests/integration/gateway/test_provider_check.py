"""`POST /api/v1/providers/{id}/test`: one minimal streamed call to a provider, through the
gateway's client, against the built-in simulator over real sockets (both backends)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bullpen.domain.access import Role
from tests.support.http import call, problem
from tests.support.seed import new_member
from tests.support.servers import RunningServer

KEY = "sk-check-CANARYKEY-5f1e2d3c4b5a"  # pragma: allowlist secret


async def _provider(
    http: aiohttp.ClientSession, server: RunningServer, name: str, **fields: Any
) -> dict[str, Any]:
    assert server.services.simulator is not None
    body = {"name": name, "base_url": server.services.simulator.base_url, **fields}
    created = await call(http, server, "POST", "/api/v1/providers", body=body)
    assert created.status == 201, created.text
    return dict(created.body)


def _path(provider: dict[str, Any]) -> str:
    return f"/api/v1/providers/{provider['id']}/test"


async def test_a_check_times_one_small_call_and_never_shows_the_key(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    sim = server.services.simulator
    assert sim is not None
    good = await _provider(
        http, server, "good", api_key=KEY, models=[{"name": "sim-1"}, {"name": "sim-1@stamp"}]
    )
    before = sim.requests["sim-1"]
    ok = await call(http, server, "POST", _path(good))
    assert ok.status == 200, ok.text
    assert ok.body["ok"] is True and ok.body["provider"] == "good"
    assert ok.body["model"] == "sim-1" and ok.body["served_model"] == "sim-1"
    assert 0 < ok.body["ttft_ms"] <= ok.body["latency_ms"]
    assert ok.body["finish_reason"] in ("length", "stop")
    assert 0 < ok.body["output_tokens"] <= 8  # a minimal call: at most 8 tokens asked
    assert sim.requests["sim-1"] == before + 1  # exactly one call, no retry
    assert KEY not in ok.text
    # The breaker is untouched: a check is not traffic.
    assert server.services.gateway.router.breakers.view(good["id"]) is None

    # A model the provider does not list is not found (as in a route), nothing is called.
    unknown = await call(http, server, "POST", _path(good), body={"model": "gpt-9"})
    assert "offers no model 'gpt-9'" in problem(unknown, 404)["detail"]
    other = await call(http, server, "POST", _path(good), body={"model": "sim-1@stamp"})
    assert other.status == 200 and other.body["model"] == "sim-1@stamp"
    assert sim.requests["sim-1@stamp"] == 1
    assert sim.requests["sim-1"] == before + 1  # the model `other` was asked for instead
    # A body that is not JSON is 415; an unknown field 422.
    async with http.post(
        server.base_url + _path(good), data="model=sim-1", headers=server.auth
    ) as resp:
        assert resp.status == 415
    extra = await call(http, server, "POST", _path(good), body={"model": "sim-1", "x": 1})
    problem(extra, 422)


async def test_a_failed_check_is_a_problem_with_its_reason(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    failing = await _provider(http, server, "failing", api_key=KEY, models=[{"name": "sim-1@503"}])
    # The provider's own 503 is a bad gateway here: 502, the reason says what it answered.
    got = problem(await call(http, server, "POST", _path(failing)), 502)
    assert got["reason"] == "http-503" and got["provider"] == "failing"
    assert got["model"] == "sim-1@503"
    echo = await _provider(
        http, server, "echoing", api_key=KEY, models=[{"name": "sim-1@echo-error"}]
    )
    refused = await call(http, server, "POST", _path(echo))
    body = problem(refused, 502)
    assert body["reason"] == "http-401"
    assert KEY not in refused.text  # the provider quoted the key back: redacted
    assert server.services.gateway.router.breakers.view(failing["id"]) is None

    # No first token within the provider's limit: the check ends within about that limit.
    # The provider is at a non-public address that has not answered as a provider does, so
    # its failure looks like any other there (`failed`: no probing the internal network).
    slow = await _provider(
        http, server, "hanging", models=[{"name": "sim-1@hang"}], timeouts={"ttft_s": 0.5}
    )
    started = asyncio.get_running_loop().time()
    timed_out = problem(await call(http, server, "POST", _path(slow)), 502)
    assert timed_out["reason"] == "failed" and "non-public address" in timed_out["detail"]
    assert asyncio.get_running_loop().time() - started < 5

    # Nothing listens there (alike too); a provider listing no models needs one named.
    closed = await call(
        http,
        server,
        "POST",
        "/api/v1/providers",
        body={"name": "closed", "base_url": "http://127.0.0.1:9/v1"},
    )
    assert closed.status == 201, closed.text
    missing = await call(http, server, "POST", _path(closed.body))
    assert "name the model" in problem(missing, 404)["detail"]
    unreachable = await call(http, server, "POST", _path(closed.body), body={"model": "m"})
    assert problem(unreachable, 502)["reason"] == "failed"


async def test_only_provider_writers_check_and_only_their_own(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    good = await _provider(http, server, "good", models=[{"name": "sim-1"}])
    for role in (Role.MEMBER, Role.VIEWER):
        who = await new_member(server, role, f"{role.value}@example.com")
        headers = {"Authorization": f"Bearer {who.key}"}
        problem(await call(http, server, "POST", _path(good), headers=headers), 403)
    nobody = "00000000-0000-4000-8000-000000000000"
    problem(await call(http, server, "POST", f"/api/v1/providers/{nobody}/test"), 404)
