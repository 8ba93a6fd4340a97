"""BI-3, the injection corpus, over a real socket on both backends.

SQL, template, CRLF, log-injection and SSE-framing payloads go into every string field of a task,
a comment and an agent. Each is either stored and given back verbatim or refused with a 422
problem (a field whose pattern refuses control characters, say); never a 5xx. NUL is refused
in every field that is stored as text: PostgreSQL text cannot hold it (once a 500 there, while
SQLite stored it), so both backends refuse it alike. A task's event stream keeps its shape when
the payload is the agent's own output: a line break or `data:` inside a text delta does not
split or forge an SSE event; and a log record carrying a payload stays one JSON line.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.logs import JsonFormatter
from bullpen.store.tables import agents, routines, run_events, task_comments, tasks
from tests.support.db import count, rows
from tests.support.http import call, problem
from tests.support.servers import RunningServer
from tests.support.sse import read_events

PYTHON = "/usr/bin/python3"
# Hundreds of requests in a second or two: above the per-key limit, which is not under test.
LIMITS = {"rate_limit_key_rps": 10_000.0, "rate_limit_key_burst": 10_000}
# A process agent that writes its task's prompt to stdout as is: the payload becomes text events.
ECHO_PROMPT = (
    "import json, sys; sys.stdout.write(json.loads(sys.stdin.readline())['task']['prompt'])"
)

CORPUS = [
    # SQL
    "' OR '1'='1",
    "'; DROP TABLE tasks; --",
    '" OR 1=1 --',
    "1); SELECT pg_sleep(5); --",
    "%' UNION SELECT NULL, version() --",
    "\\'; COMMIT; DELETE FROM runs; --",
    # templates
    "{{7*7}}",
    "${7*7}",
    "{% for x in ().__class__.__base__.__subclasses__() %}{{x}}{% endfor %}",
    "<%= 7*7 %>",
    "#{7*7}",
    # CRLF and headers
    "a\r\nX-Injected: 1",
    "line\r\n\r\nHTTP/1.1 200 OK\r\n",
    # log injection
    '\n{"level":"admin","msg":"forged"}',
    '\r\n{"level":"admin"}\n',
    # SSE framing
    'data: {"forged": true}\n\n',
    "\n\nevent: close\ndata: {}\n\n",
    "id: 999.999\nretry: 1\n\n: comment\n",
    "\r\rdata: x\r\r",
    # markup and odd Unicode
    "<script>alert(1)</script>",
    "\u2028\u2029\u0085\ufeff",
    "\u202ereversed\u202c 🧨",
]
NUL = "nul\x00byte"


def padded(payload: str) -> str:
    """The payload inside a prompt long enough for the prompt's minimum."""
    return f"corpus start {payload} corpus end"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Every record logged during the test, as the server writes them off a terminal."""
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield sink
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def one_record_a_line(text: str) -> list[dict[str, object]]:
    """The log's records; each line must be one whole JSON record of a real level."""
    # Lines as log shippers cut them: at LF (U+2028 and friends are valid inside JSON).
    records = [json.loads(line) for line in text.split("\n") if line]
    assert all(r["level"] in {"debug", "info", "warning", "error", "critical"} for r in records)
    return records


def test_a_log_record_stays_one_json_line_whatever_it_carries() -> None:
    formatter = JsonFormatter()
    for payload in [*CORPUS, NUL]:
        record = logging.LogRecord(
            "bullpen.test", logging.WARNING, __file__, 1, "got %s", (payload,), None
        )
        line = formatter.format(record)
        assert "\n" not in line and "\r" not in line, repr(payload)
        assert one_record_a_line(line)[0]["message"] == f"got {payload}"


async def refused_or(reply: Any, *statuses: int) -> bool:
    """Whether the reply is one of `statuses`; a refusal must be a 422 problem, nothing else."""
    assert reply.status < 500, reply.text
    if reply.status in statuses:
        return True
    problem(reply, 422)
    return False


async def wait_ended(http: aiohttp.ClientSession, server: RunningServer, task_id: str) -> Any:
    deadline = time.monotonic() + 30
    while True:
        task = (await call(http, server, "GET", f"/api/v1/tasks/{task_id}")).body
        if task["status"] in ("done", "failed", "cancelled") or time.monotonic() > deadline:
            return task
        await asyncio.sleep(0.05)


@pytest.mark.with_settings(process_allow=PYTHON, **LIMITS)
async def test_the_corpus_is_stored_verbatim_in_tasks_and_comments_and_streams_intact(
    server: RunningServer, http: aiohttp.ClientSession, json_log: io.StringIO
) -> None:
    made = await call(
        http,
        server,
        "POST",
        "/api/v1/agents",
        body={
            "name": "echo",
            "adapter": "process",
            "config": {"command": [PYTHON, "-c", ECHO_PROMPT]},
        },
    )
    assert made.status == 201, made.text
    agent = made.body["id"]
    created: list[tuple[str, dict[str, Any]]] = []
    for payload in CORPUS:
        body: dict[str, Any] = {"prompt": padded(payload), "agent_id": agent}
        # The prompt takes anything but NUL; the title refuses control characters (422).
        reply = await call(http, server, "POST", "/api/v1/tasks", body={**body, "title": payload})
        if not await refused_or(reply, 201):
            reply = await call(http, server, "POST", "/api/v1/tasks", body=body)
            assert reply.status == 201, (payload, reply.text)
        task = reply.body
        assert task["prompt"] == body["prompt"]
        # A title is stored with surrounding whitespace stripped (documented), else verbatim.
        assert task["title"] in (payload.strip(), padded(payload).strip().splitlines()[0])
        created.append((payload, task))
        comment = await call(
            http, server, "POST", f"/api/v1/tasks/{task['id']}/comments", body={"body": payload}
        )
        assert comment.status == 201, (payload, comment.text)
        assert comment.body["body"] == payload

    for payload, task in created:
        stored = (await call(http, server, "GET", f"/api/v1/tasks/{task['id']}")).body
        assert (stored["prompt"], stored["title"]) == (task["prompt"], task["title"]), payload
        comments = await call(http, server, "GET", f"/api/v1/tasks/{task['id']}/comments")
        assert [c["body"] for c in comments.body["items"]] == [payload]
        # Looked up with the payload as a query value (a label filter): no match, no error.
        listed = await call(http, server, "GET", "/api/v1/tasks?" + urlencode({"label": payload}))
        assert listed.status in (200, 422), listed.text

    assert await count(server, tasks) == len(CORPUS)
    assert await count(server, task_comments) == len(CORPUS)
    for payload, task in created:
        ended = await wait_ended(http, server, task["id"])
        assert ended["status"] == "done", (payload, ended)
        assert ended["result"] == task["prompt"], payload
        # The stream carries exactly the run's stored events, in order, the payload whole.
        events = await read_events(
            http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
        )
        stored_events = await rows(
            server,
            sa.select(run_events.c.seq, run_events.c.kind)
            .where(run_events.c.task_id == uuid.UUID(task["id"]))
            .order_by(run_events.c.seq),
        )
        assert [(e.seq, e.event) for e in events] == [(r.seq, r.kind) for r in stored_events]
        assert "".join(e.data["text"] for e in events if e.event == "text") == task["prompt"]
    one_record_a_line(json_log.getvalue())  # whatever was logged meanwhile


@pytest.mark.with_settings(**LIMITS)
async def test_the_corpus_in_every_field_of_a_new_agent_is_stored_verbatim_or_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    fields = {
        "name": lambda p: {"name": p},
        "title": lambda p: {"title": p},
        "description": lambda p: {"description": p},
        "config.model": lambda p: {"config": {"provider": "simulated", "model": p}},
        "config.provider": lambda p: {"config": {"provider": p, "model": "sim-1"}},
        "config.system_prompt": lambda p: {
            "config": {"provider": "simulated", "model": "sim-1", "system_prompt": p}
        },
    }
    stored = 0
    for index, payload in enumerate(CORPUS):
        for field, build in fields.items():
            body = {
                "name": f"agent-{index}-{field}",
                "config": {"provider": "simulated", "model": "sim-1"},
                **build(payload),
            }
            reply = await call(http, server, "POST", "/api/v1/agents", body=body)
            if not await refused_or(reply, 201):
                continue
            stored += 1
            got = (await call(http, server, "GET", f"/api/v1/agents/{reply.body['id']}")).body
            for key, value in body.items():
                if key == "config":
                    assert {k: got["config"][k] for k in value} == value, (field, payload)
                elif key == "title":  # stripped of surrounding whitespace, as documented
                    assert got[key] == value.strip(), (field, payload)
                else:
                    assert got[key] == value, (field, payload)
    assert stored > len(CORPUS)  # the free-text fields took the corpus
    assert await count(server, agents) == 1 + stored


async def test_nul_is_refused_in_every_text_field_on_both_backends(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = str(server.boot.agent_id)
    good_task = {"prompt": padded("fine"), "agent_id": agent}
    task = await call(http, server, "POST", "/api/v1/tasks", body=good_task)
    assert task.status == 201, task.text
    task_path = f"/api/v1/tasks/{task.body['id']}"
    good_agent = {"name": "fine", "config": {"provider": "simulated", "model": "sim-1"}}
    good_routine = {
        "name": "yearly",
        "agent_id": agent,
        "cron": "0 0 1 1 *",
        "timezone": "UTC",
        "prompt": padded("fine"),
    }
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/api/v1/tasks", {**good_task, "prompt": padded(NUL)}, "prompt"),
        ("POST", "/api/v1/tasks", {**good_task, "title": NUL}, "title"),
        ("POST", f"{task_path}/comments", {"body": NUL}, "body"),
        ("PATCH", task_path, {"title": NUL}, "title"),
        ("POST", "/api/v1/agents", {**good_agent, "name": NUL}, "name"),
        ("POST", "/api/v1/agents", {**good_agent, "title": NUL}, "title"),
        ("POST", "/api/v1/agents", {**good_agent, "description": NUL}, "description"),
        (
            "POST",
            "/api/v1/agents",
            {**good_agent, "config": {**good_agent["config"], "system_prompt": NUL}},
            "system_prompt",
        ),
        ("POST", "/api/v1/routines", {**good_routine, "prompt": padded(NUL)}, "prompt"),
        ("POST", "/api/v1/routines", {**good_routine, "title": NUL}, "title"),
        ("POST", "/api/v1/routines", {**good_routine, "name": NUL}, "name"),
    ]
    for method, path, body, field in cases:
        refused = problem(await call(http, server, method, path, body=body), 422)
        assert refused["type"] == "https://bullpen.dev/problems/validation", (path, field)
        assert any(str(e["field"]).endswith(field) for e in refused["errors"]), (path, refused)
    assert await count(server, tasks) == 1
    assert await count(server, task_comments) == 0
    assert await count(server, agents) == 1
    assert await count(server, routines) == 0
    unchanged = (await call(http, server, "GET", task_path)).body
    assert unchanged["title"] == task.body["title"]
