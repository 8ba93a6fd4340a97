"""/api/v1/workspaces."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/v1/workspaces", tags=["workspaces"])
