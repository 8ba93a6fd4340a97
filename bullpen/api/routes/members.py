"""/api/v1/members."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/v1/members", tags=["members"])
