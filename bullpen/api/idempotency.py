"""`Idempotency-Key` for POSTs (IETF httpapi idempotency-key draft).

A key is scoped to (workspace, caller, method and path). The request's fingerprint (a hash of
its canonical JSON body) and its outcome are stored in the *same transaction* as the rows the
request creates, so a crash before commit leaves nothing behind and the key can simply be
retried.

The key is checked when the outcome is stored, not before the operation: a first use (nearly
every keyed request) costs one statement, the insert of its outcome. A request whose key has
an outcome already has its own work rolled back and answers with the stored one: the stored
status and body with `Idempotent-Replayed: true`, or 422 if the body differs. A duplicate sent
while the first is still in flight waits for it (PostgreSQL: the insert of the key waits for
the transaction holding it; SQLite: one writer at a time), then gets its replay. Successes and
4xx outcomes of the operation itself are stored; 401/403/409/429 and 5xx are not, so the key
stays usable. Outcomes expire after `BULLPEN_IDEMPOTENCY_TTL_S` (24 h); an expired one is
replaced by the next use's.
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

from bullpen.api import problems
from bullpen.api.deps import ServicesDep
from bullpen.api.problems import Replayed
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

    @asynccontextmanager
    async def begin(
        self, principal: Principal, *, turn: Hashable | None = None
    ) -> AsyncIterator[IdempotentWrite]:
        """Open the write transaction for the operation; with a key, its outcome is stored in
        it. `turn` is the transaction's `Store.write` key.

        Raises `Replayed` in place of the operation's answer when the key has a stored outcome
        already: the operation's work is rolled back and the stored outcome answers.
        """
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
        scope = keys.Scope(principal.workspace_id, principal.scope_id, self._route, self._key)
        fingerprint = hashlib.sha256(_canonical(await self._body())).digest()
        try:
            async with self._svc.store.write(turn=turn) as conn:
                yield self
                if self._outcome is not None:
                    if not await self._store(conn, scope, fingerprint, self._outcome):
                        raise _Taken  # roll back: the key's first outcome stands
        except _Taken:
            raise Replayed(await self._replay(scope, fingerprint)) from None
        except BullpenError as err:
            if not 400 <= err.status < 500:
                raise
            # The operation refused. A first outcome stored under the key answers instead
            # (this request repeated one that has since changed what the operation sees).
            if err.status in _NOT_STORED:
                stored = await self._stored(scope, fingerprint)
            else:
                response = problems.from_error(err, self._instance)
                outcome = _Outcome(err.status, {}, bytes(response.body))
                async with self._svc.store.write() as conn:
                    taken = not await self._store(conn, scope, fingerprint, outcome)
                stored = await self._replay(scope, fingerprint) if taken else None
            if stored is not None:
                raise Replayed(stored) from None
            raise

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

    async def _replay(self, scope: keys.Scope, fingerprint: bytes) -> Response:
        """The stored outcome that made this request's own one lose, as a replay."""
        stored = await self._stored(scope, fingerprint)
        if stored is None:  # expired and removed since: the key is free again
            raise _just_completed()
        return stored

    async def _stored(self, scope: keys.Scope, fingerprint: bytes) -> Response | None:
        """The replay of the key's stored outcome; None when it has none (or one expired).
        The same key with another request body is 422."""
        async with self._svc.store.read() as conn:
            row = await keys.find(conn, scope)
        if row is None or row.expires_at <= self._svc.clock():
            return None
        if row.fingerprint != fingerprint:
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
            row.body,
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


class _Taken(Exception):
    """The key has a stored outcome: this request's own one is rolled back."""


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
                f"(`{REPLAYED}: true`); another body is 422; a retry sent while the first is "
                "in progress waits for it, then replays it. Kept for 24 h."
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
