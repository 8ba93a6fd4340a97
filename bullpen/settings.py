"""Typed settings, read once from the environment (prefix `BULLPEN_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """Where the embedded default keeps its database and secrets."""
    return Path.home() / ".local" / "share" / "bullpen"


class Settings(BaseSettings):
    """Everything Bullpen can be configured with; see README for the table."""

    model_config = SettingsConfigDict(env_prefix="BULLPEN_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    host: str = "127.0.0.1"
    # Proxies whose X-Forwarded-For/-Proto are believed (client address for sign-in limits,
    # https for Secure cookies); comma-separated addresses, or "*".
    forwarded_allow_ips: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    secret_key: str | None = None

    # Limits (documented in README "Limits").
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # The relay's bodies carry whole conversations.
    relay_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    page_size_max: int = Field(default=100, ge=1)
    sse_keepalive_s: float = Field(default=15.0, gt=0)

    # Identity and the API contract.
    rate_limit_key_rps: float = Field(default=50.0, gt=0)
    rate_limit_key_burst: int = Field(default=100, ge=1)
    rate_limit_workspace_rps: float = Field(default=200.0, gt=0)
    rate_limit_workspace_burst: int = Field(default=400, ge=1)
    login_max_failures: int = Field(default=5, ge=1)
    login_max_failures_per_client: int = Field(default=50, ge=1)
    login_window_s: float = Field(default=900.0, gt=0)
    idempotency_ttl_s: float = Field(default=86_400.0, ge=60)
    session_ttl_s: float = Field(default=7 * 86_400.0, ge=60)
    housekeeping_interval_s: float = Field(default=300.0, gt=0)

    # Worker.
    worker_enabled: bool = True
    worker_concurrency: int = Field(default=256, ge=1)
    lease_s: float = Field(default=60.0, gt=0)
    poll_interval_s: float = Field(default=1.0, gt=0)
    cancel_poll_s: float = Field(default=0.5, gt=0)
    worker_reserved_slots: int = Field(default=1, ge=0)
    max_attempts: int = Field(default=5, ge=1)
    retry_backoff_s: float = Field(default=1.0, ge=0)
    retry_backoff_max_s: float = Field(default=300.0, ge=0)
    drain_grace_s: float = Field(default=30.0, ge=0)
    queue_max_backlog: int = Field(default=10_000, ge=1)
    queue_backlog_retry_after_s: int = Field(default=5, ge=1)
    # Fault injection for the fault tests: a worker that starts a run whose prompt contains this
    # text kills its own process (SIGKILL), as a poison run would. Unset: no effect.
    fault_crash_marker: str | None = Field(default=None, min_length=8)

    # Event log.
    coalesce_ms: float = Field(default=25.0, ge=0)

    # Store.
    pool_size: int = Field(default=20, ge=1)
    pool_max_overflow: int = Field(default=10, ge=0)

    # Built-in simulated provider for `bullpen up`.
    sim_enabled: bool = True
    sim_url: str | None = None  # use a simulator already running there instead of starting one
    sim_ttft_ms: float = Field(default=380.0, ge=0)
    sim_tokens_per_second: float = Field(default=50.0, gt=0)
    sim_response_tokens: int = Field(default=64, ge=1)

    # Provider calls: the defaults of providers that set no timeouts of their own.
    provider_connect_timeout_s: float = Field(default=10.0, gt=0)
    provider_ttft_timeout_s: float = Field(default=60.0, gt=0)
    provider_idle_timeout_s: float = Field(default=60.0, gt=0)
    provider_deadline_s: float = Field(default=600.0, gt=0)

    # The gateway.
    # A 429 whose Retry-After is at most this is waited out once on the same provider; a longer
    # one moves on to the next provider of the route at once.
    gateway_retry_after_max_s: float = Field(default=2.0, ge=0)
    # A provider's circuit breaker opens after this many failures within the window, skips the
    # provider for the cooldown, then lets one probe through.
    gateway_breaker_failures: int = Field(default=5, ge=1)
    gateway_breaker_window_s: float = Field(default=30.0, gt=0)
    gateway_breaker_cooldown_s: float = Field(default=30.0, gt=0)
    # How long a process reuses a workspace's providers and routes before reading them again
    # (changes made through this process apply at once).
    gateway_catalog_ttl_s: float = Field(default=2.0, ge=0)
    # Relay streams open at once in this process; beyond it the relay answers 503.
    relay_max_streams: int = Field(default=2000, ge=1)

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        for prefix in ("postgresql://", "postgres://"):
            if value.startswith(prefix):
                return "postgresql+asyncpg://" + value[len(prefix) :]
        if value.startswith("postgresql+asyncpg://"):
            return value
        if value.startswith(("sqlite:///", "sqlite+pysqlite:///")):
            return "sqlite:///" + value.split(":///", 1)[1]
        raise ValueError("database_url must be postgresql://… or sqlite:///path")

    @property
    def resolved_database_url(self) -> str:
        """The URL to connect to: the configured one or SQLite in the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'bullpen.db'}"

    @property
    def is_sqlite(self) -> bool:
        """True when the store is SQLite."""
        return self.resolved_database_url.startswith("sqlite")
