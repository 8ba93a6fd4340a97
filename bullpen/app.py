"""The composition root: build every service from one Settings, tear them down in order."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from bullpen.agents import process, process_env
from bullpen.agents.base import Adapter
from bullpen.agents.configs import ConfigPolicy
from bullpen.agents.http import HttpAdapter
from bullpen.agents.llm import LlmAdapter
from bullpen.agents.mcp import McpClient, McpTools
from bullpen.domain.breakers import BreakerLimits
from bullpen.domain.runs import RetryPolicy
from bullpen.gateway.breaker import BreakerPolicy, Breakers
from bullpen.gateway.catalog import Price, Provider, Timeouts
from bullpen.gateway.check import check as check_provider
from bullpen.gateway.client import GatewayClient
from bullpen.gateway.metrics import GatewayMetrics
from bullpen.gateway.router import Gateway, Router
from bullpen.metrics import build_registry
from bullpen.queue.wakeup import Listener, Notifier, asyncpg_dsn
from bullpen.queue.worker import Worker, WorkerTuning
from bullpen.security.outbound import OutboundAllow
from bullpen.security.passwords import HashCost, PasswordPool
from bullpen.security.ratelimit import (
    CallerLimits,
    FailureWindow,
    KeyWindows,
    Slots,
    TokenBuckets,
)
from bullpen.security.secrets import SecretBox, load_secret
from bullpen.services.agents import AgentService
from bullpen.services.api_keys import ApiKeyService
from bullpen.services.approvals import ApprovalService
from bullpen.services.auth import AuthService
from bullpen.services.bootstrap import SIMULATED_MODEL, SIMULATED_PROVIDER
from bullpen.services.budgets import BudgetService
from bullpen.services.enqueue import Admission
from bullpen.services.gateway import Directory, GatewayConfig
from bullpen.services.housekeeping import Housekeeper, Retention
from bullpen.services.invitations import InvitationService
from bullpen.services.ledger import UsageLedger
from bullpen.services.mcp_servers import McpDirectory, McpService
from bullpen.services.routines import RoutineService, Scheduler
from bullpen.services.searchindex import SearchIndexer
from bullpen.services.spend import RelayBudgets, RunSpend, Spend
from bullpen.services.tasks import TaskService
from bullpen.services.team import Team
from bullpen.services.users import UserService
from bullpen.services.workspaces import WorkspaceService
from bullpen.settings import Settings
from bullpen.simulator.provider import SimConfig, SimulatedProvider
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from bullpen.store.migrate import migrate
from bullpen.streams.bus.base import Bus
from bullpen.streams.bus.memory import Hub, MemoryBus
from bullpen.streams.bus.postgres import PgNotify
from bullpen.streams.bus.shared import SharedBus, Transport
from bullpen.streams.changes import Feeds
from bullpen.streams.eventlog import EventLog
from bullpen.telemetry.setup import open_tracing

if TYPE_CHECKING:  # OpenTelemetry is imported only when tracing is on
    from opentelemetry.sdk.trace.export import SpanExporter

    from bullpen.telemetry.spans import Tracing


def utcnow() -> datetime:
    """The clock every service uses unless a test hands in another."""
    return datetime.now(UTC)


log = logging.getLogger(__name__)


@dataclass
class Services:
    """Everything a running Bullpen process holds."""

    settings: Settings
    store: Store
    secret: bytes
    bus: Bus
    feeds: Feeds
    eventlog: EventLog
    gateway: Gateway
    directory: Directory
    secret_box: SecretBox
    ledger: UsageLedger
    relay_slots: Slots
    relay_rates: KeyWindows  # API keys' requests and tokens per minute, in this process
    relay_budgets: RelayBudgets  # budgets' pools for relayed calls, in this process
    provider_defaults: Timeouts
    # BULLPEN_OUTBOUND_ALLOW, parsed (issue 19, finding 2: provider URLs are checked too).
    outbound: OutboundAllow
    worker: Worker | None
    auth: AuthService
    admission: Admission
    tasks: TaskService
    approvals: ApprovalService
    agent_configs: ConfigPolicy
    agents: AgentService
    routines: RoutineService
    workspaces: WorkspaceService
    users: UserService
    api_keys: ApiKeyService
    invitations: InvitationService
    spend: Spend
    budgets: BudgetService
    gateway_config: GatewayConfig
    mcp_servers: McpService
    mcp_tools: McpTools  # the tool loop's MCP side (the worker's `llm` adapter holds it)
    limits: CallerLimits
    metrics: CollectorRegistry
    clock: Callable[[], datetime]
    simulator: SimulatedProvider | None
    tracing: Tracing | None = None  # None: tracing is off (the default)


@asynccontextmanager
async def open_store(settings: Settings) -> AsyncIterator[Store]:
    """The store, migrated to head, disposed of on exit."""
    store = create_store(settings)
    try:
        store.lock_sqlite()
        await migrate(store)
        store.start()
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def build(
    settings: Settings,
    *,
    clock: Callable[[], datetime] = utcnow,
    span_exporter: SpanExporter | None = None,
) -> AsyncIterator[Services]:
    """Start every part this process runs; stop them in reverse order on exit.

    `span_exporter` (tests): spans go there too, and tracing is on whatever the settings."""
    async with AsyncExitStack() as stack:
        # First in, last out: the worker's last spans are exported when it has drained.
        tracing = await stack.enter_async_context(open_tracing(settings, span_exporter))
        store = await stack.enter_async_context(open_store(settings))
        secret = load_secret(settings.secret_key, settings.data_dir)
        defaults = provider_defaults(settings)
        simulator: SimulatedProvider | None = None
        sim_url = settings.sim_url
        if not sim_url and settings.sim_enabled:
            simulator = await stack.enter_async_context(
                SimulatedProvider(
                    SimConfig(
                        ttft_ms=settings.sim_ttft_ms,
                        tokens_per_second=settings.sim_tokens_per_second,
                        response_tokens=settings.sim_response_tokens,
                        models=(SIMULATED_MODEL,),
                    )
                )
            )
            sim_url = simulator.base_url
        builtins = []
        if sim_url:
            builtins.append(
                Provider(
                    key="builtin:" + SIMULATED_PROVIDER,
                    name=SIMULATED_PROVIDER,
                    base_url=sim_url,
                    timeouts=defaults,
                    prices={SIMULATED_MODEL: Price()},  # simulated tokens cost nothing
                    builtin=True,  # the operator's: not subject to the outbound guard
                )
            )
        # Issue 19, finding 1: every argon2 call on a bounded pool of its own.
        passwords = stack.enter_context(password_pool(settings))
        bus = await open_bus(settings, stack)
        feeds = Feeds(store, bus.hub, poll_s=settings.workspace_poll_s)
        stack.push_async_callback(feeds.close)
        eventlog = await stack.enter_async_context(
            EventLog(store, bus, coalesce_s=settings.coalesce_ms / 1000, clock=clock)
        )
        outbound = OutboundAllow.parse(settings.outbound_allow)
        # Workspace providers connect only to addresses the outbound guard allows.
        client = await stack.enter_async_context(GatewayClient(outbound))
        breakers = Breakers(
            BreakerPolicy(
                failures=settings.gateway_breaker_failures,
                window_s=settings.gateway_breaker_window_s,
                cooldown_s=settings.gateway_breaker_cooldown_s,
            )
        )
        readers: dict[str, tuple[str, Callable[[], float]]] = {}
        registry = build_registry(readers)
        box = SecretBox(secret)
        directory = Directory(
            store,
            box,
            builtins=builtins,
            ttl_s=settings.gateway_catalog_ttl_s,
            clock=time.monotonic,
        )
        gateway = Gateway(
            Router(
                client,
                breakers,
                GatewayMetrics(registry, breakers),
                retry_after_max_s=settings.gateway_retry_after_max_s,
            ),
            directory,
        )
        ledger = await stack.enter_async_context(
            UsageLedger(store, clock, linger_s=settings.ledger_linger_ms / 1000)
        )
        worker: Worker | None = None
        # Who hears of a run enqueued here (filled below): this process's worker, and the
        # other processes' through NOTIFY.
        wakeups: list[Callable[[], None]] = [feeds.nudge]
        # One admission rule for every path that queues a task (API, routines, delegation).
        admission = Admission(
            max_backlog=settings.queue_max_backlog,
            backlog_retry_after_s=settings.queue_backlog_retry_after_s,
            max_depth=settings.task_max_depth,
        )
        team = Team(store, clock, _all(wakeups), admission=admission)
        spend = Spend(store, clock, slice_tokens=settings.budget_slice_tokens)
        relay_budgets = await stack.enter_async_context(
            RelayBudgets(spend, store, clock, idle_s=settings.budget_pool_idle_s)
        )
        notifier: Notifier | None = None
        if (direct := settings.direct_database_url) is not None:
            # PostgreSQL: other processes hear of enqueues (NOTIFY on a direct connection)
            notifier = await stack.enter_async_context(Notifier(asyncpg_dsn(direct)))
            wakeups.append(notifier.enqueued)
        process_allow = process.parse_allow(settings.process_allow)
        process_env_allow = process_env.EnvAllow.parse(settings.process_env_allow)
        mcp_client = McpClient(
            outbound,
            process_allow=process_allow,
            env_allow=process_env_allow,
            ttl_s=settings.mcp_tools_ttl_s,
            clock=time.monotonic,
        )
        stack.push_async_callback(mcp_client.close)
        mcp_directory = McpDirectory(
            store, box, ttl_s=settings.mcp_servers_ttl_s, clock=time.monotonic
        )
        mcp_tools = McpTools(
            mcp_directory, mcp_client, result_max_chars=settings.mcp_result_max_chars
        )
        if settings.worker_enabled:
            adapters: dict[str, Adapter] = {
                "llm": LlmAdapter(
                    gateway, team, RunSpend(spend, store), mcp_tools, tracing=tracing
                ),
                "http": await stack.enter_async_context(HttpAdapter(box, outbound)),
            }
            if process_allow:
                if not process.protect_worker():
                    log.warning("could not make the worker non-dumpable for process agents")
                # A cancel waits up to 5 s for the run to stop: the command gets 2 s of it.
                adapters["process"] = process.ProcessAdapter(
                    process_allow, env_allow=process_env_allow, box=box, kill_grace_s=2.0
                )
            worker = await stack.enter_async_context(
                Worker(
                    store,
                    eventlog,
                    adapters,
                    team,
                    tuning=worker_tuning(settings),
                    clock=clock,
                    publish=bus.publish,
                    announce=None if notifier is None else notifier.enqueued,
                    tracing=tracing,
                )
            )
            wakeups.append(worker.notify)
            if (direct := settings.direct_database_url) is not None:
                # Never through a pooler: LISTEN needs a session of its own.
                await stack.enter_async_context(Listener(asyncpg_dsn(direct), worker.notify))
        approvals = ApprovalService(
            store, clock, on_enqueued=_all(wakeups), default_ttl_s=settings.approval_ttl_s
        )
        await stack.enter_async_context(
            Housekeeper(
                store,
                clock,
                settings.housekeeping_interval_s,
                Retention(
                    events=timedelta(days=settings.event_retention_days),
                    event_batch=settings.event_cleanup_batch,
                    audit=_days(settings.audit_retention_days),
                    usage=_days(settings.usage_retention_days),
                    tasks=_days(settings.task_retention_days),
                    batch=settings.retention_batch,
                ),
                expire_approvals=approvals.expire,
            )
        )
        await stack.enter_async_context(SearchIndexer(store))
        if worker is not None:  # routines fire wherever runs execute (any number at once)
            await stack.enter_async_context(
                Scheduler(
                    store,
                    clock,
                    interval_s=settings.scheduler_interval_s,
                    on_enqueued=_all(wakeups),
                    admission=admission,
                )
            )
        readers["bullpen_sse_subscribers"] = ("Live SSE subscribers", lambda: bus.subscriber_count)
        readers["bullpen_event_commits"] = ("Event log group commits", lambda: eventlog.commits)
        if worker is not None:
            readers["bullpen_runs_inflight"] = ("Runs executing", lambda: worker.inflight)
            readers["bullpen_runs_completed"] = (
                "Runs this process ended (done, failed, cancelled)",
                lambda: worker.completed,
            )
            readers["bullpen_runs_redelivered"] = (
                "Deliveries this process re-queued after a lost lease or transient failure",
                lambda: worker.redelivered,
            )
            readers["bullpen_runs_dead_lettered"] = (
                "Runs this process dead-lettered after their last allowed attempt",
                lambda: worker.dead_lettered,
            )
        if not store.is_sqlite:
            readers["bullpen_db_pool_in_use"] = (
                "DB connections in use",
                lambda: store.pool_status()[0],
            )
            readers["bullpen_db_pool_size"] = ("DB pool capacity", lambda: store.pool_status()[1])
        auth = AuthService(
            store,
            secret,
            clock,
            login_failures=FailureWindow(
                limit=settings.login_max_failures, window_s=settings.login_window_s
            ),
            login_failures_per_client=FailureWindow(
                limit=settings.login_max_failures_per_client, window_s=settings.login_window_s
            ),
            session_ttl=timedelta(seconds=settings.session_ttl_s),
            passwords=passwords,
            key_cache_s=settings.api_key_cache_s,
        )
        agent_configs = ConfigPolicy(box, outbound, process_allow, process_env_allow)
        yield Services(
            settings=settings,
            store=store,
            secret=secret,
            bus=bus,
            feeds=feeds,
            eventlog=eventlog,
            gateway=gateway,
            directory=directory,
            secret_box=box,
            ledger=ledger,
            relay_slots=Slots(
                settings.relay_max_streams,
                "relay streams",
                per_workspace=settings.relay_max_streams_per_workspace,
                per_caller=settings.relay_max_streams_per_key,
            ),
            relay_rates=KeyWindows(),
            relay_budgets=relay_budgets,
            provider_defaults=defaults,
            outbound=outbound,
            worker=worker,
            auth=auth,
            admission=admission,
            tasks=TaskService(
                store,
                clock,
                on_enqueued=_all(wakeups),
                cancel_local=worker.cancel if worker else _not_held,
                publish=bus.publish,
                admission=admission,
            ),
            approvals=approvals,
            agent_configs=agent_configs,
            agents=AgentService(store, clock, agent_configs, breaker_limits(settings)),
            routines=RoutineService(store, clock, on_enqueued=_all(wakeups), admission=admission),
            workspaces=WorkspaceService(store, clock),
            users=UserService(
                store,
                clock,
                verify_password=auth.verify_password,
                hash_password=auth.hash_password,
            ),
            api_keys=ApiKeyService(store, clock, secret),
            invitations=InvitationService(
                store,
                clock,
                ttl=timedelta(seconds=settings.invitation_ttl_s),
                pending_max=settings.invitations_max,
            ),
            spend=spend,
            budgets=BudgetService(store, clock, spend),
            gateway_config=GatewayConfig(
                store,
                box,
                directory,
                clock,
                defaults,
                outbound,
                checker=functools.partial(check_provider, client),
            ),
            mcp_tools=mcp_tools,
            mcp_servers=McpService(
                store,
                box,
                mcp_client,
                mcp_directory,
                clock,
                outbound=outbound,
                process_allow=process_allow,
                env_allow=process_env_allow,
            ),
            limits=CallerLimits(
                TokenBuckets(
                    rate=settings.rate_limit_key_rps,
                    burst=settings.rate_limit_key_burst,
                    what="this API key or user",
                ),
                TokenBuckets(
                    rate=settings.rate_limit_workspace_rps,
                    burst=settings.rate_limit_workspace_burst,
                    what="this workspace",
                ),
            ),
            metrics=registry,
            clock=clock,
            simulator=simulator,
            tracing=tracing,
        )


def password_pool(settings: Settings) -> PasswordPool:
    """The pool password hashes are made and checked on, at the configured cost."""
    cost = HashCost(
        memory_kib=settings.password_hash_memory_kib,
        time_cost=settings.password_hash_time_cost,
        parallelism=settings.password_hash_parallelism,
    )
    return PasswordPool(
        cost, threads=settings.password_hash_threads, queue=settings.password_hash_queue
    )


def bus_kind(settings: Settings) -> str:
    """The bus `auto` stands for: redis with a Redis URL, postgres on PostgreSQL, else memory."""
    if settings.bus != "auto":
        return settings.bus
    if settings.redis_url:
        return "redis"
    return "postgres" if settings.database_url else "memory"


async def open_bus(settings: Settings, stack: AsyncExitStack) -> Bus:
    """The configured bus, started on `stack` (shared buses run a sender and a listener)."""
    hub = Hub(
        buffer=settings.sse_buffer_events,
        max_subscribers=settings.sse_max_subscribers,
        max_per_workspace=settings.sse_max_subscribers_per_workspace,
    )
    kind = bus_kind(settings)
    if kind == "memory":
        return MemoryBus(hub)
    transport: Transport
    if kind == "redis":
        assert settings.redis_url is not None  # checked by Settings
        # Imported only here: the Redis client costs ~19 MB of memory in every process.
        from bullpen.streams.bus.redis import RedisStreams

        transport = RedisStreams(settings.redis_url, maxlen=settings.redis_stream_maxlen)
    else:
        direct = settings.direct_database_url
        assert direct is not None  # checked by Settings
        transport = PgNotify(asyncpg_dsn(direct))
    return await stack.enter_async_context(SharedBus(transport, hub))


def provider_defaults(settings: Settings) -> Timeouts:
    """The timeouts of providers that set none of their own."""
    return Timeouts(
        connect_s=settings.provider_connect_timeout_s,
        ttft_s=settings.provider_ttft_timeout_s,
        idle_s=settings.provider_idle_timeout_s,
        deadline_s=settings.provider_deadline_s,
    )


def worker_tuning(settings: Settings) -> WorkerTuning:
    """The worker's timings and retry policy from the settings."""
    return WorkerTuning(
        concurrency=settings.worker_concurrency,
        lease=timedelta(seconds=settings.lease_s),
        poll_s=settings.poll_interval_s,
        cancel_poll_s=settings.cancel_poll_s,
        drain_grace_s=settings.drain_grace_s,
        reserved_slots=settings.worker_reserved_slots,
        crash_marker=settings.fault_crash_marker,
        retry=RetryPolicy(
            max_attempts=settings.max_attempts,
            base_s=settings.retry_backoff_s,
            max_s=settings.retry_backoff_max_s,
        ),
        breakers=breaker_limits(settings),
    )


def breaker_limits(settings: Settings) -> BreakerLimits:
    """Every agent's breaker limits unless it overrides them (a setting of 0 is no limit)."""
    return BreakerLimits(
        runs_per_hour=settings.breaker_runs_per_hour or None,
        failures_in_a_row=settings.breaker_failures_in_a_row or None,
        usd_per_hour=settings.breaker_usd_per_hour or None,
    )


def _days(days: float) -> timedelta | None:
    """A retention period in days; 0 is None (kept forever)."""
    return timedelta(days=days) if days > 0 else None


def _all(callbacks: list[Callable[[], None]]) -> Callable[[], None]:
    def call() -> None:
        for callback in callbacks:
            callback()

    return call


async def _not_held(_run_id: object) -> bool:
    """No run executes in a process without a worker."""
    return False
