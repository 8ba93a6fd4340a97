"""Typed settings, read once from the environment (prefix `BULLPEN_`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Issue 19, SE-3: OWASP Password Storage Cheat Sheet, argon2id minimums (iterations -> KiB).
_OWASP_ARGON2ID_FLOOR = {1: 47_104, 2: 19_456, 3: 12_288, 4: 9_216, 5: 7_168}


def default_data_dir() -> Path:
    """Where the embedded default keeps its database and secrets."""
    return Path.home() / ".local" / "share" / "bullpen"


class Settings(BaseSettings):
    """Everything Bullpen can be configured with; see docs/configuration.md for the table."""

    # populate_by_name: the OpenTelemetry fields read standard `OTEL_*` names from the
    # environment, and are given by their field names in code.
    model_config = SettingsConfigDict(env_prefix="BULLPEN_", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    # `pgbouncer`: BULLPEN_DATABASE_URL goes through a pooler in transaction mode (PgBouncer
    # 1.18, or any pooler that does not keep prepared statements and session state across
    # transactions); `none`: it reaches PostgreSQL itself, or a session-mode pooler.
    database_pooler: Literal["none", "pgbouncer"] = "none"
    # A URL reaching PostgreSQL itself, for what needs a session (LISTEN/NOTIFY); default:
    # BULLPEN_DATABASE_URL. Needed with a transaction-mode pooler.
    database_direct_url: str | None = None
    host: str = "127.0.0.1"
    # Proxies whose X-Forwarded-For/-Proto are believed (client address for sign-in limits,
    # https for Secure cookies); comma-separated addresses, or "*".
    forwarded_allow_ips: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    secret_key: str | None = None
    # Log lines on stderr: `json` (one object a line, for collectors), `text` (for people), or
    # `auto`: text when stderr is a terminal, else JSON.
    log_format: Literal["auto", "json", "text"] = "auto"

    # Limits (documented in docs/api.md, "Limits").
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # The relay's bodies carry whole conversations.
    relay_max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    page_size_max: int = Field(default=100, ge=1)
    sse_keepalive_s: float = Field(default=15.0, gt=0)
    # A stream client that takes no data for this long is dropped (it resumes with
    # Last-Event-ID): a reader that stopped reading holds nothing for long.
    sse_write_timeout_s: float = Field(default=30.0, gt=0)

    # The HTTP edge (issue 19, finding 3), enforced before any app code runs: a request head
    # (request line and headers) over this many bytes gets 431, one not complete within this
    # many seconds of its first byte (or of the connection opening) gets 408, and beyond this
    # many open connections a request gets 503. A reverse proxy may add tighter bounds.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    max_connections: int = Field(default=10_000, ge=1)
    # /metrics (issue 19, finding 9): besides an instance admin's API key, Prometheus may send
    # `Authorization: Bearer <this token>`. Unset: only instance admins may scrape.
    metrics_token: SecretStr | None = Field(default=None, min_length=16)

    # Identity and the API contract.
    # One key may serve many people at once (a server-to-server integration): the reference
    # scenario's 80 users make about 65 requests/s through one key (docs/security.md).
    rate_limit_key_rps: float = Field(default=100.0, gt=0)
    rate_limit_key_burst: int = Field(default=200, ge=1)
    rate_limit_workspace_rps: float = Field(default=200.0, gt=0)
    rate_limit_workspace_burst: int = Field(default=400, ge=1)
    login_max_failures: int = Field(default=5, ge=1)
    login_max_failures_per_client: int = Field(default=50, ge=1)
    login_window_s: float = Field(default=900.0, gt=0)
    # Issue 19, finding 1 and SE-3: the cost of password hashes, and the pool every argon2 call
    # runs on. New hashes are argon2id at this cost (at or above OWASP's floor, checked below);
    # a stored hash of another cost is re-made at its owner's next sign-in. `threads` hashes
    # run at once (each holding `memory_kib`), `queue` more wait; beyond, 503 + Retry-After.
    password_hash_memory_kib: int = Field(default=19_456, ge=7_168, le=4 * 1024 * 1024)
    password_hash_time_cost: int = Field(default=2, ge=1, le=100)
    password_hash_parallelism: int = Field(default=1, ge=1, le=64)
    password_hash_threads: int = Field(default=1, ge=1, le=256)
    password_hash_queue: int = Field(default=16, ge=0, le=100_000)
    idempotency_ttl_s: float = Field(default=86_400.0, ge=60)
    session_ttl_s: float = Field(default=7 * 86_400.0, ge=60)
    housekeeping_interval_s: float = Field(default=300.0, gt=0)
    # Workspace invitations (issue 19, finding 10): how long one stays acceptable, and how
    # many a workspace may have pending at once.
    invitation_ttl_s: float = Field(default=7 * 86_400.0, ge=60)
    invitations_max: int = Field(default=1000, ge=1)
    # Approvals (issue 22): how long one waits for a decision when its agent sets no time of
    # its own; the housekeeping sweep then decides it by its default outcome (deny unless the
    # agent says approve).
    approval_ttl_s: float = Field(default=86_400.0, ge=1, le=30 * 86_400.0)

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

    # Breakers for runaway agents (docs/agents.md): every agent's defaults, 0 for no limit;
    # an agent's `breakers` override them. Crossing one pauses the agent.
    breaker_runs_per_hour: int = Field(default=1000, ge=0)
    breaker_failures_in_a_row: int = Field(default=10, ge=0)
    breaker_usd_per_hour: float = Field(default=20.0, ge=0)

    # Event log and streams.
    coalesce_ms: float = Field(default=10.0, ge=0)
    # How committed events reach live streams in other processes: `auto` is redis when
    # redis_url is set, else postgres (LISTEN/NOTIFY) on PostgreSQL, else memory (one process).
    bus: Literal["auto", "memory", "postgres", "redis"] = "auto"
    redis_url: str | None = None
    redis_stream_maxlen: int = Field(default=100_000, ge=1000)
    # Live stream subscribers held by one process, and by one workspace in one process.
    sse_max_subscribers: int = Field(default=10_000, ge=1)
    sse_max_subscribers_per_workspace: int = Field(default=2_500, ge=1)
    # Events buffered per subscriber; a reader that falls further behind re-reads the store.
    sse_buffer_events: int = Field(default=1024, ge=16)
    # How often a workspace status stream polls the task change log (one poll per workspace
    # per process, however many clients); a run starting or ending, or a task enqueued by this
    # process, polls at once.
    workspace_poll_s: float = Field(default=0.25, gt=0, le=60)
    # How long run events and task changes are kept (streams resume from any point within it).
    event_retention_days: float = Field(default=30.0, gt=0)
    event_cleanup_batch: int = Field(default=5_000, ge=100)
    # Retention (issue 19, finding 11a): days the periodic sweep keeps audit events, usage ledger
    # rows and ended tasks (done, failed, cancelled; with their runs, events, comments and
    # steps; a live task and the tree around it stay); 0 keeps them forever. `retention_batch`
    # rows of one kind are deleted per transaction.
    audit_retention_days: float = Field(default=365.0, ge=0)
    usage_retention_days: float = Field(default=365.0, ge=0)
    task_retention_days: float = Field(default=90.0, ge=0)
    retention_batch: int = Field(default=1_000, ge=10, le=100_000)

    # Task trees (issue 19, finding 6): how many levels of subtasks may nest below a root task
    # (through the API and agents' `delegate`); a deeper one is refused with 422.
    task_max_depth: int = Field(default=32, ge=1, le=1000)

    # Agents.
    # Webhook (`http`) agents may not call private, loopback, link-local or otherwise
    # non-public addresses, nor be redirected to one, unless this allow-list names the target:
    # comma-separated CIDRs (`10.1.0.0/16`) and host names (`agents.internal`).
    outbound_allow: str = ""
    # The executables `process` agents may run: comma-separated absolute paths. Empty: the
    # `process` adapter is off (it runs commands on the worker's machine).
    process_allow: str = ""
    # Issue 19, finding 7: the environment variable names `process` agents may set (`env` and
    # `secret_env`): comma-separated names, or prefixes ending in `*` (`LC_*`); case-sensitive.
    process_env_allow: str = "LANG,LANGUAGE,LC_*,TZ,NO_COLOR"
    # Routines: how often a scheduler looks for due routines.
    scheduler_interval_s: float = Field(default=1.0, gt=0)

    # Store.
    pool_size: int = Field(default=20, ge=1)
    pool_max_overflow: int = Field(default=10, ge=0)
    # PostgreSQL ends a session of this store left idle inside a transaction this long: a process
    # paused mid-transaction (SIGSTOP, a frozen VM) would otherwise hold its row locks, and with
    # them every other worker's claim of its runs, until it wakes.
    db_idle_transaction_timeout_s: float = Field(default=30.0, gt=0)
    # SQLite (issue 19, finding 11b): the WAL file is cut back to this size when the log starts
    # over, and truncated by the periodic checkpoint once it has grown past it.
    sqlite_wal_limit_mb: int = Field(default=16, ge=1, le=4096)

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
    # Output tokens a streaming call reserves against its budgets at a time (docs/budgets.md).
    budget_slice_tokens: int = Field(default=512, ge=16, le=100_000)
    # A process gives back a relay budget pool no call has used for this long (docs/spend.md).
    budget_pool_idle_s: float = Field(default=5.0, gt=0, le=3600)
    gateway_retry_after_max_s: float = Field(default=2.0, ge=0)
    # A provider's circuit breaker opens after this many failures within the window, skips the
    # provider for the cooldown, then lets one probe through.
    gateway_breaker_failures: int = Field(default=5, ge=1)
    gateway_breaker_window_s: float = Field(default=30.0, gt=0)
    gateway_breaker_cooldown_s: float = Field(default=30.0, gt=0)
    # How long a process reuses a workspace's providers and routes before reading them again
    # (changes made through this process apply at once).
    gateway_catalog_ttl_s: float = Field(default=2.0, ge=0)
    # MCP servers (issue 24): how long a server's tool listing is reused, how long the
    # workspace's server list is, and the longest tool result given to a model (characters).
    mcp_tools_ttl_s: float = Field(default=60.0, ge=0)
    mcp_servers_ttl_s: float = Field(default=2.0, ge=0)
    mcp_result_max_chars: int = Field(default=20_000, ge=100, le=1_000_000)
    api_key_cache_s: float = Field(default=1.0, ge=0, le=60)
    # Relay streams open at once in this process; beyond it the relay answers 503.
    relay_max_streams: int = Field(default=2000, ge=1)
    # Issue 19, finding 4: each workspace's and each caller's (API key's, or signed-in user's)
    # share of those; beyond it the relay answers 429, while other tenants still get through.
    relay_max_streams_per_workspace: int = Field(default=1000, ge=1)
    relay_max_streams_per_key: int = Field(default=500, ge=1)
    # How long the usage ledger gathers relay calls' rows before it commits them as one batch.
    ledger_linger_ms: int = Field(default=50, ge=0, le=1000)

    # OpenTelemetry traces (docs/tracing.md): off unless these standard variables turn them on
    # (an exporter named, or an OTLP endpoint given). The OTLP exporter reads its headers,
    # timeout, compression and certificates, the SDK its sampler, resource and batch settings,
    # from their own `OTEL_*` variables.
    otel_sdk_disabled: bool = Field(default=False, validation_alias="OTEL_SDK_DISABLED")
    otel_traces_exporter: str | None = Field(default=None, validation_alias="OTEL_TRACES_EXPORTER")
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    otel_exporter_otlp_protocol: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    otel_exporter_otlp_traces_protocol: str | None = Field(
        default=None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    )
    # Prompts and completions in LLM call spans (gen_ai.input.messages, gen_ai.output.messages):
    # off unless asked for, as the GenAI instrumentations' own variable does.
    otel_capture_message_content: bool = Field(
        default=False, validation_alias="OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must be redis://…, rediss://… or unix://…")
        return value

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _normalise_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or value == "":
            return None
        for prefix in ("postgresql://", "postgres://"):
            if value.startswith(prefix):
                return "postgresql+asyncpg://" + value[len(prefix) :]
        if value.startswith("postgresql+asyncpg://"):
            return value
        if info.field_name == "database_direct_url":  # only PostgreSQL has LISTEN/NOTIFY
            raise ValueError("database_direct_url must be postgresql://…")
        if value.startswith(("sqlite:///", "sqlite+pysqlite:///")):
            return "sqlite:///" + value.split(":///", 1)[1]
        raise ValueError("database_url must be postgresql://… or sqlite:///path")

    @model_validator(mode="after")
    def _check_password_cost(self) -> Settings:
        # OWASP's argon2id configurations (memory KiB for each iteration count), all
        # equivalent; more iterations than the table lists need its smallest memory.
        memory, passes = self.password_hash_memory_kib, self.password_hash_time_cost
        needed = _OWASP_ARGON2ID_FLOOR.get(passes, min(_OWASP_ARGON2ID_FLOOR.values()))
        if memory < needed:
            raise ValueError(
                f"password hashing below OWASP's argon2id floor: {passes} pass(es) need at"
                f" least {needed} KiB of memory (BULLPEN_PASSWORD_HASH_MEMORY_KIB)"
            )
        return self

    @model_validator(mode="after")
    def _check_bus(self) -> Settings:
        if self.bus == "redis" and not self.redis_url:
            raise ValueError("BULLPEN_BUS=redis needs BULLPEN_REDIS_URL")
        if self.bus == "postgres" and (not self.database_url or self.is_sqlite):
            raise ValueError("BULLPEN_BUS=postgres needs a PostgreSQL BULLPEN_DATABASE_URL")
        return self

    @model_validator(mode="after")
    def _check_pooler(self) -> Settings:
        postgres = bool(self.database_url) and not self.is_sqlite
        if self.database_direct_url and not postgres:
            raise ValueError("BULLPEN_DATABASE_DIRECT_URL needs a PostgreSQL BULLPEN_DATABASE_URL")
        if self.database_pooler == "pgbouncer":
            if not postgres:
                raise ValueError(
                    "BULLPEN_DATABASE_POOLER=pgbouncer needs a PostgreSQL BULLPEN_DATABASE_URL"
                )
            if not self.database_direct_url:
                raise ValueError(
                    "BULLPEN_DATABASE_POOLER=pgbouncer needs BULLPEN_DATABASE_DIRECT_URL:"
                    " LISTEN/NOTIFY cannot go through a transaction-mode pooler"
                )
        return self

    @model_validator(mode="after")
    def _check_traces(self) -> Settings:
        exporters = self.trace_exporters  # raises on an unknown exporter
        protocol = self.otel_exporter_otlp_traces_protocol or self.otel_exporter_otlp_protocol
        if "otlp" in exporters and protocol not in (None, "", "http/protobuf"):
            raise ValueError(
                f"OTLP protocol {protocol!r} is not supported: Bullpen exports traces over "
                "OTLP/HTTP (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            )
        for name, url in (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.otel_exporter_otlp_endpoint),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", self.otel_exporter_otlp_traces_endpoint),
        ):  # the value is not repeated: a URL may carry credentials
            if url and not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be an http:// or https:// URL")
        return self

    @property
    def trace_exporters(self) -> tuple[str, ...]:
        """Where spans go: `otlp` and/or `console`; empty when tracing is off (the default)."""
        if self.otel_sdk_disabled:
            return ()
        names = [n.strip().lower() for n in (self.otel_traces_exporter or "").split(",")]
        chosen = tuple(dict.fromkeys(n for n in names if n))
        if not chosen:  # unset: an endpoint given is enough to turn OTLP on
            endpoint = self.otel_exporter_otlp_traces_endpoint or self.otel_exporter_otlp_endpoint
            return ("otlp",) if endpoint else ()
        unknown = set(chosen) - {"otlp", "console", "none"}
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER: unsupported exporter(s) {sorted(unknown)}; "
                "Bullpen supports otlp, console and none"
            )
        return tuple(n for n in chosen if n != "none")

    @property
    def direct_database_url(self) -> str | None:
        """PostgreSQL itself, for LISTEN/NOTIFY: the direct URL, else the database URL."""
        if self.is_sqlite:
            return None
        return self.database_direct_url or self.database_url

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
