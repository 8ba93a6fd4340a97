"""Streaming chat completions over pooled aiohttp sessions, parsed with orjson (no SDK)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bullpen.errors import ProviderError
from bullpen.gateway.providers import Provider

_DATA = b"data:"
_DONE = b"[DONE]"


# Overloaded or briefly away: the same request may succeed later.
_TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})


@dataclass(slots=True)
class StreamResult:
    """What a finished stream reported besides its text."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    model: str | None = None
    text_parts: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Connect, first-token and between-chunk limits, in seconds."""

    connect_s: float
    ttft_s: float
    idle_s: float


class GatewayClient:
    """One pooled aiohttp session per provider; `async with` owns their lifetimes."""

    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        sessions, self._sessions = self._sessions, {}
        await asyncio.gather(*(s.close() for s in sessions.values()))

    def _session(self, provider: Provider) -> aiohttp.ClientSession:
        session = self._sessions.get(provider.base_url)
        if session is None:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self._timeouts.connect_s,
                    sock_read=self._timeouts.idle_s,
                ),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
            self._sessions[provider.base_url] = session
        return session

    async def stream_chat(
        self,
        provider: Provider,
        model: str,
        messages: Sequence[dict[str, str]],
        result: StreamResult,
        *,
        max_tokens: int | None = None,
    ) -> AsyncIterator[str]:
        """Yield content deltas; fill `result` with usage, finish reason and TTFT."""
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if provider.api_key:
            headers["Authorization"] = f"Bearer {provider.api_key}"
        url = provider.base_url.rstrip("/") + "/chat/completions"
        started = time.perf_counter()
        try:
            async with self._session(provider).post(
                url, data=orjson.dumps(body), headers=headers
            ) as resp:
                if resp.status != 200:
                    raise ProviderError(
                        await _describe_failure(provider, resp),
                        transient=resp.status in _TRANSIENT_STATUSES,
                    )
                async for delta in self._read(resp, result, started):
                    yield delta
        except ProviderError:
            raise
        except TimeoutError as err:
            raise ProviderError(
                f"provider {provider.name!r} timed out "
                f"({'before the first token' if result.ttft_s is None else 'between chunks'})",
                transient=True,
            ) from err
        except aiohttp.ClientError as err:
            raise ProviderError(
                f"provider {provider.name!r} connection failed: {type(err).__name__}",
                transient=True,
            ) from err
        if result.finish_reason is None:
            raise ProviderError(
                f"provider {provider.name!r} stream ended without finishing", transient=True
            )

    async def _read(
        self, resp: aiohttp.ClientResponse, result: StreamResult, started: float
    ) -> AsyncIterator[str]:
        content = resp.content
        async with asyncio.timeout(self._timeouts.ttft_s) as first_token_deadline:
            while result.ttft_s is None:
                line = await content.readline()
                if not line:
                    return
                delta = _parse(line, result)
                if delta:
                    result.ttft_s = time.perf_counter() - started
                    first_token_deadline.reschedule(None)
                    result.text_parts.append(delta)
                    yield delta
        async for line in content:
            delta = _parse(line, result)
            if delta:
                result.text_parts.append(delta)
                yield delta


def _parse(line: bytes, result: StreamResult) -> str | None:
    """One SSE line → its content delta, recording usage and finish reason on the way."""
    if not line.startswith(_DATA):
        return None
    payload = line[len(_DATA) :].strip()
    if not payload or payload == _DONE:
        return None
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError as err:
        raise ProviderError("provider sent a malformed stream chunk") from err
    if not isinstance(chunk, dict):
        raise ProviderError("provider sent a malformed stream chunk")
    if "error" in chunk:
        message = chunk["error"].get("message") if isinstance(chunk["error"], dict) else None
        raise ProviderError(f"provider stream error: {str(message or 'unknown')[:200]}")
    usage = chunk.get("usage")
    if usage:
        result.input_tokens = usage.get("prompt_tokens")
        result.output_tokens = usage.get("completion_tokens")
    if result.model is None:
        result.model = chunk.get("model")
    choices = chunk.get("choices")
    if not choices:
        return None
    choice = choices[0]
    reason = choice.get("finish_reason")
    if reason:
        result.finish_reason = reason
    delta = choice.get("delta")
    content = delta.get("content") if delta else None
    return content if isinstance(content, str) and content else None


async def _describe_failure(provider: Provider, resp: aiohttp.ClientResponse) -> str:
    """A short, secret-free description of a non-200 provider answer."""
    message = ""
    try:
        body = orjson.loads(await resp.content.read(4096))
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            message = str(body["error"].get("message", ""))[:200]
    except (orjson.JSONDecodeError, aiohttp.ClientError, TimeoutError):
        pass
    if provider.api_key and message:
        message = message.replace(provider.api_key, "[redacted]")
    suffix = f": {message}" if message else ""
    return f"provider {provider.name!r} answered HTTP {resp.status}{suffix}"
