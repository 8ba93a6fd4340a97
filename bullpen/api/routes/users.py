"""/api/v1/users."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api/v1/users", tags=["users"])
