"""Calling the API over a real socket in tests: one reply shape, and what every problem holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.support.servers import RunningServer

PROBLEM = "application/problem+json"


@dataclass
class Reply:
    """A response read whole: its status, JSON body (None when empty), headers and text."""

    status: int
    body: Any
    headers: Any
    text: str


async def read(resp: aiohttp.ClientResponse) -> Reply:
    """Read a response whole into a Reply (also one already read and released)."""
    # text() and json() reuse a body read before; read() refuses once the response is released.
    text = await resp.text(encoding="utf-8")
    parsed = await resp.json(content_type=None) if text else None
    return Reply(resp.status, parsed, resp.headers, text)


async def call(
    http: aiohttp.ClientSession,
    server: RunningServer,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: Any = None,
) -> Reply:
    """One request to the server; as the bootstrap admin's key unless `headers` are given."""
    kwargs: dict[str, Any] = {"headers": server.auth if headers is None else headers}
    if body is not None:
        kwargs["json"] = body
    async with http.request(method, server.base_url + path, **kwargs) as resp:
        return await read(resp)


def problem(reply: Reply, status: int) -> dict[str, Any]:
    """Assert that the reply is an RFC 9457 problem with this status; returns its body."""
    assert reply.status == status, reply.text
    assert reply.headers["Content-Type"] == PROBLEM
    body: dict[str, Any] = reply.body
    assert body["status"] == status
    assert body["type"].startswith("https://bullpen.dev/problems/")
    assert body["title"] and body["detail"], body
    assert "Traceback" not in reply.text
    return body


async def problem_of(resp: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    """`problem` for a response still open in the caller's hands."""
    assert resp.status == status, await resp.text()
    return problem(await read(resp), status)


def bearer(key: str) -> dict[str, str]:
    """Headers that authenticate with this API key."""
    return {"Authorization": f"Bearer {key}"}
