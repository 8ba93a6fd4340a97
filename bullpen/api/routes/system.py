"""Health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from bullpen.api.deps import ServicesDep

router = APIRouter(tags=["system"])


@router.get("/healthz", summary="Liveness and database reachability")
async def healthz(svc: ServicesDep) -> dict[str, str]:
    """200 when the process serves and the database answers (else 503 problem+json)."""
    async with svc.store.read() as conn:
        await conn.execute(text("SELECT 1"))
    return {"status": "ok", "database": svc.store.dialect}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(svc: ServicesDep) -> Response:
    """Process, pool, stream and worker gauges in Prometheus text format."""
    return Response(generate_latest(svc.metrics), media_type=CONTENT_TYPE_LATEST)
