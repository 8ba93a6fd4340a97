"""The `http` adapter: a webhook agent, called with one signed POST per delivery of a run.

Request
    `POST <url>` with the run context as JSON (`RunContext.as_dict()`) and the headers
    `Content-Type: application/json`, `Accept: application/x-ndjson, text/event-stream,
    application/json`, `Bullpen-Run-Id`, `Bullpen-Timestamp` (unix seconds) and
    `Bullpen-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`. A receiver
    recomputes the signature over the raw body, compares it in constant time and refuses old
    timestamps. A run may be delivered more than once (retries), always with the same run id.
    With tracing on, a W3C `traceparent` (the run's span) lets a traced agent join the trace.

Answer, read as it streams
    `application/x-ndjson`: one JSON event per line. `text/event-stream`: one JSON event per
    SSE event's `data` (the SSE event name is ignored). `application/json`: a single event.

Events (other keys of an event are ignored)
    {"type": "text", "text": str}        output text, appended to the run's text
    {"type": "log", "message": str}      a `log` event of the run (source `webhook`)
    {"type": "result", "result": str}    the run's result; the answer is not read further
    {"type": "error", "error": str}      the run fails with this message (at most 2000
                                         characters); the answer is not read further
    Any other type fails the run, as a malformed event does: a typo in a type would otherwise
    drop output silently. Without a `result` event the result is the text; an answer that
    ends with neither text nor a result fails.

Failures (`WebhookFailed`, `WebhookTimeout`, `OutboundRefused`)
    Transient (the worker retries the run later) only while nothing has reached the run's
    events: no connection, a connect timeout, HTTP 429 or 5xx, a connection lost before the
    first event. Everything else is permanent: another HTTP status, an unexpected content
    type, an event over 1 MiB or an answer over 16 MiB, a malformed or unknown event, the
    agent's own `error`, a refused address, and running over `timeout_s` (the agent had its
    whole time; running it again would double its work and side effects, and its owner can
    raise `timeout_s`).

Redirects
    307 and 308 are followed, at most 5 times, re-sending the same signed request (the
    signature covers this one body and timestamp; it is not a standing credential). Every hop
    passes the outbound guard. Other redirects fail the run: set the final URL instead.

The signing secret is write-only: stored sealed (`SecretBox`, bound to the agent's id), shown
as a hint, and never written to events, errors or logs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any
from uuid import UUID

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
)
from yarl import URL

from bullpen.agents.base import NO_NUL, Events, RunContext, done, no_nul_secret
from bullpen.domain.events import EventKind
from bullpen.domain.runs import RunOutcome
from bullpen.domain.trace import TRACE_PARENT
from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.outbound import GuardedResolver, OutboundAllow, check_url
from bullpen.security.secrets import SecretBox, hint

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 3600.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
MAX_CONNECT_TIMEOUT_S = 60.0
MAX_EVENT_BYTES = 1 << 20
MAX_ANSWER_BYTES = 16 << 20
MAX_REDIRECTS = 5
ERROR_CHARS = 2000  # of the agent's own error message
STATUS_BODY_CHARS = 500  # of the body quoted in an HTTP status failure
URL_CHARS = 2048
SECRET_CHARS = (16, 512)

ACCEPT = "application/x-ndjson, text/event-stream, application/json"
_FOLLOWED = frozenset({307, 308})
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\s]+")
_PUBLIC_KEYS = ("url", "timeout_s", "connect_timeout_s", "secret_hint")


class WebhookFailed(BullpenError):
    """A webhook agent's call failed: its answer, its stream, or its own `error` event."""

    status = 502
    slug = "webhook-failed"
    title = "Webhook agent failed"


class WebhookTimeout(WebhookFailed):
    """A webhook agent did not finish within its `timeout_s`."""

    status = 504
    slug = "webhook-timeout"
    title = "Webhook agent timed out"


# http(s)://, a host without user name or password, then anything printable without spaces;
# `check_url` reads the rest.
_URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\x00-\x20\x7f/?#@]+([/?#][^\x00-\x20\x7f]*)?$"


# The signing secret: no NUL, which the config's `secret_hint` (stored in jsonb) could hold.
WebhookSecret = Annotated[SecretStr, AfterValidator(no_nul_secret)]


class HttpAgentConfig(BaseModel):
    """An `http` agent's configuration as the API accepts it; `secret` is write-only."""

    model_config = ConfigDict(extra="forbid")

    url: Annotated[
        str, StringConstraints(min_length=1, max_length=URL_CHARS, pattern=_URL_PATTERN)
    ] = Field(
        examples=["https://agents.example.com/hook"],
        description="The webhook, http:// or https://, without a user name or password. "
        "Private, loopback, link-local and other non-public addresses are refused unless "
        "the server's BULLPEN_OUTBOUND_ALLOW names them.",
    )
    secret: WebhookSecret | None = Field(
        default=None,
        min_length=SECRET_CHARS[0],
        max_length=SECRET_CHARS[1],
        json_schema_extra={"pattern": NO_NUL},
        description="The key of each request's HMAC-SHA256 signature (`Bullpen-Signature`), "
        "without NUL characters. Required when creating; leave it out when changing the "
        "config to keep the current one. Never shown again (the config shows `secret_hint`).",
    )
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        strict=True,
        description="The whole call, from connecting to the last event, in seconds.",
    )
    connect_timeout_s: float = Field(
        default=DEFAULT_CONNECT_TIMEOUT_S,
        gt=0,
        le=MAX_CONNECT_TIMEOUT_S,
        strict=True,
        description="Connecting to the webhook, in seconds (a failure here is retried later).",
    )


def secret_context(agent_id: UUID) -> bytes:
    """The associated data binding a sealed webhook secret to its agent."""
    return b"agent-webhook:" + agent_id.bytes


def stored_config(
    config: HttpAgentConfig,
    *,
    box: SecretBox,
    agent_id: UUID,
    allow: OutboundAllow,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config to store: url checked, secret sealed, or `previous`'s sealed secret kept.

    Raises InvalidInput or OutboundRefused for a url that may not be called, and InvalidInput
    when neither `config` nor `previous` has a secret.
    """
    check_url(config.url, allow)
    if config.secret is not None:
        plain = config.secret.get_secret_value()
        sealed = box.seal(plain, secret_context(agent_id))
        secret = {
            "secret_sealed": base64.b64encode(sealed).decode("ascii"),
            "secret_hint": hint(plain),
        }
    elif previous is not None and isinstance(previous.get("secret_sealed"), str):
        secret = {
            "secret_sealed": previous["secret_sealed"],
            "secret_hint": previous.get("secret_hint", ""),
        }
    else:
        raise InvalidInput(
            f"an http agent needs a `secret` ({SECRET_CHARS[0]} to {SECRET_CHARS[1]} "
            "characters) to sign its requests"
        )
    return {
        "url": config.url,
        "timeout_s": config.timeout_s,
        "connect_timeout_s": config.connect_timeout_s,
        **secret,
    }


def public_config(stored: Mapping[str, Any]) -> dict[str, Any]:
    """What the API shows of a stored config: everything but the sealed secret."""
    return {key: stored[key] for key in _PUBLIC_KEYS if key in stored}


class _Stored(BaseModel):
    """A stored config as the adapter reads it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str
    secret_sealed: str
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    connect_timeout_s: float = Field(
        default=DEFAULT_CONNECT_TIMEOUT_S, gt=0, le=MAX_CONNECT_TIMEOUT_S
    )

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> tuple[_Stored, bytes]:
        """The config and its sealed secret; a broken config is InvalidInput."""
        try:
            config = cls.model_validate(raw)
            return config, base64.b64decode(config.secret_sealed, validate=True)
        except ValidationError as err:
            fields = sorted({".".join(map(str, e["loc"])) for e in err.errors()})
            problem = f"wrong or missing {', '.join(fields)}"
        except binascii.Error:
            problem = "a damaged secret_sealed"
        raise InvalidInput(f"the agent's http config has {problem}; set its config again")


def _signed(secret: str, body: bytes, run_id: UUID, timestamp: int) -> dict[str, str]:
    signature = hmac.new(secret.encode(), b"%d." % timestamp + body, hashlib.sha256)
    return {
        "Content-Type": "application/json",
        "Accept": ACCEPT,
        "Bullpen-Run-Id": str(run_id),
        "Bullpen-Timestamp": str(timestamp),
        "Bullpen-Signature": "v1=" + signature.hexdigest(),
    }


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def _printable(raw: bytes, limit: int) -> str:
    """Upstream text made safe to quote in an error: one line, control characters gone."""
    return _UNPRINTABLE.sub(" ", raw.decode("utf-8", "replace")).strip()[:limit]


class _Decoder(ABC):
    """Cuts an answer into event payloads, refusing an event or answer over its limit."""

    def __init__(self, max_event: int, max_answer: int) -> None:
        self._max_event = max_event
        self._max_answer = max_answer
        self._total = 0
        # Grown in place: a line trickling in byte by byte costs no quadratic copying.
        self._rest = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads completed by this chunk of the answer."""
        self._total += len(chunk)
        if self._total > self._max_answer:
            raise WebhookFailed(f"the webhook's answer is over {_size(self._max_answer)}")
        lines = chunk.split(b"\n")
        self._rest += lines[0]
        if len(lines) > 1:
            lines[0] = bytes(self._rest)
            self._rest = bytearray(lines.pop())
        else:
            lines = []
        if len(self._rest) > self._max_event or any(len(x) > self._max_event for x in lines):
            raise self._too_long()
        return [p for p in map(self._line, lines) if p is not None]

    def end(self) -> list[bytes]:
        """The payloads left when the answer ends."""
        rest, self._rest = bytes(self._rest), bytearray()
        last = self._line(rest) if rest else None
        return [p for p in (last, self._close()) if p is not None]

    def _too_long(self) -> WebhookFailed:
        return WebhookFailed(f"an event of the webhook's answer is over {_size(self._max_event)}")

    @abstractmethod
    def _line(self, line: bytes) -> bytes | None:
        """The payload this line completes, if any."""

    def _close(self) -> bytes | None:
        return None


class _Ndjson(_Decoder):
    """One event per line; blank lines are skipped."""

    def _line(self, line: bytes) -> bytes | None:
        return line if line.strip() else None


class _Sse(_Decoder):
    """One event per SSE event's `data` lines; comments and other fields are skipped."""

    def __init__(self, max_event: int, max_answer: int) -> None:
        super().__init__(max_event, max_answer)
        self._data: list[bytes] = []
        self._size = 0

    def _line(self, line: bytes) -> bytes | None:
        line = line.removesuffix(b"\r")
        if not line:
            return self._close()
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value.removeprefix(b" ")
            self._size += len(value) + 1
            if self._size > self._max_event:
                raise self._too_long()
            self._data.append(value)
        return None

    def _close(self) -> bytes | None:
        data, self._data, self._size = self._data, [], 0
        return b"\n".join(data) if data else None


class _Json(_Decoder):
    """The whole answer is one event."""

    def __init__(self, max_event: int, max_answer: int) -> None:
        super().__init__(max_event, min(max_event, max_answer))
        self._lines: list[bytes] = []

    def _line(self, line: bytes) -> None:
        self._lines.append(line)

    def _close(self) -> bytes | None:
        body = b"\n".join(self._lines)
        return body if body.strip() else None


_DECODERS: dict[str, type[_Decoder]] = {
    "application/x-ndjson": _Ndjson,
    "text/event-stream": _Sse,
    "application/json": _Json,
}


class _Answer:
    """One delivery's answer: its events go to the run's sink, its text is kept."""

    def __init__(self, events: Events) -> None:
        self._events = events
        self._text: list[str] = []
        self._seen = 0
        self.delivered = False  # whether anything reached the run's events

    def take(self, payloads: list[bytes]) -> str | None:
        """Apply the payloads in order; the result, once an event gives it."""
        for payload in payloads:
            result = self._apply(payload)
            if result is not None:
                return result
        return None

    def ended(self) -> str:
        """The result of an answer that ended without a `result` event."""
        if not self._text:
            raise WebhookFailed(
                "the webhook's answer ended without a result (no `result` or `text` event)"
            )
        return "".join(self._text)

    def _apply(self, payload: bytes) -> str | None:
        self._seen += 1
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise WebhookFailed(f"event {self._seen} of the webhook's answer is not JSON") from None
        kind = event.get("type") if isinstance(event, dict) else None
        if not isinstance(kind, str):
            raise WebhookFailed(
                f"event {self._seen} of the webhook's answer is not an object with a `type`"
            )
        if kind == "text":
            text = self._field(event, "text")
            if text:
                self.delivered = True
                self._text.append(text)
                self._events.text(text)
            return None
        if kind == "log":
            message = self._field(event, "message")
            self.delivered = True
            self._events.emit(EventKind.LOG, {"message": message, "source": "webhook"})
            return None
        if kind == "result":
            return self._field(event, "result")
        if kind == "error":
            message = self._field(event, "error")[:ERROR_CHARS]
            raise WebhookFailed(message or "the webhook agent reported an error")
        raise WebhookFailed(
            f"event {self._seen} of the webhook's answer has the unknown type {kind[:40]!r} "
            "(expected text, log, result or error)"
        )

    def _field(self, event: dict[str, Any], name: str) -> str:
        value = event.get(name)
        if not isinstance(value, str):
            raise WebhookFailed(
                f"event {self._seen} of the webhook's answer ({event['type']}) needs a string "
                f"`{name}`"
            )
        return value


async def _refusal(response: aiohttp.ClientResponse) -> WebhookFailed:
    """The failure for a non-2xx answer, quoting the start of its body."""
    status = response.status
    quoted = _printable(await response.content.read(4 * STATUS_BODY_CHARS), STATUS_BODY_CHARS)
    detail = f"the webhook answered HTTP {status}" + (f": {quoted}" if quoted else "")
    if 300 <= status < 400:
        detail += " (only 307 and 308 redirects are followed: set the final url)"
    return WebhookFailed(detail, transient=status == 429 or status >= 500)


def _next_hop(response: aiohttp.ClientResponse) -> URL:
    location = response.headers.get("Location")
    if not location:
        raise WebhookFailed(f"the webhook answered HTTP {response.status} without a Location")
    try:
        return response.url.join(URL(location))
    except ValueError:
        raise WebhookFailed("the webhook redirected to an invalid URL") from None


class HttpAdapter:
    """Runs `http` agents; one pooled aiohttp session, guarded against SSRF, for all runs.

    `resolver` does the DNS lookups behind the guard (aiohttp's default when None).
    """

    def __init__(
        self,
        box: SecretBox,
        allow: OutboundAllow,
        *,
        resolver: AbstractResolver | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self._box = box
        self._allow = allow
        self._resolver = resolver
        self._max_event = max_event_bytes
        self._max_answer = max_answer_bytes
        self._session: aiohttp.ClientSession | None = None
        self._guard: GuardedResolver | None = None

    async def __aenter__(self) -> HttpAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session and its connections."""
        session, guard, self._session, self._guard = self._session, self._guard, None, None
        if session is not None:
            await session.close()
        if guard is not None:
            await guard.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._guard = GuardedResolver(self._allow, self._resolver)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=self._guard, limit=0),
                timeout=aiohttp.ClientTimeout(total=None),
                # No proxy from the environment (it would connect instead of the guarded
                # target) and no cookies carried between agents.
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def run(self, ctx: RunContext) -> RunOutcome:
        """POST the signed run context; stream the answer's events into `ctx.events`."""
        config, sealed = _Stored.read(ctx.run.agent_config)
        secret = self._box.open(sealed, secret_context(ctx.run.agent_id))
        body = orjson.dumps(ctx.as_dict())
        headers = _signed(secret, body, ctx.run.id, int(time.time()))
        if (parent := TRACE_PARENT.get()) is not None:  # tracing: the agent joins the trace
            headers["traceparent"] = parent
        answer = _Answer(ctx.events)
        try:
            async with asyncio.timeout(config.timeout_s):
                result = await self._deliver(config, body, headers, answer)
        except TimeoutError:
            raise WebhookTimeout(
                f"the webhook agent did not finish within {config.timeout_s:g} s (its timeout_s)"
            ) from None
        return done(result)

    async def _deliver(
        self, config: _Stored, body: bytes, headers: dict[str, str], answer: _Answer
    ) -> str:
        url = URL(config.url)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
        for _ in range(MAX_REDIRECTS + 1):
            url = check_url(url, self._allow)
            try:
                response = await self._client().post(
                    url, data=body, headers=headers, allow_redirects=False, timeout=timeout
                )
            except aiohttp.ClientError as exc:
                raise _unreachable(url, exc, config) from exc
            try:
                if response.status in _FOLLOWED:
                    url = _next_hop(response)
                    continue
                return await self._read(response, answer)
            except aiohttp.ClientError as exc:
                raise WebhookFailed(
                    f"the connection to the webhook at {url.host} broke: {_reason(exc)}",
                    transient=not answer.delivered,
                ) from exc
            finally:
                # Never back to the pool half read; on cancellation this ends the upstream call.
                response.close()
        raise WebhookFailed(f"the webhook redirected more than {MAX_REDIRECTS} times")

    async def _read(self, response: aiohttp.ClientResponse, answer: _Answer) -> str:
        if not 200 <= response.status < 300:
            raise await _refusal(response)
        decoder_type = _DECODERS.get(response.content_type)
        if decoder_type is None:
            raise WebhookFailed(
                f"the webhook answered with Content-Type {response.content_type[:100]!r}; "
                f"expected one of {ACCEPT}"
            )
        decoder = decoder_type(self._max_event, self._max_answer)
        async for chunk in response.content.iter_any():
            result = answer.take(decoder.feed(chunk))
            if result is not None:
                return result
        result = answer.take(decoder.end())
        return answer.ended() if result is None else result


def _reason(exc: aiohttp.ClientError) -> str:
    return _printable(str(exc).encode(), 300) or type(exc).__name__


def _unreachable(url: URL, exc: aiohttp.ClientError, config: _Stored) -> WebhookFailed:
    """A failure to connect: worth retrying, unless TLS or the URL itself is the problem."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return WebhookFailed(
            f"could not connect to the webhook at {url.host} within {config.connect_timeout_s:g} s",
            transient=True,
        )
    permanent = isinstance(exc, aiohttp.ClientSSLError | aiohttp.InvalidURL)
    return WebhookFailed(
        f"could not reach the webhook at {url.host}: {_reason(exc)}", transient=not permanent
    )
