"""Bullpen's one error tree; HTTP mapping happens only in `bullpen.api.problems`.

BullpenError
├── InvalidInput          422  a field or value is wrong
├── Unauthenticated       401  no or bad credentials
├── Forbidden             403  authenticated, not allowed
├── NotFound              404  missing, or another workspace's
├── Conflict              409  state does not allow it
├── PayloadTooLarge       413
├── UnsupportedMediaType  415
├── Unavailable           503  a dependency (database) is away
└── ProviderError         502  an LLM provider call failed
"""

from __future__ import annotations

from typing import Any, ClassVar


class BullpenError(Exception):
    """Root of every error Bullpen raises on purpose."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        retry_after: float | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.errors = errors


class InvalidInput(BullpenError):
    """A request field or value is not acceptable."""

    status = 422
    slug = "validation"
    title = "Invalid request"


class Unauthenticated(BullpenError):
    """Credentials are missing, unknown, revoked or expired."""

    status = 401
    slug = "unauthenticated"
    title = "Authentication required"


class Forbidden(BullpenError):
    """The caller is known but may not do this."""

    status = 403
    slug = "forbidden"
    title = "Forbidden"


class NotFound(BullpenError):
    """The object does not exist in the caller's workspace."""

    status = 404
    slug = "not-found"
    title = "Not found"


class Conflict(BullpenError):
    """The object's state does not allow the change."""

    status = 409
    slug = "conflict"
    title = "Conflict"


class PayloadTooLarge(BullpenError):
    """The request body is over the configured limit."""

    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class UnsupportedMediaType(BullpenError):
    """The request body has a content type the route does not accept."""

    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class Unavailable(BullpenError):
    """A dependency such as the database is unreachable; retry later."""

    status = 503
    slug = "unavailable"
    title = "Service unavailable"


class ProviderError(BullpenError):
    """An LLM provider call failed (connect, HTTP status, stream error, timeout)."""

    status = 502
    slug = "provider"
    title = "Provider error"
