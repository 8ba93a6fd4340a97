"""/api/v1/agents."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/v1/agents", tags=["agents"])
