"""Wire schemas of /api/v1/agents: agent configurations, the agent and the org chart."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StringConstraints,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from bullpen.agents.base import NO_NUL
from bullpen.agents.configs import public_config
from bullpen.agents.http import SECRET_CHARS, HttpAgentConfig, WebhookSecret
from bullpen.agents.llm import APPROVAL_TOOLS_MAX, LOOP_REPEATS, MAX_STEPS, MAX_WALL_S, TOOL_NAME
from bullpen.agents.mcp import GRANT_TOOLS_MAX, GRANTS_MAX, SERVER_NAME
from bullpen.agents.process import ProcessAgentConfig
from bullpen.api.schemas.common import Strict, integral, optional
from bullpen.domain.access import Permission
from bullpen.domain.agents import AgentStatus
from bullpen.domain.approvals import TTL_MAX_S as APPROVAL_TTL_MAX_S
from bullpen.domain.approvals import TTL_MIN_S as APPROVAL_TTL_MIN_S
from bullpen.domain.breakers import BreakerLimits
from bullpen.domain.principal import Principal
from bullpen.domain.records import AgentRecord

SYSTEM_PROMPT_MAX = 20_000
DESCRIPTION_MAX = 20_000
MAX_TOKENS_MAX = 1_000_000
RUNS_MIN, RUNS_MAX = 1, 1000
RUNS_PER_HOUR_MAX, FAILURES_MAX, USD_PER_HOUR_MAX = 10_000_000, 100_000, 1_000_000.0

# Printable, no control characters, no leading or trailing whitespace.
_WORD = r"^[^\x00-\x20\x7f]([^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"
# Multi-line text: tabs and line breaks allowed, other control characters not.
_PROSE = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"

AgentName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$"),
]
AgentTitle = Annotated[
    str, StringConstraints(max_length=200, strip_whitespace=True, pattern=r"^[^\x00-\x1f\x7f]*$")
]


Description = Annotated[str, StringConstraints(max_length=DESCRIPTION_MAX, pattern=_PROSE)]

# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
MaxRuns = Annotated[int, Field(ge=RUNS_MIN, le=RUNS_MAX, strict=True), BeforeValidator(integral)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_MAX, strict=True), BeforeValidator(integral)]
MaxSteps = Annotated[int, Field(ge=1, le=1000, strict=True), BeforeValidator(integral)]
LoopRepeats = Annotated[int, Field(ge=2, le=1000, strict=True), BeforeValidator(integral)]


ApprovalTtl = Annotated[
    int, Field(ge=APPROVAL_TTL_MIN_S, le=APPROVAL_TTL_MAX_S, strict=True), BeforeValidator(integral)
]


class ApprovalDefault(StrEnum):
    """What an approval that expires undecided decides."""

    APPROVE = "approve"
    DENY = "deny"


class Adapter(StrEnum):
    """How an agent runs: a model's tool loop, a webhook, or a local command."""

    LLM = "llm"
    HTTP = "http"
    PROCESS = "process"


class SettableStatus(StrEnum):
    """The statuses a caller may set (`terminated` is not one)."""

    ACTIVE = AgentStatus.ACTIVE.value
    PAUSED = AgentStatus.PAUSED.value


ArgName = Annotated[str, StringConstraints(min_length=1, max_length=64)]  # any JSON key
McpToolName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_WORD)]
Scalar = Annotated[str, StringConstraints(max_length=1000)] | int | float | bool


class ArgLimitIn(Strict):
    """Limits on one argument of a tool's calls, checked before a call is made (a refused
    call's result tells the model why)."""

    max_length: (
        Annotated[int, Field(ge=1, le=1_000_000, strict=True), BeforeValidator(integral)] | None
    ) = Field(default=None, description="Characters of a string (or of another value's JSON).")
    minimum: Annotated[float, Field(allow_inf_nan=False)] | None = None
    maximum: Annotated[float, Field(allow_inf_nan=False)] | None = None
    enum: Annotated[list[Scalar], Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="The only values allowed."
    )


class McpToolIn(Strict):
    """A tool the agent may call, with limits on its calls."""

    name: McpToolName
    max_chars: (
        Annotated[int, Field(ge=2, le=1_000_000, strict=True), BeforeValidator(integral)] | None
    ) = Field(default=None, description="Characters of the call's arguments (JSON).")
    arguments: Annotated[dict[ArgName, ArgLimitIn], Field(max_length=32)] | None = None


class McpGrantIn(Strict):
    """An MCP server an `llm` agent may use, and which of its tools."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "server": "files",
                    "tools": [
                        "read_file",
                        {"name": "search", "arguments": {"limit": {"maximum": 20}}},
                    ],
                }
            ]
        },
    )

    server: Annotated[str, StringConstraints(pattern=SERVER_NAME)]
    tools: Annotated[list[McpToolName | McpToolIn], Field(min_length=1, max_length=GRANT_TOOLS_MAX)]


class LlmAgentConfig(Strict):
    """An `llm` agent's configuration: which model it calls, and how."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_WORD)] = Field(
        examples=["sim-1"],
        description="A model route of the workspace, `provider/model`, or a model that one "
        "provider offers; with `provider`, that provider's model name.",
    )
    provider: (
        Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_WORD)] | None
    ) = Field(
        default=None,
        examples=["simulated"],
        description="Call this provider directly (no fallback); omit to resolve `model`.",
    )
    system_prompt: (
        Annotated[str, StringConstraints(max_length=SYSTEM_PROMPT_MAX, pattern=_PROSE)] | None
    ) = Field(default=None, description="Omit for Bullpen's default system prompt.")
    max_tokens: MaxTokens | None = Field(
        default=None, description="Cap on each completion's output tokens; omit for none."
    )
    max_steps: MaxSteps | None = Field(
        default=None, description=f"Tool steps per run (default {MAX_STEPS}); beyond, it fails."
    )
    max_wall_s: Annotated[float, Field(gt=0, le=86_400, strict=True)] | None = Field(
        default=None, description=f"Wall time per run in seconds (default {MAX_WALL_S:g})."
    )
    max_cost_usd: Annotated[float, Field(gt=0, le=1_000_000, strict=True)] | None = Field(
        default=None, description="Provider cost per run in USD; no limit when omitted."
    )
    loop_repeats: LoopRepeats | None = Field(
        default=None,
        description=f"The same tool call (same arguments) made this often on a task is a "
        f"runaway loop and stops the run (default {LOOP_REPEATS}).",
    )
    approval_tools: (
        Annotated[
            list[Annotated[str, StringConstraints(pattern=TOOL_NAME)]],
            Field(max_length=APPROVAL_TOOLS_MAX),
        ]
        | None
    ) = Field(
        default=None,
        description="Tools (e.g. `delegate`, or an MCP tool as `<server>__<tool>`) whose "
        "calls wait for an approval: the run pauses at the call (the task "
        "`awaiting_approval`) and resumes there after the decision; a denied call's result "
        "tells the model it was denied, and why.",
    )
    mcp: Annotated[list[McpGrantIn], Field(max_length=GRANTS_MAX)] | None = Field(
        default=None,
        description="MCP servers of the workspace (by name) and the tools of each this agent "
        "may call: they are offered to the model as `<server>__<tool>` beside the built-in "
        "tools; any other tool of the server is refused.",
    )


AgentConfig = LlmAgentConfig | HttpAgentConfig | ProcessAgentConfig
_CONFIG_OF: dict[Adapter, type[BaseModel]] = {
    Adapter.LLM: LlmAgentConfig,
    Adapter.HTTP: HttpAgentConfig,
    Adapter.PROCESS: ProcessAgentConfig,
}


def _config_for(value: Any, adapter: Adapter | None) -> BaseModel:
    """Validate a config as the given adapter's (or, not knowing it, the one its keys name),
    so errors point at `config.<field>`."""
    if adapter is None:
        keys = value.keys() if isinstance(value, dict) else ()
        adapter = (
            Adapter.HTTP if "url" in keys else Adapter.PROCESS if "command" in keys else Adapter.LLM
        )
    kind = _CONFIG_OF[adapter]
    return value if isinstance(value, kind) else kind.model_validate(value)


class Breakers(Strict):
    """An agent's breaker overrides: a limit left out keeps the instance's default
    (`BULLPEN_BREAKER_*`), `null` is no limit for this agent. Crossing one pauses the agent."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"runs_per_hour": 200, "usd_per_hour": 5.0}]},
    )

    runs_per_hour: (
        Annotated[int, Field(ge=1, le=RUNS_PER_HOUR_MAX, strict=True), BeforeValidator(integral)]
        | None
    ) = Field(default=None, description="Runs the agent may start within any hour.")
    failures_in_a_row: (
        Annotated[int, Field(ge=1, le=FAILURES_MAX, strict=True), BeforeValidator(integral)] | None
    ) = Field(default=None, description="Runs that may fail in a row (a `done` run resets).")
    usd_per_hour: Annotated[float, Field(gt=0, le=USD_PER_HOUR_MAX, allow_inf_nan=False)] | None = (
        Field(default=None, description="USD the agent's LLM calls may cost within an hour.")
    )


class BreakerLimitsPublic(BaseModel):
    """The breaker limits that apply to an agent (its overrides over the defaults); `null` is
    no limit."""

    runs_per_hour: int | None
    failures_in_a_row: int | None
    usd_per_hour: float | None


class _AgentFields(Strict):
    """What every new agent has, whatever its adapter."""

    name: AgentName = Field(description="Unique in the workspace.")
    title: AgentTitle = ""
    max_concurrent_runs: MaxRuns = Field(default=10, description="Runs of this agent at once.")
    status: SettableStatus = Field(
        default=SettableStatus.ACTIVE, description="A paused agent takes no new tasks."
    )
    description: Description = Field(
        default="", description="What the agent does; an `llm` agent gets it as instructions."
    )
    reports_to: UUID | None = Field(
        default=None,
        description="The agent's manager in the org chart (an agent of the workspace); the "
        "manager may delegate subtasks to it.",
    )
    requires_approval: bool = Field(
        default=False,
        description="Each new task of the agent waits in `awaiting_approval` (no run) until an "
        "approver approves it (then it is queued) or denies it (then it is cancelled).",
    )
    approval_ttl_s: ApprovalTtl | None = Field(
        default=None,
        description="Seconds an approval of this agent waits for a decision before it expires "
        "with `approval_default`; omitted: `BULLPEN_APPROVAL_TTL_S`.",
    )
    approval_default: ApprovalDefault | None = Field(
        default=None,
        description="What an expired approval of this agent decides: `approve` or `deny` "
        "(omitted: `deny`).",
    )
    breakers: Breakers | None = Field(
        default=None, description="Overrides of the instance's breaker limits; omit for none."
    )


class LlmAgentCreate(_AgentFields):
    """A new `llm` agent: a tool loop over the gateway."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "analyst",
                    "title": "Data analyst",
                    "config": {"provider": "simulated", "model": "sim-1"},
                }
            ]
        },
    )

    adapter: Literal["llm"] = "llm"
    config: LlmAgentConfig


class NewHttpAgentConfig(HttpAgentConfig):
    """A new `http` agent's config: its `secret` is required."""

    secret: WebhookSecret = Field(
        min_length=SECRET_CHARS[0],
        max_length=SECRET_CHARS[1],
        json_schema_extra={"pattern": NO_NUL},
        description="The key of each request's HMAC-SHA256 signature (`Bullpen-Signature`), "
        "without NUL characters; never shown again (the config shows `secret_hint`).",
    )


class HttpAgentCreate(_AgentFields):
    """A new `http` agent: a webhook Bullpen calls with each run."""

    adapter: Literal["http"]
    config: NewHttpAgentConfig


class ProcessAgentCreate(_AgentFields):
    """A new `process` agent: a command the operator allows, run on the worker's machine."""

    adapter: Literal["process"]
    config: ProcessAgentConfig


_CREATE_VARIANTS: TypeAdapter[Any] = TypeAdapter(
    LlmAgentCreate | HttpAgentCreate | ProcessAgentCreate
)


class AgentCreate(_AgentFields):
    """A new agent: `adapter` (default `llm`) and that adapter's `config`.

    Documented as one schema per adapter, as it is validated: a config of another adapter
    than the one named is refused at `config.<field>`.
    """

    adapter: Adapter = Adapter.LLM
    config: AgentConfig

    @field_validator("config", mode="wrap")
    @classmethod
    def _config_of_adapter(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        adapter = info.data.get("adapter")
        if adapter is Adapter.HTTP:  # a new webhook agent needs its secret
            return (
                value
                if isinstance(value, NewHttpAgentConfig)
                else (NewHttpAgentConfig.model_validate(value))
            )
        return _config_for(value, adapter)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(_CREATE_VARIANTS.core_schema)


class AgentUpdate(Strict):
    """Change an agent (send only what changes; `config` is replaced as a whole)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"status": "paused"}, {"title": "Lead analyst"}]},
    )

    name: AgentName = optional()
    title: AgentTitle = optional()
    config: AgentConfig = optional(
        "Replaces the whole config (of the agent's adapter; an `http` agent's secret is kept "
        "when left out, and a `process` agent's `secret_env` while its `command`, `cwd` and "
        "`env` stay the same)."
    )

    @field_validator("config", mode="wrap")
    @classmethod
    def _config_by_keys(cls, value: Any, handler: Any) -> Any:
        return _config_for(value, None)

    max_concurrent_runs: MaxRuns = optional()
    status: SettableStatus = optional("`active` or `paused`.")
    description: Description = optional()
    reports_to: UUID | None = Field(
        default=None, description="The new manager, or `null` for none (a root of the chart)."
    )
    requires_approval: bool = optional("Whether each new task waits for an approval.")
    approval_ttl_s: ApprovalTtl | None = Field(
        default=None,
        description="Seconds before an undecided approval expires, or `null` for "
        "`BULLPEN_APPROVAL_TTL_S`.",
    )
    approval_default: ApprovalDefault | None = Field(
        default=None, description="What an expired approval decides, or `null` for `deny`."
    )
    breakers: Breakers = optional(
        "Replaces the agent's breaker overrides as a whole (`{}`: the defaults for all)."
    )


class AgentPublic(BaseModel):
    """An agent as the API shows it."""

    id: UUID
    name: str
    title: str
    adapter: str = Field(examples=["llm"])
    config: dict[str, Any] = Field(
        description="The adapter's config without its secrets: an `http` agent's shows "
        "`secret_hint`; a `process` agent's shows `secret_env_hints`, and `env` with its values "
        "only to callers with `agents:write` (others get `env_names` and `secret_env_names`)."
    )
    status: str = Field(examples=["active"], description="`active`, `paused` or `terminated`.")
    max_concurrent_runs: int
    description: str
    reports_to: UUID | None
    requires_approval: bool = Field(description="Each new task waits for an approval.")
    approval_ttl_s: int | None = Field(
        description="Seconds before an undecided approval expires (`null`: the server's "
        "`BULLPEN_APPROVAL_TTL_S`)."
    )
    approval_default: str | None = Field(
        description="What an expired approval decides (`null`: `deny`)."
    )
    created_at: datetime
    breakers: dict[str, Any] = Field(
        description="The agent's breaker overrides as set (see `breaker_limits` for what applies)."
    )
    breaker_limits: BreakerLimitsPublic
    paused_reason: str | None = Field(
        description="Why a breaker paused the agent; `null` once resumed (or if a person "
        "paused it)."
    )

    @classmethod
    def from_row(cls, row: AgentRecord, principal: Principal, limits: BreakerLimits) -> AgentPublic:
        """Build from an `agents` row, as `principal` may see it, with its breaker limits."""
        return cls(
            id=row.id,
            name=row.name,
            title=row.title,
            adapter=row.adapter,
            config=public_config(
                row.adapter, row.config, values=principal.can(Permission.AGENTS_WRITE)
            ),
            status=row.status,
            max_concurrent_runs=row.max_concurrent_runs,
            description=row.description,
            reports_to=row.reports_to,
            requires_approval=row.requires_approval,
            approval_ttl_s=row.approval_ttl_s,
            approval_default=row.approval_default,
            created_at=row.created_at,
            breakers=row.breakers or {},
            breaker_limits=BreakerLimitsPublic(**limits.as_dict()),
            paused_reason=row.paused_reason,
        )


class OrgNode(BaseModel):
    """An agent in the org chart, with the agents reporting to it."""

    id: UUID
    name: str
    title: str
    adapter: str
    status: str
    reports: list[OrgNode]


class OrgChart(BaseModel):
    """The workspace's org chart: the agents reporting to nobody, each with its reports,
    every level ordered by name."""

    roots: list[OrgNode]


def org_chart(rows: Sequence[Any]) -> OrgChart:
    """Nest the agents by `reports_to` (the service keeps the chart free of cycles)."""
    nodes = {
        row.id: OrgNode(
            id=row.id,
            name=row.name,
            title=row.title,
            adapter=row.adapter,
            status=row.status,
            reports=[],
        )
        for row in rows
    }
    roots: list[OrgNode] = []
    for row in rows:  # rows come ordered by name, so every level is
        manager = nodes.get(row.reports_to) if row.reports_to is not None else None
        (manager.reports if manager is not None else roots).append(nodes[row.id])
    return OrgChart(roots=roots)


class AgentList(BaseModel):
    """The workspace's agents by name."""

    items: list[AgentPublic]
