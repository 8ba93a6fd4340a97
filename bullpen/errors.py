"""Bullpen's one error tree; HTTP mapping happens only in `bullpen.api.problems`.

BullpenError
├── BadRequest            400  a malformed header or parameter outside the body
├── InvalidInput          422  a field or value is wrong
│   ├── IdempotencyKeyMismatch   the key was used with a different request
│   └── TaskTooDeep              a subtask would nest deeper than BULLPEN_TASK_MAX_DEPTH
├── Unauthenticated       401  no or bad credentials
├── Forbidden             403  authenticated, not allowed
├── NotFound              404  missing, or another workspace's
├── Conflict              409  state does not allow it
│   └── IdempotencyKeyInUse      the same key's first request is still in flight
├── PayloadTooLarge       413
├── UnsupportedMediaType  415
├── RateLimited           429  slow down (always with retry_after)
│   └── KeyRateLimited           a relay key over its requests or tokens per minute
├── Unavailable           503  a dependency (database) is away
└── ProviderError         502  an LLM provider call failed
    ├── ProviderUnavailable      503  every provider of the route failed or was skipped
    ├── ProviderTimeout          504  no first token, or no chunk, within the limit
    ├── ProviderRejected         400  the provider refused the request itself
    ├── ProviderAuth             502  the provider refused Bullpen's credentials
    ├── ProviderSpendLimit       402  the provider's quota or spend limit is exhausted
    └── ProviderIncomplete       502  the stream failed after text reached the caller
ModelNotFound (NotFound)     404  no route or provider model by that name
AgentStopped              422  an agent's run hit a ceiling (steps, wall time, cost)
└── AgentLoop                    the agent repeated the same tool call
AgentTerminated (Conflict)   409  the agent was terminated and takes no tasks
BudgetExceeded            429  a budget (or a run's cost ceiling) has no room for the call
"""

from __future__ import annotations

from typing import Any, ClassVar


class BullpenError(Exception):
    """Root of every error Bullpen raises on purpose."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    # Whether trying the same thing again later may succeed (a run is then retried with backoff).
    transient_by_default: ClassVar[bool] = False

    @property
    def openai_error(self) -> tuple[str, str] | None:
        """The `type` and `code` of OpenAI's `error` member on the relay, where OpenAI has its
        own words for this error (None: the slug)."""
        return None

    def __init__(
        self,
        detail: str,
        *,
        retry_after: float | None = None,
        errors: list[dict[str, Any]] | None = None,
        transient: bool | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.errors = errors
        self.transient = self.transient_by_default if transient is None else transient


class BadRequest(BullpenError):
    """A header or parameter is malformed (e.g. an Idempotency-Key)."""

    status = 400
    slug = "bad-request"
    title = "Bad request"


class InvalidInput(BullpenError):
    """A request field or value is not acceptable."""

    status = 422
    slug = "validation"
    title = "Invalid request"


class IdempotencyKeyMismatch(InvalidInput):
    """An Idempotency-Key was reused with a different request."""

    slug = "idempotency-key-mismatch"
    title = "Idempotency key reused with a different request"


class TaskTooDeep(InvalidInput):
    """A subtask would nest deeper below its root task than the configured cap."""

    slug = "task-too-deep"
    title = "Subtask nested too deep"


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


class ApprovalDecided(Conflict):
    """The approval was decided before (by a person or by its expiry)."""

    slug = "approval-decided"
    title = "Approval already decided"


class IdempotencyKeyInUse(Conflict):
    """A request with the same Idempotency-Key is still being processed."""

    slug = "idempotency-key-in-use"
    title = "Idempotency key in use"


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


class RateLimited(BullpenError):
    """Too many requests from this caller or workspace; retry after `retry_after` seconds."""

    status = 429
    slug = "rate-limited"
    title = "Too many requests"


class KeyRateLimited(RateLimited):
    """A relay call over its API key's requests (`kind` "requests") or tokens ("tokens") per
    minute; relay callers see OpenAI's `rate_limit_exceeded`."""

    slug = "key-rate-limited"
    openai_code: ClassVar[str] = "rate_limit_exceeded"

    def __init__(self, detail: str, *, kind: str, retry_after: float) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.kind = kind

    @property
    def openai_error(self) -> tuple[str, str] | None:
        """OpenAI's `requests` / `tokens` with `rate_limit_exceeded`."""
        return (self.kind, self.openai_code)


class Unavailable(BullpenError):
    """A dependency such as the database is unreachable; retry later."""

    status = 503
    slug = "unavailable"
    title = "Service unavailable"
    transient_by_default = True


class ProviderError(BullpenError):
    """An LLM provider call failed (connect, HTTP status, stream error, timeout).

    `reason` names what happened in a word or two (`http-503`, `ttft-timeout`, ...) for the
    run's record of attempts and the metrics; `transient` says whether another provider, or a
    later try, may succeed.
    """

    status = 502
    slug = "provider"
    title = "Provider error"

    def __init__(
        self,
        detail: str,
        *,
        reason: str | None = None,
        retry_after: float | None = None,
        errors: list[dict[str, Any]] | None = None,
        transient: bool | None = None,
    ) -> None:
        super().__init__(detail, retry_after=retry_after, errors=errors, transient=transient)
        self.reason = reason or self.slug


class ProviderUnavailable(ProviderError):
    """Every provider of the chain failed in a way worth retrying later, or was skipped."""

    status = 503
    slug = "provider-unavailable"
    title = "No provider available"
    transient_by_default = True


class ProviderTimeout(ProviderError):
    """A provider sent no first token, or no next chunk, within its limit."""

    status = 504
    slug = "provider-timeout"
    title = "Provider timed out"
    transient_by_default = True


class ProviderRejected(ProviderError):
    """The provider refused the request as malformed or unsupported (its 400-class answer)."""

    status = 400
    slug = "provider-rejected"
    title = "Provider rejected the request"


class ProviderAuth(ProviderError):
    """The provider refused the configured API key."""

    status = 502
    slug = "provider-auth"
    title = "Provider refused the credentials"


class ProviderSpendLimit(ProviderError):
    """The provider's quota or spend limit is used up; retrying will not help."""

    status = 402
    slug = "provider-spend-limit"
    title = "Provider spend limit reached"


class ProviderIncomplete(ProviderError):
    """The stream broke after content reached the caller; the partial text is kept as is."""

    status = 502
    slug = "provider-incomplete"
    title = "Provider stream incomplete"


class ModelNotFound(NotFound):
    """No model route or provider model has that name in the workspace."""

    slug = "model-not-found"
    title = "Model not found"


class AgentStopped(BullpenError):
    """An agent's run was stopped by one of its ceilings (steps, wall time, cost)."""

    status = 422
    slug = "agent-limit"
    title = "Agent stopped at a limit"


class AgentLoop(AgentStopped):
    """An agent repeated the same tool call: a runaway loop, stopped."""

    slug = "agent-loop"
    title = "Agent loop stopped"


class AgentTerminated(Conflict):
    """The agent was terminated: it takes no tasks."""

    slug = "agent-terminated"
    title = "Agent terminated"


class BudgetExceeded(BullpenError):
    """A budget, or a run's cost ceiling, has no room left for this call: it was refused
    before it started, or its stream was stopped."""

    status = 429
    slug = "budget-exceeded"
    title = "Budget exceeded"

    def __init__(self, detail: str, *, by_budget: bool = True) -> None:
        super().__init__(detail)
        # A budget refused (an approver may override it for the task), not the run's ceiling.
        self.by_budget = by_budget

    @property
    def openai_error(self) -> tuple[str, str] | None:
        """OpenAI's out-of-credit answer, which its clients do not retry."""
        return ("insufficient_quota", "insufficient_quota")
