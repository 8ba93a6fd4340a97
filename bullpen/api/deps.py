"""Request dependencies: services, the caller and what it may do, content-type checks.

Every `/api/v1` route takes its caller from `require(permission)` (or `instance_admin`), which
authenticates (API key, or session cookie plus CSRF proof on unsafe methods), applies the rate
limits, and refuses with 403 (audited) when the permission is missing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from bullpen.app import Services
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.errors import Forbidden, Unauthenticated, UnsupportedMediaType
from bullpen.services.agents import AgentService
from bullpen.services.api_keys import ApiKeyService
from bullpen.services.budgets import BudgetService
from bullpen.services.gateway import GatewayConfig
from bullpen.services.invitations import InvitationService
from bullpen.services.mcp_servers import McpService
from bullpen.services.routines import RoutineService
from bullpen.services.users import UserService
from bullpen.services.workspaces import WorkspaceService
from bullpen.store import audit

SESSION_COOKIE = "bullpen_session"
# Over https the cookie is `__Host-` prefixed: browsers then take it only with Secure, Path=/
# and no Domain, so a sibling host or a plain-http page cannot plant or shadow it. Plain http
# (localhost) keeps the bare name, which is the only one read there.
SECURE_SESSION_COOKIE = "__Host-" + SESSION_COOKIE
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAFE_SITES = frozenset({"same-origin", "none"})


def session_cookie_name(request: HTTPConnection) -> str:
    """The session cookie's name for this request: `__Host-` prefixed over https."""
    return SECURE_SESSION_COOKIE if request.url.scheme == "https" else SESSION_COOKIE


class SessionCookie(APIKeyCookie):
    """The session cookie under the name this request's scheme calls for."""

    async def __call__(self, request: HTTPConnection) -> str | None:
        return self.check_api_key(request.cookies.get(session_cookie_name(request)))


bearer = HTTPBearer(auto_error=False, description="A Bullpen API key (`bp_…`).")
session_cookie = SessionCookie(
    name=SESSION_COOKIE,
    auto_error=False,
    description=(
        f"The web UI's session (`{SECURE_SESSION_COOKIE}` when served over https). Unsafe "
        f"methods also need the session's CSRF token in `{CSRF_HEADER}` and must not be "
        "cross-site (Fetch Metadata)."
    ),
)
csrf_header = APIKeyHeader(
    name=CSRF_HEADER,
    auto_error=False,
    description="CSRF token of the session (shown in the UI), for cookie-authenticated writes.",
    scheme_name="CSRFToken",
)


def services_of(request: Request) -> Services:
    """The process's services (built by the lifespan)."""
    svc: Services = request.app.state.services
    return svc


# Dependencies are coroutines: FastAPI runs a plain `def` dependency in a worker thread, a
# thread hop on every request.
async def services(request: Request) -> Services:
    """The process's services, as a dependency."""
    return services_of(request)


ServicesDep = Annotated[Services, Depends(services)]


# The use-case services a route works through: built once by `app.build`, taken from the
# process's services (never constructed per request).
async def _agents(svc: ServicesDep) -> AgentService:
    return svc.agents


async def _api_keys(svc: ServicesDep) -> ApiKeyService:
    return svc.api_keys


async def _invitations(svc: ServicesDep) -> InvitationService:
    return svc.invitations


async def _workspaces(svc: ServicesDep) -> WorkspaceService:
    return svc.workspaces


async def _users(svc: ServicesDep) -> UserService:
    return svc.users


async def _routines(svc: ServicesDep) -> RoutineService:
    return svc.routines


async def _gateway_config(svc: ServicesDep) -> GatewayConfig:
    return svc.gateway_config


async def _budgets(svc: ServicesDep) -> BudgetService:
    return svc.budgets


async def _mcp_servers(svc: ServicesDep) -> McpService:
    return svc.mcp_servers


Agents = Annotated[AgentService, Depends(_agents)]
ApiKeys = Annotated[ApiKeyService, Depends(_api_keys)]
Invitations = Annotated[InvitationService, Depends(_invitations)]
Workspaces = Annotated[WorkspaceService, Depends(_workspaces)]
Users = Annotated[UserService, Depends(_users)]
Routines = Annotated[RoutineService, Depends(_routines)]
GatewayConfigs = Annotated[GatewayConfig, Depends(_gateway_config)]
Budgets = Annotated[BudgetService, Depends(_budgets)]
McpServers = Annotated[McpService, Depends(_mcp_servers)]


def check_same_site(request: Request) -> None:
    """Fetch Metadata: refuse cross-site state changes before anything else."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in SAFE_SITES:
        raise Forbidden("cross-site request refused")


async def authenticate(
    request: Request,
    svc: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    session_id: Annotated[str | None, Security(session_cookie)],
) -> Principal:
    """The caller: an API key, else the session cookie (with CSRF proof when unsafe)."""
    if credentials is not None:
        principal = await svc.auth.authenticate_key(credentials.credentials)
    elif session_id:
        principal = (await svc.auth.authenticate_session(session_id)).principal
        if request.method not in SAFE_METHODS:
            check_same_site(request)
            token = request.headers.get(CSRF_HEADER, "")
            if not svc.auth.check_csrf(session_id, token):
                raise Forbidden(f"missing or wrong CSRF token (send it in `{CSRF_HEADER}`)")
    else:
        raise Unauthenticated("send `Authorization: Bearer <api key>` or sign in")
    svc.limits.take(principal.scope_id, str(principal.workspace_id))
    request.state.principal = principal  # refusals (403) are audited against it
    return principal


async def caller_with(request: Request, svc: Services, permission: Permission) -> Principal:
    """What `require(permission)` gives a route, for a handler that resolves its own
    dependencies (the relay's hot path)."""
    principal = await authenticate(
        request, svc, await bearer(request), await session_cookie(request)
    )
    check_permission(principal, permission)
    return principal


def check_permission(principal: Principal, permission: Permission) -> None:
    """Refuse (403, audited) a caller without `permission`."""
    if not principal.can(permission):
        raise Forbidden(f"this needs the `{permission}` permission")


Caller = Annotated[Principal, Depends(authenticate)]


async def _signed_in(principal: Caller) -> Principal:
    return principal


_signed_in.bullpen_access = "authenticated"  # type: ignore[attr-defined]
authenticated: Any = Depends(_signed_in)
"""Any authenticated caller (routes about the caller itself)."""


def require(permission: Permission) -> Any:
    """A dependency giving the caller, refusing (403, audited) without `permission`."""

    async def dependency(principal: Caller) -> Principal:
        check_permission(principal, permission)
        return principal

    dependency.bullpen_access = str(permission)  # type: ignore[attr-defined]
    return Depends(dependency)


async def _instance_admin(principal: Caller) -> Principal:
    if not principal.is_instance_admin:
        raise Forbidden("only an instance admin may do this")
    return principal


_instance_admin.bullpen_access = "instance:admin"  # type: ignore[attr-defined]
instance_admin: Any = Depends(_instance_admin)


async def audit_denial(request: Request, reason: str) -> None:
    """Record a 403 given to an authenticated caller (in its own transaction: the refused
    request's work, if any, has rolled back)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        return  # refused before anyone was identified (e.g. a cross-site form post)
    data = {"method": request.method, "path": request.url.path, "reason": reason}
    await record_denial(services_of(request), principal, data)


async def record_denial(svc: Services, principal: Principal, data: dict[str, Any]) -> None:
    """Audit a refusal (`access.denied`) in its own transaction; `data` says what was refused."""
    async with svc.store.write() as conn:
        await audit.record_by(conn, principal, "access.denied", "route", None, svc.clock(), data)


async def require_json(request: Request) -> None:
    """Refuse bodies that are not JSON with 415."""
    check_json(request)


def check_json(request: Request) -> None:
    """Refuse bodies that are not JSON with 415."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise UnsupportedMediaType("send the body as `Content-Type: application/json`")


def access_of(route: Any) -> str | None:
    """The access a route declares (its `require`/`instance_admin` dependency), or None."""
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        declared = getattr(dependant.call, "bullpen_access", None)
        if declared is not None:
            return str(declared)
        stack.extend(dependant.dependencies)
    return None
