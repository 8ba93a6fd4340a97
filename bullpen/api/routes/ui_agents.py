"""The dashboard's agents page: the list with today's figures and budgets, the org chart, a
form per adapter to create or edit an agent (validated by the API's own schemas, so its
errors read the same), and pause, resume and terminate behind a confirmation that works
without JavaScript.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import Found, form_session, message, page, page_session, refused
from bullpen.api.schemas.agents import AgentCreate, AgentUpdate, org_chart
from bullpen.app import Services
from bullpen.domain.agents import AgentStatus
from bullpen.domain.budgets import BudgetScope
from bullpen.errors import BullpenError, Forbidden, InvalidInput

router = APIRouter(include_in_schema=False)

SECTION = "agents"
ADAPTERS = ("llm", "http", "process")
# What each lifecycle button does, and what its confirmation says.
LIFECYCLE = {
    "pause": (AgentStatus.PAUSED, "It claims no new runs; runs already running finish."),
    "resume": (AgentStatus.ACTIVE, "It takes new tasks again."),
    "terminate": (
        AgentStatus.TERMINATED,
        "Its open tasks are cancelled, its keys revoked, and it can never run again.",
    ),
}


def _validation_message(err: ValidationError) -> str:
    """The API's field errors (`loc: msg`), as one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _number(text: str) -> Any:
    """A form's number as the API would receive it: an int, a float, or the text (refused)."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def config_of(adapter: str, form: dict[str, str]) -> dict[str, Any]:
    """The adapter's config from its form fields; fields left empty are left out."""
    config: dict[str, Any] = {}
    if adapter == "llm":
        for key in ("model", "provider", "system_prompt"):
            if form.get(key, "").strip():
                config[key] = form[key].strip() if key != "system_prompt" else form[key]
        if form.get("max_tokens", "").strip():
            config["max_tokens"] = _number(form["max_tokens"])
    elif adapter == "http":
        if form.get("url", "").strip():
            config["url"] = form["url"].strip()
        if form.get("secret", ""):
            config["secret"] = form["secret"]
        if form.get("timeout_s", "").strip():
            config["timeout_s"] = _number(form["timeout_s"])
    elif adapter == "process":
        config["command"] = _lines(form.get("command", ""))
        if form.get("timeout_s", "").strip():
            config["timeout_s"] = _number(form["timeout_s"])
    return config


async def _agents(
    request: Request,
    svc: Services,
    found: Found,
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    now = svc.clock()
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    try:
        rows = await svc.agents.list(principal)
        activity = await svc.agents.activity(principal, today)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    try:
        budgets = {
            b.agent_id: b
            for b in await svc.budgets.list(principal)
            if b.scope == BudgetScope.AGENT and b.agent_id is not None
        }
    except Forbidden:  # a key without the costs scope: the page shows no budgets
        budgets = {}
    return await page(
        request,
        svc,
        found,
        "agents.html",
        section=SECTION,
        status=status,
        error=error,
        form=form or {},
        agents=rows,
        names={a.id: a.name for a in rows},
        chart=org_chart(rows).roots,
        activity=activity,
        budgets=budgets,
        adapters=ADAPTERS,
    )


@router.get("/agents", response_class=HTMLResponse, response_model=None)
async def agents_page(request: Request, svc: ServicesDep) -> Response:
    """Every agent with today's runs, success rate, median TTFT and spend; the org chart."""
    found = await page_session(request, svc)
    return await _agents(request, svc, found)


def _common(form: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "title": form.get("title", ""),
        "description": form.get("description", ""),
        "max_concurrent_runs": _number(form.get("max_concurrent_runs", "") or "10"),
        "reports_to": form.get("reports_to") or None,
    }
    return body


async def _form(request: Request) -> dict[str, str]:
    data = await request.form()
    return {k: v for k, v in data.items() if isinstance(v, str)}


@router.post("/ui/agents", response_model=None)
async def create_agent(request: Request, svc: ServicesDep) -> Response:
    """Create an agent from the form of its adapter, validated as the API validates it."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    adapter = form.get("adapter", "")
    if adapter not in ADAPTERS:
        bad = InvalidInput(f"adapter: one of {', '.join(ADAPTERS)}")
        return await message(request, svc, found, bad, section=SECTION)
    kept = {k: v for k, v in form.items() if k not in {"csrf", "secret"}}
    try:
        body = AgentCreate.model_validate(
            {
                **_common(form),
                "adapter": adapter,
                "requires_approval": form.get("requires_approval") == "on",
                "config": config_of(adapter, form),
            }
        )
        await svc.agents.create(
            found[1].principal,
            name=body.name,
            title=body.title,
            adapter=body.adapter.value,
            config=body.config,
            max_concurrent_runs=body.max_concurrent_runs,
            status=body.status.value,
            description=body.description,
            reports_to=body.reports_to,
            requires_approval=body.requires_approval,
        )
    except ValidationError as err:
        error = _validation_message(err)
        return await _agents(request, svc, found, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _agents(request, svc, found, status=err.status, error=err.detail, form=kept)
    return RedirectResponse("/agents", status_code=303)


@router.get("/agents/{agent_id}", response_class=HTMLResponse, response_model=None)
async def agent_page(agent_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """One agent's edit form (its adapter's fields) and lifecycle buttons."""
    found = await page_session(request, svc)
    return await _agent(request, svc, found, agent_id)


async def _agent(
    request: Request,
    svc: Services,
    found: Found,
    agent_id: UUID,
    *,
    status: int = 200,
    error: str | None = None,
    confirm: str | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    try:
        agent = await svc.agents.get(principal, agent_id)
        others = [a for a in await svc.agents.list(principal) if a.id != agent_id]
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    return await page(
        request,
        svc,
        found,
        "agent.html",
        section=SECTION,
        status=status,
        error=error,
        agent=agent,
        others=others,
        confirm=confirm,
        confirm_text=LIFECYCLE[confirm][1] if confirm else "",
    )


@router.post("/ui/agents/{agent_id}", response_model=None)
async def update_agent(agent_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """Change an agent from its edit form, validated as the API's PATCH is."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    principal = found[1].principal
    try:
        agent = await svc.agents.get(principal, agent_id)
        body = AgentUpdate.model_validate(
            {
                **{k: v for k, v in _common(form).items() if k != "reports_to"},
                "config": config_of(agent.adapter, form),
            }
        )
        changes = body.model_dump(exclude_unset=True)
        changes["config"] = body.config
        changes["reports_to"] = UUID(form["reports_to"]) if form.get("reports_to") else None
        await svc.agents.update(principal, agent_id, changes)
    except ValidationError as err:
        error = _validation_message(err)
        return await _agent(request, svc, found, agent_id, status=422, error=error)
    except ValueError:
        error = "reports_to: not an agent id"
        return await _agent(request, svc, found, agent_id, status=422, error=error)
    except BullpenError as err:
        await refused(request, err)
        return await _agent(request, svc, found, agent_id, status=err.status, error=err.detail)
    return RedirectResponse(f"/agents/{agent_id}", status_code=303)


@router.post("/ui/agents/{agent_id}/{op}", response_model=None)
async def agent_lifecycle(
    agent_id: UUID,
    op: str,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Pause, resume or terminate: the first post asks for confirmation, the second acts."""
    found = await form_session(request, svc, csrf)
    if op not in LIFECYCLE:
        bad = InvalidInput(f"unknown action {op!r}")
        return await message(request, svc, found, bad, section=SECTION)
    if confirmed != "yes":
        return await _agent(request, svc, found, agent_id, confirm=op)
    principal = found[1].principal
    status = LIFECYCLE[op][0]
    try:
        await svc.agents.set_status(principal, agent_id, status)
        if status == AgentStatus.TERMINATED:  # as the API's terminate does
            await svc.tasks.cancel_open_of_agent(principal, agent_id)
    except BullpenError as err:
        await refused(request, err)
        return await _agent(request, svc, found, agent_id, status=err.status, error=err.detail)
    return RedirectResponse(f"/agents/{agent_id}", status_code=303)
