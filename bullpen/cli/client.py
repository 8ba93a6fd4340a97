"""A blocking JSON client for Bullpen's HTTP API, used by the command line: `request` raises,
`call` ends the command with `error: …` and exit 1.

BullpenError
├── InvalidInput       a malformed server URL or API key, caught before sending
├── ApiError           the server answered outside 2xx; carries the problem's `detail`, `type`
│                      and `http_status` (field problems in `errors`)
└── ServerUnreachable  no answer: refused, unknown host, timeout, connection dropped

The API key travels only in the Authorization header; no error message contains it. Redirects
are not followed, because urllib would resend the Authorization header to wherever they point.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from bullpen import __version__
from bullpen.cli.output import fail
from bullpen.errors import BullpenError, InvalidInput

__all__ = ["ApiError", "ServerUnreachable", "call", "request"]

_BLANK = "about:blank"
_TOKEN = re.compile(r"[\x21-\x7e]+")


class ApiError(BullpenError):
    """The server refused the request; `detail` and `type` come from its problem+json."""

    def __init__(
        self,
        detail: str,
        *,
        type: str = _BLANK,
        http_status: int,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail, errors=errors)
        self.type = type
        self.http_status = http_status


class ServerUnreachable(BullpenError):
    """No HTTP answer came back from the server."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx then surfaces as an HTTPError


def request(
    method: str,
    base_url: str,
    path: str,
    *,
    api_key: str,
    body: Any = None,
    idempotency_key: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """Send `body` as JSON with the bearer key; return (status, parsed body or None)."""
    where = _origin(base_url)
    if not _TOKEN.fullmatch(api_key):
        # Checked here: http.client would put the whole header, key and all, in its error.
        raise InvalidInput("the API key is empty or holds spaces or control characters")
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Accept": "application/json, application/problem+json",
        "User-Agent": f"bullpen-cli/{__version__}",
    }
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    req = urllib.request.Request(  # noqa: S310 - _origin admits http and https only
        base_url.rstrip("/") + path, data=data, headers=headers, method=method
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as resp:
            status: int = resp.status
            raw: bytes = resp.read()
    except urllib.error.HTTPError as err:
        with err:
            try:
                raw = err.read()
            except (OSError, http.client.HTTPException):
                raw = b""  # the status alone still says what happened
            raise _problem(err.code, raw, err.headers.get("Location")) from None
    except ValueError:  # http.client's InvalidURL, with the URL in its message
        raise InvalidInput("the server URL is not a valid URL") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, OSError) and reason.strerror:
            reason = reason.strerror  # without the "[Errno 111]" prefix
        raise ServerUnreachable(f"cannot reach the Bullpen server at {where}: {reason}") from exc
    if not raw:
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError:
        raise ApiError(
            f"the answer from {where} is not JSON; is it a Bullpen server?", http_status=status
        ) from None


def call(
    url: str, key: str, method: str, path: str, body: Any = None, *, create: bool = False
) -> Any:
    """One API request's parsed body; a refusal or an unreachable server ends the command with
    exit 1."""
    import uuid

    try:
        # A fresh Idempotency-Key per invocation: a retried POST cannot create twice.
        idem = str(uuid.uuid4()) if create else None
        return request(method, url, path, api_key=key, body=body, idempotency_key=idem)[1]
    except ApiError as err:
        hint = " (check --api-key or BULLPEN_API_KEY)" if err.http_status == 401 else ""
        fail(err.detail + hint, err.errors)
    except BullpenError as err:
        fail(err.detail, err.errors)


def _origin(base_url: str) -> str:
    """`scheme://host[:port]` of a valid server URL, for messages (no credentials or path)."""
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise InvalidInput("the server URL is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("the server URL must start with http:// or https:// and name a host")
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _problem(status: int, raw: bytes, location: str | None) -> ApiError:
    """The ApiError for a non-2xx answer, problem+json or not."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if 300 <= status < 400:
            detail = f"the server redirects (HTTP {status}) to {location}; use that URL instead"
        else:
            detail = f"the server answered HTTP {status} without a problem description"
        return ApiError(detail, http_status=status)
    detail = body.get("detail") or body.get("title") or f"HTTP {status}"
    errors = body.get("errors")
    return ApiError(
        str(detail),
        type=str(body.get("type") or _BLANK),
        http_status=status,
        errors=errors if isinstance(errors, list) else None,
    )
