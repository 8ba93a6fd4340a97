"""/api/v1/api-keys."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/v1/api-keys", tags=["api-keys"])
