"""Health and metrics."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Request, Response, Security
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from bullpen.api import docs
from bullpen.api.deps import ServicesDep, authenticate, bearer, session_cookie
from bullpen.errors import Forbidden

router = APIRouter(tags=["system"])

# Swagger UI from the vendored swagger-ui-dist (bullpen/web/static/vendor/swagger-ui), started
# by a script of this origin: FastAPI's own page loads it from a CDN with an inline script, both
# of which Bullpen's Content-Security-Policy refuses.
DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Bullpen API</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/vendor/swagger-ui/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/static/vendor/swagger-ui/swagger-ui-bundle.js"></script>
<script src="/static/docs.js"></script>
</body>
</html>
"""


@router.get("/healthz", summary="Liveness and database reachability")
async def healthz(svc: ServicesDep) -> dict[str, str]:
    """200 when the process serves and the database answers (else 503 problem+json)."""
    async with svc.store.read() as conn:
        await conn.execute(text("SELECT 1"))
    return {"status": "ok", "database": svc.store.dialect}


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses=docs.problems(401, 403, 429, 503),
)
async def metrics(
    request: Request,
    svc: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    session_id: Annotated[str | None, Security(session_cookie)],
) -> Response:
    """Process, pool, stream and worker gauges in Prometheus text format.

    For an instance admin, or for `Authorization: Bearer <BULLPEN_METRICS_TOKEN>` (what
    Prometheus sends: `authorization: {credentials: …}` in its scrape config). Gateway series
    are labelled by provider id, never by a workspace's own provider names.
    """
    token = svc.settings.metrics_token
    if not (
        token is not None
        and credentials is not None
        and hmac.compare_digest(credentials.credentials.encode(), token.get_secret_value().encode())
    ):
        principal = await authenticate(request, svc, credentials, session_id)
        if not principal.is_instance_admin:
            raise Forbidden("only an instance admin, or the metrics token, may read metrics")
    return Response(generate_latest(svc.metrics), media_type=CONTENT_TYPE_LATEST)


@router.get("/docs", include_in_schema=False)
async def api_docs() -> HTMLResponse:
    """The interactive API reference (Swagger UI, served from this origin)."""
    return HTMLResponse(DOCS_PAGE)
