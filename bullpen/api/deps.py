"""Request dependencies: services, the caller, content-type checks."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bullpen.app import Services
from bullpen.domain.principal import Principal
from bullpen.errors import Unauthenticated, UnsupportedMediaType

SESSION_COOKIE = "bullpen_session"

bearer = HTTPBearer(auto_error=False, description="A Bullpen API key (`bp_…`)")


def services(request: Request) -> Services:
    """The process's services (built by the lifespan)."""
    svc: Services = request.app.state.services
    return svc


ServicesDep = Annotated[Services, Depends(services)]


async def api_key_principal(
    svc: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller of a mutating API route: API keys only (cookies cannot trigger writes)."""
    if credentials is None:
        raise Unauthenticated("send `Authorization: Bearer <api key>`")
    return await svc.auth.authenticate_key(credentials.credentials)


async def read_principal(
    request: Request,
    svc: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller of a read-only route: an API key, or the signed-in browser session."""
    if credentials is not None:
        return await svc.auth.authenticate_key(credentials.credentials)
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        return (await svc.auth.authenticate_session(session_id)).principal
    raise Unauthenticated("send `Authorization: Bearer <api key>` or sign in")


def require_json(request: Request) -> None:
    """Refuse bodies that are not JSON with 415."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaType("send the body as `Content-Type: application/json`")


WriterDep = Annotated[Principal, Depends(api_key_principal)]
ReaderDep = Annotated[Principal, Depends(read_principal)]
