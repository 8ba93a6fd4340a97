"""One streaming chat completion against one provider, over pooled connections (no SDK).

Every call streams upstream, whatever the caller asked for: the gateway needs the first token
to know when fallback stops being allowed. Chunks are parsed with orjson and handed on as
dicts. Failures become typed errors whose `transient` flag says whether the next provider of
a chain may be tried, and whose `reason` names what happened (for the run's attempt record
and the metrics).

Workspace providers pass the outbound guard (`bullpen.security.outbound`) on every new
connection; built-in ones (configured by the operator) do not, and have a pool of their own.
A provider at a non-public address (one `BULLPEN_OUTBOUND_ALLOW` lets through) never has its
own error text shown, and until it has answered as an OpenAI-compatible provider does (an
`{"error": {...}}` answer or a stream chunk) all its failures look alike: a closed port, a web
page, another protocol and a silent service give callers the same error, so provider URLs
cannot map the internal network. The server log keeps what really happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp.abc import AbstractResolver

from bullpen.errors import (
    ProviderAuth,
    ProviderError,
    ProviderRejected,
    ProviderSpendLimit,
    ProviderTimeout,
)
from bullpen.gateway.catalog import Provider
from bullpen.gateway.http1 import Http1Pool, Peer, Response, target_of
from bullpen.gateway.redact import scrub
from bullpen.security.outbound import SETTING, AddressGuard, OutboundAllow, OutboundRefused

log = logging.getLogger(__name__)

_DATA = b"data:"
_DONE = b"[DONE]"
_NEWLINE = b"\n"
# Overloaded or briefly away: the same request may succeed later, or elsewhere.
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "spend_limit"})
_ERROR_BODY_BYTES = 4096
_MESSAGE_CHARS = 300


@dataclass(slots=True)
class Exchange:
    """What one attempt against one provider produced, besides the chunks themselves."""

    ttft_s: float | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None
    content_chunks: int = 0


def failure(
    cls: type[ProviderError],
    reason: str,
    detail: str,
    *,
    transient: bool | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """A typed provider error carrying a short machine-readable `reason`."""
    return cls(detail, reason=reason, transient=transient, retry_after=retry_after)


class GatewayClient:
    """Keep-alive connections to every provider; `async with` owns their lifetimes.

    With `allow`, workspace providers are guarded (`resolver` does the guard's lookups; the
    system's when None); without it nothing is (tests and benchmarks of the gateway alone).
    """

    def __init__(
        self, allow: OutboundAllow | None = None, resolver: AbstractResolver | None = None
    ) -> None:
        self._guard = None if allow is None else AddressGuard(allow, resolver)
        self._pool = Http1Pool(self._guard)
        # Built-in providers never share a connection with a guarded one of the same origin.
        self._builtin_pool = self._pool if self._guard is None else Http1Pool()

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._pool.close()
        self._builtin_pool.close()
        if self._guard is not None:
            await self._guard.close()

    async def stream(
        self, provider: Provider, body: Mapping[str, Any], exchange: Exchange
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the provider's chunks (dicts), in batches of one read each; fill `exchange`.

        Batches let callers write what arrived together in one go (a write to a socket costs
        more than the chunks in it). Raises a typed ProviderError; nothing is yielded before
        the first chunk with content, so a failure before it leaves the caller free to try
        elsewhere.
        """
        loop = asyncio.get_running_loop()
        limits = provider.timeouts
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if provider.api_key:
            headers["Authorization"] = f"Bearer {provider.api_key}"
        started = loop.time()
        response: Response | None = None
        peer = Peer()
        parser = _Lines(provider, exchange, peer)
        clean = False
        pool = self._builtin_pool if provider.builtin else self._pool
        try:
            try:
                async with asyncio.timeout(limits.ttft_s):
                    response = await pool.post(
                        target_of(provider.base_url.rstrip("/") + "/chat/completions"),
                        headers,
                        _encode(body),
                        connect_timeout_s=limits.connect_s,
                        peer=peer,
                    )
                    if response.status != 200:
                        raise await _refusal(provider, response, parser)
                    opening = await parser.until_content(response)
                exchange.ttft_s = loop.time() - started if parser.saw_content else None
                if not parser.saw_content:
                    parser.raise_pending()
            except TimeoutError:
                raise failure(
                    ProviderTimeout,
                    "ttft-timeout",
                    f"provider {provider.name!r} sent no content within {limits.ttft_s:g} s",
                ) from None
            if opening:
                yield opening
            parser.raise_pending()
            idle = _IdleWatch(loop, limits.idle_s, response)
            try:
                while not parser.ended:
                    idle.waiting_since = loop.time()
                    try:
                        data = await response.read_some()
                    except _Idle:
                        raise failure(
                            ProviderTimeout,
                            "idle-timeout",
                            f"provider {provider.name!r} sent nothing for {limits.idle_s:g} s "
                            "between chunks",
                        ) from None
                    idle.waiting_since = None
                    if not data:
                        break
                    batch = parser.feed(data)
                    if batch:
                        yield batch
                    parser.raise_pending()
            finally:
                idle.stop()
            if not parser.saw_content and exchange.finish_reason is None:
                raise failure(
                    ProviderError,
                    "empty-stream",
                    f"provider {provider.name!r} ended the stream before any content",
                    transient=True,
                )
            if exchange.finish_reason is None:
                raise failure(
                    ProviderError,
                    "no-finish",
                    f"provider {provider.name!r} ended the stream without a finish reason",
                    transient=True,
                )
            clean = True
        except ProviderError as err:
            if peer.public is False and not parser.valid:
                raise _alike(provider, err) from None
            raise
        except OSError as err:
            stage = "connect" if response is None else "connection-lost"
            lost = failure(
                ProviderError,
                stage,
                f"provider {provider.name!r} "
                + ("could not be reached" if response is None else "dropped the stream")
                + f" ({type(err).__name__})",
                transient=True,
            )
            raise (
                _alike(provider, lost) if peer.public is False and not parser.valid else lost
            ) from None
        except OutboundRefused as err:
            log.warning("provider %r refused by the outbound guard: %s", provider.name, err.detail)
            raise failure(
                ProviderError,
                "outbound-refused",
                f"provider {provider.name!r} is at a non-public address, which this server "
                f"does not call unless {SETTING} names it",
            ) from None
        finally:
            if response is not None:
                # An unfinished response closes its connection (and the upstream request).
                if clean:
                    response.release()
                else:
                    response.close()


class _Idle(Exception):
    """Raised into a read that waited longer than the provider's idle limit."""


class _IdleWatch:
    """The idle limit between chunks, for the price of a clock read per chunk.

    A timer per read (what `asyncio.timeout` would arm) costs more than the rest of relaying
    the chunk. Instead one timer per stream wakes at the earliest moment the limit could be
    over, and either fails the waiting read or sleeps until the next such moment. Only time
    spent waiting for the provider counts: a caller slow to take the chunks is not the
    provider's idleness.
    """

    __slots__ = ("_handle", "_limit", "_loop", "_response", "waiting_since")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: float, response: Response) -> None:
        self._loop = loop
        self._limit = limit
        self._response = response
        self.waiting_since: float | None = None
        self._handle = loop.call_later(limit, self._check)

    def _check(self) -> None:
        since = self.waiting_since
        now = self._loop.time()
        if since is not None and now - since >= self._limit:
            self._response.fail(_Idle())
            return
        wake = (since if since is not None else now) + self._limit
        self._handle = self._loop.call_at(wake, self._check)

    def stop(self) -> None:
        """The stream is over: no more checks."""
        self._handle.cancel()


class _Lines:
    """An SSE reader for one response: splits lines, parses `data:` chunks, notes metadata."""

    __slots__ = (
        "_exchange",
        "_peer",
        "_provider",
        "_rest",
        "ended",
        "error",
        "saw_content",
        "valid",
    )

    def __init__(self, provider: Provider, exchange: Exchange, peer: Peer | None = None) -> None:
        self._provider = provider
        self._exchange = exchange
        self._peer = Peer() if peer is None else peer
        self._rest = b""
        self.ended = False
        self.saw_content = False
        # The provider answered as an OpenAI-compatible one does (a chunk, or an error object).
        self.valid = False
        # A failure found in a read is raised after the chunks before it were handed on.
        self.error: ProviderError | None = None

    def raise_pending(self) -> None:
        """Raise the failure the last read ended with, if any."""
        if self.error is not None:
            raise self.error

    async def until_content(self, response: Response) -> list[dict[str, Any]]:
        """Read until a chunk with content arrives (or the stream ends); return the chunks."""
        chunks: list[dict[str, Any]] = []
        while not self.saw_content and not self.ended and self.error is None:
            data = await response.read_some()
            if not data:
                self.ended = True
                break
            chunks += self.feed(data)
        return chunks

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The chunks completed by `data`."""
        if self._rest:
            data = self._rest + data
        lines = data.split(_NEWLINE)
        self._rest = lines.pop()
        out: list[dict[str, Any]] = []
        for line in lines:
            if not line.startswith(_DATA):
                continue
            payload = line[len(_DATA) :].strip()
            if payload == _DONE:
                self.ended = True
                break
            if payload:
                try:
                    chunk = self._chunk(payload)
                except ProviderError as err:
                    self.error = err
                    self.ended = True
                    break
                if chunk is not None:
                    out.append(chunk)
        return out

    def _chunk(self, payload: bytes) -> dict[str, Any] | None:
        name = self._provider.name
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise failure(
                ProviderError,
                "bad-chunk",
                f"provider {name!r} sent a malformed stream chunk",
                transient=True,
            ) from None
        if not isinstance(chunk, dict):
            raise failure(
                ProviderError,
                "bad-chunk",
                f"provider {name!r} sent a malformed stream chunk",
                transient=True,
            )
        self.valid = True
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            said = self.clean(str(message or "unknown"))
            raise failure(
                ProviderError,
                "stream-error",
                f"provider {name!r} reported an error mid-stream" + (f": {said}" if said else ""),
                transient=True,
            )
        exchange = self._exchange
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            exchange.input_tokens = _count(usage.get("prompt_tokens"))
            exchange.output_tokens = _count(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                exchange.cached_input_tokens = _count(details.get("cached_tokens"))
        if exchange.model is None and isinstance(chunk.get("model"), str):
            exchange.model = chunk["model"]
        choices = chunk.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            choice = choices[0]
            reason = choice.get("finish_reason")
            if reason:
                exchange.finish_reason = str(reason)
            delta = choice.get("delta")
            if isinstance(delta, dict) and (
                delta.get("content") or delta.get("tool_calls") or delta.get("refusal")
            ):
                exchange.content_chunks += 1
                self.saw_content = True
                return chunk
            return chunk if reason else None
        return chunk if usage else None

    def clean(self, message: str) -> str:
        """The provider's own message as callers may see it: none from a non-public address
        (an internal service's text is not for callers), else short and without its key."""
        if self._peer.public is False:
            return ""
        key = self._provider.api_key
        return scrub(message, (key,) if key else ())[:_MESSAGE_CHARS]


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _retry_after(response: Response) -> float | None:
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None  # an HTTP date: treat as long
    return seconds if seconds >= 0 else None


async def _refusal(provider: Provider, response: Response, parser: _Lines) -> ProviderError:
    """The typed error for a non-200 answer, with a short, secret-free message."""
    status = response.status
    message, code = "", ""
    try:
        body = orjson.loads(await response.read(_ERROR_BODY_BYTES))
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            parser.valid = True  # an OpenAI-style error object
            message = str(error.get("message") or "")
            code = str(error.get("code") or error.get("type") or "")
    except (orjson.JSONDecodeError, OSError):
        pass
    message = parser.clean(message)
    detail = f"provider {provider.name!r} answered HTTP {status}" + (
        f": {message}" if message else ""
    )
    reason = f"http-{status}"
    if status == 402 or code in _QUOTA_CODES:
        return failure(ProviderSpendLimit, "spend-limit", detail)
    if status in (401, 403):
        return failure(ProviderAuth, reason, detail)
    if status in _TRANSIENT_STATUSES:
        return failure(
            ProviderError, reason, detail, transient=True, retry_after=_retry_after(response)
        )
    if 400 <= status < 500:
        return failure(ProviderRejected, reason, detail)
    return failure(ProviderError, reason, detail, transient=True)


def _alike(provider: Provider, err: ProviderError) -> ProviderError:
    """The one error callers see for any failure of a non-public provider that has not
    answered as an OpenAI-compatible one (the real one goes to the server log)."""
    log.warning(
        "provider %r at a non-public address failed (%s): %s", provider.name, err.reason, err.detail
    )
    return failure(
        ProviderError,
        "failed",
        f"provider {provider.name!r} failed; it is at a non-public address, whose errors are "
        "not shown (the server log has them)",
        transient=True,
    )


def _encode(body: Mapping[str, Any]) -> bytes:
    """The request body as JSON. A relay caller's own fields pass through as given, and
    orjson writes integers of 64 bits at most: a larger one (found by fuzzing) goes out through
    the standard encoder instead of failing the call with a 500."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()
