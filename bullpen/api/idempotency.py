"""`Idempotency-Key` for POSTs (IETF httpapi idempotency-key draft).

A key is scoped to (workspace, caller, method and path). The request's fingerprint (a hash of
its canonical JSON body) and its outcome are stored in the *same transaction* as the rows the
request creates, so a crash before commit leaves nothing behind and the key can simply be
retried. While the first request holds the key (a PostgreSQL advisory lock; SQLite's single
writer serialises anyway), a duplicate gets 409 with `Retry-After`. Replays return the stored
status and body with `Idempotent-Replayed: true`; the same key with another body is 422.
Successes and 4xx outcomes of the operation itself are stored; 401/403/409/429 and 5xx are not,
so the key stays usable. Outcomes expire after `BULLPEN_IDEMPOTENCY_TTL_S` (24 h).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

import orjson
from fastapi import Depends, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy import exc as sa_exc

from bullpen.api import problems
from bullpen.api.deps import ServicesDep
from bullpen.app import Services
from bullpen.domain.principal import NO_WORKSPACE, Principal
from bullpen.errors import (
    BadRequest,
    BullpenError,
    Conflict,
    IdempotencyKeyInUse,
    IdempotencyKeyMismatch,
)
from bullpen.store import idempotency as keys

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
KEY_MAX = 255
_KEY = re.compile(r"[\x20-\x7e]{1,255}")
_NOT_STORED = frozenset({401, 403, 408, 409, 425, 429})
_REPLAY_HEADERS = ("location",)


@dataclass
class _Outcome:
    status: int
    headers: dict[str, str]
    body: bytes


class IdempotentWrite:
    """One write request's transaction; replays or records its outcome when a key was sent."""

    def __init__(
        self,
        svc: Services,
        key: str | None,
        *,
        route: str,
        body: Callable[[], Awaitable[bytes]],
        instance: str,
    ) -> None:
        self._svc = svc
        self._key = key
        self._route = route  # what the key is scoped to besides the caller: "POST /api/v1/tasks"
        self._body = body  # the request as sent, fingerprinted as canonical JSON
        self._instance = instance  # a stored problem's `instance`
        self._outcome: _Outcome | None = None
        self._operating = False  # errors from here on are the operation's own outcome
        self.replayed: Response | None = None

    @asynccontextmanager
    async def begin(
        self, principal: Principal, *, turn: Hashable | None = None
    ) -> AsyncIterator[IdempotentWrite]:
        """Open the write transaction; `replayed` is set when a stored outcome answers.
        `turn` is the transaction's `Store.write` key."""
        if self._key is None:
            async with self._svc.store.write(turn=turn):
                yield self
            return
        if principal.workspace_id == NO_WORKSPACE:
            # Keys are stored per workspace (issue 19, finding 10: a user in none yet).
            raise Conflict(
                "`Idempotency-Key` needs a workspace to act in: accept an invitation and switch "
                "to it first, or send the request without the header"
            )
        scope = keys.Scope(
            principal.workspace_id,
            principal.scope_id,
            self._route,
            self._key,
        )
        fingerprint = hashlib.sha256(_canonical(await self._body())).digest()
        try:
            async with self._svc.store.write(turn=turn) as conn:
                locked, row = await keys.claim(conn, scope, self._svc.store.dialect)
                if not locked:
                    raise IdempotencyKeyInUse(
                        "a request with this Idempotency-Key is still in progress",
                        retry_after=1,
                    )
                self.replayed = await self._replay(conn, scope, row, fingerprint)
                self._operating = self.replayed is None
                yield self
                if self.replayed is None and self._outcome is not None:
                    if not await self._store(conn, scope, fingerprint, self._outcome):
                        self._operating = False  # roll back: the first request's outcome stands
                        raise _just_completed()
        except BullpenError as err:
            if self._operating and 400 <= err.status < 500 and err.status not in _NOT_STORED:
                response = problems.from_error(err, self._instance)
                outcome = _Outcome(err.status, {}, bytes(response.body))
                async with self._svc.store.write() as conn:
                    await self._store(conn, scope, fingerprint, outcome)
            raise
        except sa_exc.IntegrityError as err:  # a concurrent first use won the insert
            raise _just_completed() from err

    def respond(
        self,
        status: int,
        body: BaseModel,
        *,
        location: str | None = None,
        stored: BaseModel | None = None,
    ) -> Response:
        """The response to send; with a key, it is stored when the transaction commits.

        `stored` replaces the body kept for replays when the response carries a secret that
        must not be stored (a new API key): replays then show it redacted.
        """
        payload = body.model_dump_json().encode()
        headers = {"Location": location} if location else {}
        kept = stored.model_dump_json().encode() if stored is not None else payload
        self._outcome = _Outcome(status, headers, kept)
        return Response(payload, status_code=status, media_type="application/json", headers=headers)

    async def _replay(
        self, conn: Any, scope: keys.Scope, row: Any | None, fingerprint: bytes
    ) -> Response | None:
        if row is None:
            return None
        if row.expires_at <= self._svc.clock():
            await keys.forget(conn, scope)
            return None
        if bytes(row.fingerprint) != fingerprint:
            raise IdempotencyKeyMismatch(
                "this Idempotency-Key was already used with a different request body",
                errors=[
                    {
                        "location": "header",
                        "field": HEADER,
                        "message": "reused with a different request",
                        "code": "idempotency_key_mismatch",
                    }
                ],
            )
        media = "application/json" if row.status_code < 400 else problems.MEDIA_TYPE
        return Response(
            bytes(row.body),
            status_code=row.status_code,
            media_type=media,
            headers={**row.headers, REPLAYED: "true"},
        )

    async def _store(
        self, conn: Any, scope: keys.Scope, fingerprint: bytes, outcome: _Outcome
    ) -> bool:
        now = self._svc.clock()
        return await keys.store(
            conn,
            scope,
            dialect=self._svc.store.dialect,
            fingerprint=fingerprint,
            status_code=outcome.status,
            headers={k: v for k, v in outcome.headers.items() if k.lower() in _REPLAY_HEADERS},
            body=outcome.body,
            now=now,
            expires_at=now + timedelta(seconds=self._svc.settings.idempotency_ttl_s),
        )


def _just_completed() -> IdempotencyKeyInUse:
    return IdempotencyKeyInUse(
        "a request with this Idempotency-Key was just completed; retry to replay it",
        retry_after=1,
    )


def _canonical(body: bytes) -> bytes:
    if not body:
        return b""
    try:
        return orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        return body


async def idempotent_write(
    request: Request,
    svc: ServicesDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            description=(
                "Makes this POST safe to retry: 1–255 printable ASCII characters, unique per "
                "request. A retry with the same key and body replays the first outcome "
                f"(`{REPLAYED}: true`); another body is 422; while the first is in progress, "
                "409 with `Retry-After`. Kept for 24 h."
            ),
            json_schema_extra={"minLength": 1, "maxLength": KEY_MAX, "pattern": "^[ -~]+$"},
        ),
    ] = None,
) -> IdempotentWrite:
    """The request's write transaction, with its validated Idempotency-Key if any."""
    return write_of(request, svc, idempotency_key)


def write_of(request: Request, svc: Services, idempotency_key: str | None) -> IdempotentWrite:
    """What `idempotent_write` gives a route, for a handler that resolves its own
    dependencies."""
    check_key(idempotency_key)
    return IdempotentWrite(
        svc,
        idempotency_key,
        route=f"{request.method} {request.url.path}",
        body=request.body,
        instance=request.url.path,
    )


def check_key(idempotency_key: str | None) -> None:
    """Refuse (400) a key that is not 1–255 printable ASCII characters."""
    if idempotency_key is not None and not _KEY.fullmatch(idempotency_key):
        raise BadRequest(
            f"{HEADER} must be 1–{KEY_MAX} printable ASCII characters",
            errors=[
                {
                    "location": "header",
                    "field": HEADER,
                    "message": f"1–{KEY_MAX} printable ASCII characters",
                    "code": "idempotency_key",
                }
            ],
        )


Idempotent = Annotated[IdempotentWrite, Depends(idempotent_write)]
