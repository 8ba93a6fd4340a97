"""schemathesis hooks for the BI-1 fuzz run; the CLI loads this file (`hooks = "<path>"`).

- `filter_failure` drops one precisely described kind of false positive: something the OpenAPI
  document cannot express. Never broaden it into "ignore this check" or "ignore this operation".
- `before_call` keeps the fuzzer from deleting or changing the seeded tenant it authenticates as,
  sends the doomed workspace's own key with its deletion, makes each `Idempotency-Key`
  unique per distinct request, as its contract asks, and gives half of the invitation answers
  and revocations a real invitation, and half of the approval decisions a pending approval.
- `event_stream_ends` adds a check schemathesis cannot know about: Bullpen's streams end.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import schemathesis
from pydantic import TypeAdapter, ValidationError

from bullpen.api import instants
from bullpen.api.schemas.gateway import BaseUrl
from bullpen.api.schemas.mcp_servers import RESERVED_HEADERS
from bullpen.errors import InvalidInput
from bullpen.security.outbound import OutboundAllow, check_url
from bullpen.services.routines import first_slot

# The seeded tenant's ids (workspace, users, API keys, agents), comma-separated, set by the test.
PROTECTED_IDS_ENV = "BULLPEN_FUZZ_PROTECTED_IDS"
# The workspace the test seeded to be deleted, and its owner's key (the only key that can).
DOOMED_WORKSPACE_ENV = "BULLPEN_FUZZ_DOOMED_WORKSPACE"
DOOMED_KEY_ENV = "BULLPEN_FUZZ_DOOMED_KEY"
FUZZ_KEY_ENV = "BULLPEN_FUZZ_KEY"
# The seeded agent, which the fuzzer's routines and tasks name.
AGENT_ENV = "BULLPEN_FUZZ_AGENT"
# The workspace the fuzzer's key acts in.
OWN_WORKSPACE_ENV = "BULLPEN_FUZZ_OWN_WORKSPACE"
# Invitations (issue 19): per answer (`accept`, `decline`) the key of the owner of a workspace
# that invites the fuzzer's user; the fuzzer's email, user id and the server's base URL.
INVITER_KEY_ENV = "BULLPEN_FUZZ_{verb}_INVITER"
FUZZ_EMAIL_ENV = "BULLPEN_FUZZ_EMAIL"
UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
FUZZ_USER_ENV = "BULLPEN_FUZZ_USER"
# An agent of the fuzzer's workspace that requires approval: each task of it is a new approval.
GATED_AGENT_ENV = "BULLPEN_FUZZ_GATED_AGENT"
BASE_URL_ENV = "BULLPEN_FUZZ_BASE_URL"
# The seeded provider (the built-in simulator's endpoint under another name): the only one a
# provider check may call.
SEEDED_PROVIDER_ENV = "BULLPEN_FUZZ_PROVIDER"
# Stands in for a protected id: well-formed, and no row has it, so the answer is a plain 404.
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
MUTATING = frozenset({"DELETE", "PATCH", "PUT"})
# Renaming the seeded workspace, or changing a seeded routine or budget, harms nothing, and
# PATCH is how their one operation is reached (a routine the fuzzer creates is rare: most
# bodies it makes are refused).
CHANGEABLE = frozenset({"workspace_id", "routine_id", "budget_id"})
IDEMPOTENCY_KEY = "idempotency-key"
# A key the API accepts: 1-255 printable ASCII characters.
VALID_KEY = re.compile(r"[ -~]{1,255}")
DIGEST_CHARS = 16

# Failure code of `positive_data_acceptance` ("Schema-valid request rejected").
REJECTED_POSITIVE_DATA = "ST202"
DROPPED_LOG = "dropped-failures.jsonl"
# The provider the test seeded, and the schema's patterns of a route link's two fields.
SEEDED_LINK = {"provider": "fuzz-sim", "model": "sim-1"}
SEEDED_MODEL = SEEDED_LINK["model"]
LINK_PROVIDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
LINK_MODEL = re.compile(r"[^\x00-\x20\x7f]([^\x00-\x1f\x7f]{0,198}[^\x00-\x20\x7f])?")
# API keys expire in the future and at most this far ahead (a rule relative to now).
MAX_KEY_LIFETIME = timedelta(days=366)


@schemathesis.check
def event_stream_ends(ctx: Any, response: Any, case: Any) -> bool | None:
    """An SSE response ends by itself within the request timeout.

    schemathesis reads an event stream until it ends or the request timeout passes, and treats
    both as fine. Bullpen's stream of a task ends after its run's `end` event (and the fuzz
    server's simulated runs take ~0.3 s), so one still open at the timeout has hung, unless
    its task has no run under way: one awaiting an approval, or blocked.
    """
    content_type = response.headers.get("content-type", [""])
    if isinstance(content_type, list):
        content_type = content_type[0] if content_type else ""
    if content_type.split(";", 1)[0].strip() != "text/event-stream":
        return None
    if case.operation.path == "/api/v1/events":
        return None  # the workspace's stream is documented to stay open
    if getattr(response, "stream_cut_short", False):
        status = _task_status(case)
        if status in WAITING:
            return None  # no run to end: it waits for an approver or for other tasks
        raise AssertionError(
            "The event stream was still open when the request timeout passed; "
            f"it should end after the run's `end` event (task status: {status})."
        )
    return None


# Task statuses with no run under way: their streams stay open until someone or something acts.
WAITING = frozenset({"awaiting_approval", "blocked"})


def _task_status(case: Any) -> str | None:
    """The status of the task whose stream `case` read, asked of the server after the fact."""
    task_id = (case.path_parameters or {}).get("task_id")
    if not isinstance(task_id, str) or not UUID_TEXT.fullmatch(task_id):
        return None
    task = _call(
        "GET", f"{os.environ[BASE_URL_ENV]}/api/v1/tasks/{task_id}", os.environ[FUZZ_KEY_ENV]
    )
    return task.get("status") if isinstance(task, dict) else None


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except a 422 for valid-looking input that JSON Schema cannot rule out.

    Only `positive_data_acceptance` failures (ST202) answered 422 are considered, and one is
    dropped only when every entry of the problem's `errors` is one of these:

    - `since` (query) of `/api/v1/costs/latency`, when the range really is longer than 366 days
      (two fields, one against the other).
    - `cursor` (query): opaque; a valid one is whatever an earlier page returned as
      `next_cursor` (docs/api.md, Limits: "must be one the API issued").
    - `expires_at` (body) of an API key, when the sent value really is outside (now, now + 366
      days]: a window relative to the current time, which JSON Schema cannot express.
    - `models` (body) of a provider, when two entries really share a `name`: uniqueness of one
      property of array items, which JSON Schema cannot express (`uniqueItems` compares whole
      items).
    - an agent's `config.command.0` not on the operator's `BULLPEN_PROCESS_ALLOW`, a
      `config.url` the API's own outbound check refuses (non-public addresses, hosts that do
      not parse): server settings and address facts a schema cannot carry. (Environment names
      off `BULLPEN_PROCESS_ENV_ALLOW` are checked after the command, so never reached here.)
      The same for a provider's `base_url`, and its `api_key` when a change of `base_url` to
      another origin leaves it out (a key goes only where it was given for: it depends on the
      stored provider).
    - `config` (body) of an agent change, refused as another adapter's config: the valid
      config depends on the stored agent's adapter, which a schema of the request cannot know.
    - `cron` or `timezone` (body) of a routine, when the API's own check really refuses it: which
      cron expressions can fire and which IANA time zones exist, which JSON Schema cannot express.
    - `agent_id`, `api_key_id` or `task_id` (body) of a new budget that its `scope` does not
      name, or missing where it does: one field required by the value of another.
    - `since` or `until` (query) of the audit log that the API's own check refuses: a
      date-time that leaves datetime's range once moved to UTC, or an `until` before `since`
      (an order between two fields, which JSON Schema cannot express).
    - `model` (body) of a relay call that is not printable (`str.isprintable`: no control,
      separator, format or unassigned characters): Unicode categories, which the regular
      expressions of JSON Schema cannot name.

    So a 422 for any other field, or for a cursor mixed with another field, still fails the run.
    Each dropped failure is logged to `DROPPED_LOG` in the working directory (the test's tmp dir).
    """
    if getattr(failure, "code", None) != REJECTED_POSITIVE_DATA or response.status_code != 422:
        return True
    errors = _problem_errors(response.content)
    if not (errors and all(_excused(error, case) for error in errors)):
        return True
    with open(DROPPED_LOG, "a", encoding="utf-8") as log:
        fields = sorted(f"{e.get('location')}.{e.get('field')}" for e in errors)
        log.write(json.dumps({"operation": case.operation.label, "fields": fields}) + "\n")
    return False


def _problem_errors(content: bytes | None) -> list[Any]:
    try:
        errors = json.loads(content or b"null")["errors"]
    except (ValueError, TypeError, KeyError):
        return []
    return errors if isinstance(errors, list) else []


def _longer_than_a_year(query: dict[str, Any]) -> bool:
    """Whether `since` to `until` (default: 30 days before it, and now) spans more than the
    366 days the latency API answers: a relation of two fields, which JSON Schema cannot
    express."""

    def instant(name: str) -> datetime | None:
        value = query.get(name)
        if value is None:
            return None
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)

    try:
        until = instant("until") or datetime.now(UTC)
        since = instant("since") or until - timedelta(days=30)
    except ValueError:
        return False
    return until - since > timedelta(days=366)


def _excused(error: Any, case: Any) -> bool:
    if not isinstance(error, dict):
        return False
    where = (error.get("location"), error.get("field"))
    if where == ("query", "cursor"):
        return "cursor" in (case.query or {})
    if where == ("query", "since") and error.get("code") == "range":
        return case.path == "/api/v1/costs/latency" and _longer_than_a_year(case.query or {})
    if where == ("body", "expires_at"):
        return _outside_key_lifetime(case.body)
    if where == ("body", "models"):
        return _repeated_model_names(case.body)
    config = case.body.get("config") if isinstance(case.body, dict) else None
    if where == ("body", "config.command.0") and error.get("code") == "not_allowed":
        return True  # the operator's BULLPEN_PROCESS_ALLOW (empty on the fuzz server)
    if where == ("body", "config.url") and isinstance(config, dict):
        return _refused_url(config.get("url"))
    body = case.body if isinstance(case.body, dict) else {}
    if where == ("body", "base_url"):
        return _refused_url(body.get("base_url"))
    if where == ("body", "api_key") and error.get("code") == "required_for_new_origin":
        return "base_url" in body and "api_key" not in body
    if case.path.startswith("/api/v1/mcp-servers"):
        return _excused_mcp(where, error, case, body)
    if where == ("body", "config") and error.get("code") == "adapter_mismatch":
        # PATCH /agents/{id}: a config is valid only for the adapter the stored agent has.
        return case.method.upper() == "PATCH"
    if where == ("body", "model") and case.path == "/v1/chat/completions":
        model = body.get("model")
        return isinstance(model, str) and not model.isprintable()
    if error.get("code") == "scope_target" and case.path == "/api/v1/budgets":
        return True  # which target field a budget needs depends on its `scope`
    if error.get("code") == "amount_kind" and case.path.startswith("/api/v1/approvals/"):
        return True  # whether an approval takes `amount_usd` depends on its kind
    if where in (("body", "cron"), ("body", "timezone")):
        return _refused_schedule(where[1], case.body)
    if (
        where in (("query", "since"), ("query", "until"))
        and error.get("code") in ("range", "datetime_range")
        and case.path.startswith("/api/v1/audit-events")
    ):
        return _refused_range(case.query or {})
    return False


def _refused_range(query: dict[str, Any]) -> bool:
    """Whether the API's own check refuses the query's `since` and `until` (each already a
    date-time by the schema)."""
    try:
        instants.time_range(
            *(instants.parse(str(query.get(field) or ""), field) for field in ("since", "until"))
        )
    except InvalidInput:
        return True
    return False


def _refused_url(url: Any) -> bool:
    """Whether the API's own check refuses to call the url (a non-public address, a host that
    does not parse as one), with no allow-list."""
    if not isinstance(url, str):
        return False
    try:
        check_url(url, OutboundAllow.parse(""))
    except InvalidInput:
        return True
    return False


def _refused_schedule(field: str, body: Any) -> bool:
    """Whether the API's own schedule check refuses the body's `cron` or `timezone`."""
    value = body.get(field) if isinstance(body, dict) else None
    if not isinstance(value, str):
        return False
    cron, timezone = (value, "UTC") if field == "cron" else ("0 0 1 1 *", value)
    try:
        first_slot(cron, timezone, datetime.now(UTC))
    except InvalidInput:
        return True
    return False


def _repeated_model_names(body: Any) -> bool:
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return False
    names = [m.get("name") for m in models if isinstance(m, dict)]
    return len(names) != len(set(names))


def _outside_key_lifetime(body: Any) -> bool:
    value = body.get("expires_at") if isinstance(body, dict) else None
    if not isinstance(value, str):
        return False
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    # A minute of slack either side: the server checked at its own "now".
    slack = timedelta(minutes=1)
    return when <= now + slack or when > now + MAX_KEY_LIFETIME - slack


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    """Runs before every request of every phase; edits the case in place (checks see the edit)."""
    _loopback_mcp_url(case)
    _fresh_mcp_server(case)
    _seeded_provider_check(case)
    _spare_seeded_tenant(case)
    _doomed_workspace_key(case)
    _unique_idempotency_key(case)
    _seeded_route_links(case)
    _own_workspace(case)
    _fresh_invitation(case)
    _fresh_approval(case)
    _fresh_routine(case)


def _spare_seeded_tenant(case: Any) -> None:
    """Point a DELETE/PATCH/PUT aimed at the seeded tenant at an unknown id instead (a 404).

    Ids leak into the run through responses (lists, `me`) and links, so the fuzzer would otherwise
    revoke its own key, disable or demote its own user, pause its agent or delete its workspace,
    and every later request would be a 401/403/404/409 that says nothing about the operation under
    test. Generation-time `filter_case` would not see the ids stateful links fill in.
    """
    method = case.method.upper()
    # Pausing or terminating the seeded agent would refuse every later task (and routine fire).
    lifecycle = method == "POST" and case.operation.path.endswith(("/pause", "/terminate"))
    if (method not in MUTATING and not lifecycle) or not case.path_parameters:
        return
    protected = {i for i in os.environ.get(PROTECTED_IDS_ENV, "").lower().split(",") if i}
    for name, value in list(case.path_parameters.items()):
        if method != "DELETE" and name in CHANGEABLE:
            continue
        if isinstance(value, str) and value.lower() in protected:
            case.path_parameters[name] = UNKNOWN_ID


def _doomed_workspace_key(case: Any) -> None:
    """Delete the doomed workspace with its own key: a key only ever acts in its own workspace.

    Only the fuzzer's own credentials are swapped, so the `ignored_auth` check's requests without
    or with broken credentials still go out as it made them.
    """
    doomed = os.environ.get(DOOMED_WORKSPACE_ENV)
    if not doomed or case.method.upper() != "DELETE":
        return
    if (case.path_parameters or {}).get("workspace_id") != doomed:
        return
    headers = case.headers or {}
    name = next((n for n in headers if n.lower() == "authorization"), None)
    if name is not None and headers[name] == f"Bearer {os.environ.get(FUZZ_KEY_ENV)}":
        headers[name] = f"Bearer {os.environ[DOOMED_KEY_ENV]}"


def _unique_idempotency_key(case: Any) -> None:
    """Suffix a valid `Idempotency-Key` with a digest of the request it is sent with.

    The header's contract is "unique per request": a key reused with another body is 422
    (draft-ietf-httpapi-idempotency-key-header). schemathesis draws keys from the schema, so it
    reuses short ones ("0") across bodies and operations and nearly every POST would be that 422.
    With the suffix, the same request with the same key still replays (that path stays covered)
    and a different request never collides. Invalid keys (negative cases) are left as generated.
    """
    headers = case.headers or {}
    name = next((n for n in headers if n.lower() == IDEMPOTENCY_KEY), None)
    if name is None or not isinstance(headers[name], str) or not VALID_KEY.fullmatch(headers[name]):
        return
    request = json.dumps(
        [case.method.upper(), case.formatted_path, case.query, case.body],
        sort_keys=True,
        default=repr,
    )
    digest = hashlib.sha256(request.encode()).hexdigest()[:DIGEST_CHARS]
    headers[name] = f"{headers[name][: 255 - DIGEST_CHARS - 1]}-{digest}"


def _seeded_route_links(case: Any) -> None:
    """Point every schema-valid link of half the generated route chains at the seeded provider.

    A link must name an existing provider and one of its models (else 404), which the fuzzer
    cannot guess; without this nearly every route creation is that 404. Which half is decided
    by a digest of the body, so a replayed request is rewritten the same way. Links that break
    the schema are left alone: rewriting them would turn a negative case into a valid one.
    """
    if not case.operation.path.startswith("/api/v1/model-routes"):
        return
    body = case.body
    chain = body.get("chain") if isinstance(body, dict) else None
    if not isinstance(chain, list):
        return
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).digest()
    if digest[0] % 2:
        return
    for i, link in enumerate(chain):
        if _valid_link(link):
            chain[i] = dict(SEEDED_LINK)


def _valid_link(link: Any) -> bool:
    if not isinstance(link, dict) or set(link) != {"provider", "model"}:
        return False
    provider, model = link["provider"], link["model"]
    return (
        isinstance(provider, str)
        and isinstance(model, str)
        and LINK_PROVIDER.fullmatch(provider) is not None
        and LINK_MODEL.fullmatch(model) is not None
    )


def _own_workspace(case: Any) -> None:
    """Send half of the reads and renames of other workspaces to the fuzzer's own instead.

    A key acts in its own workspace only, so a workspace the fuzzer creates (the stateful
    phase follows `POST /workspaces` with a read or rename of the new id) is always a 404 to
    it. Which half is decided by a digest of the id, so a replay is rewritten the same way; the
    other half still checks that another workspace is a 404.
    """
    own = os.environ.get(OWN_WORKSPACE_ENV)
    if not own or case.method.upper() not in ("GET", "PATCH"):
        return
    params = case.path_parameters or {}
    value = params.get("workspace_id")
    if not isinstance(value, str) or value in (own, os.environ.get(DOOMED_WORKSPACE_ENV)):
        return
    if hashlib.sha256(value.encode()).digest()[0] % 2 == 0:
        params["workspace_id"] = own


def _fresh_invitation(case: Any) -> None:
    """Send half of the invitation answers and revocations to a fresh, real invitation.

    An invitation is answered or revoked once, and the fuzzer cannot guess ids, so these
    operations would only ever see 404 (`missing_test_data`). For half of the well-formed ids
    (decided by a digest, so a replay is rewritten the same way) the hook first has one issued:
    to the fuzzer's user by the workspace seeded for that answer (for `accept`, after leaving
    that workspace), or by the fuzzer's own workspace for a revocation. The other half still
    checks that an unknown id is a 404.
    """
    params = case.path_parameters or {}
    value = params.get("invitation_id")
    if case.method.upper() not in ("POST", "DELETE") or not isinstance(value, str):
        return
    if not UUID_TEXT.fullmatch(value) or hashlib.sha256(value.encode()).digest()[0] % 2:
        return
    base = os.environ[BASE_URL_ENV]
    path = case.operation.path
    if case.method.upper() == "DELETE" and path.startswith("/api/v1/invitations/"):
        key = os.environ[FUZZ_KEY_ENV]
        email = "revoked@bullpen.test"
    elif path.startswith("/api/v1/users/me/invitations/"):
        verb = path.rsplit("/", 1)[-1].upper()
        key = os.environ[INVITER_KEY_ENV.format(verb=verb)]
        email = os.environ[FUZZ_EMAIL_ENV]
        if verb == "ACCEPT":
            _call("DELETE", f"{base}/api/v1/members/{os.environ[FUZZ_USER_ENV]}", key)
    else:
        return
    issued = _call("POST", f"{base}/api/v1/invitations", key, {"email": email, "role": "viewer"})
    if isinstance(issued, dict) and "id" in issued:  # else refused (a limit): the id stays
        params["invitation_id"] = issued["id"]


_decisions: collections.Counter[str] = collections.Counter()


def _fresh_approval(case: Any) -> None:
    """Send half of the approval decisions to a fresh, pending approval.

    An approval is decided once and the fuzzer cannot guess ids, so approve and deny would only
    see 404 or 409. For every other call with a well-formed id the hook first has a task
    created for the gated agent, whose approval it then decides. The other half checks that
    an unknown (or decided) id is a 404 (or 409).
    """
    params = case.path_parameters or {}
    value = params.get("approval_id")
    if case.method.upper() != "POST" or not isinstance(value, str):
        return
    if not UUID_TEXT.fullmatch(value):
        return
    # Every other call of each operation, not a digest of the id: the fuzzer may send one id
    # many times, and then every call would fall on the same side.
    turn = _decisions[case.path]
    _decisions[case.path] += 1
    if turn % 2:
        return
    base, key = os.environ[BASE_URL_ENV], os.environ[FUZZ_KEY_ENV]
    task = _call(
        "POST",
        f"{base}/api/v1/tasks",
        key,
        {"prompt": "Held for the fuzzer", "agent_id": os.environ[GATED_AGENT_ENV]},
    )
    pending = _call("GET", f"{base}/api/v1/approvals?status=pending&limit=20", key)
    for approval in pending["items"]:
        if approval["task_id"] == task["id"]:
            params["approval_id"] = approval["id"]
            # A task's approval refuses `amount_usd` (a budget override's field): keep it in
            # a quarter of these, so that most reach the decision itself.
            if isinstance(case.body, dict) and "amount_usd" in case.body and turn % 8:
                del case.body["amount_usd"]
            return


def _fresh_routine(case: Any) -> None:
    """Half of the DELETEs of a routine get one made for them, so that every run deletes
    something whatever the earlier cases deleted (the seeded ones may all be gone by then);
    the other half still checks that an unknown id is a 404."""
    params = case.path_parameters or {}
    value = params.get("routine_id")
    if case.method.upper() != "DELETE" or not isinstance(value, str):
        return
    if not UUID_TEXT.fullmatch(value) or hashlib.sha256(value.encode()).digest()[0] % 2:
        return
    routine = _call(
        "POST",
        f"{os.environ[BASE_URL_ENV]}/api/v1/routines",
        os.environ[FUZZ_KEY_ENV],
        {
            "name": f"doomed-{value[:8]}-{os.urandom(4).hex()}",
            "agent_id": os.environ[AGENT_ENV],
            "cron": "0 0 1 1 *",
            "prompt": "Deleted by the fuzzer",
        },
    )
    if isinstance(routine, dict) and "id" in routine:
        params["routine_id"] = routine["id"]


def _call(method: str, url: str, key: str, body: Any = None) -> Any:
    """One request to the server under test (loopback) outside the fuzzing; its JSON body."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        raw = err.read()
    return json.loads(raw) if raw else None


# ---- MCP servers ------------------------------------------------------------------------------

# Where the fuzzer's MCP servers point: a real MCP server the test runs on loopback (the
# test server allows 127.0.0.1/32), so `POST …/test` lists its tools and connects nowhere else.
MCP_URL_ENV = "BULLPEN_FUZZ_MCP_URL"
_BASE_URL = TypeAdapter(BaseUrl)


def _loopback_mcp_url(case: Any) -> None:
    """Point a valid `url` of an MCP server's create or change at the test's MCP server.

    A test of a server connects to it: a generated host name would be looked up in DNS and an
    address called, and tests reach loopback only. An invalid `url` is left as generated, so
    negative cases stay negative.
    """
    if not case.path.startswith("/api/v1/mcp-servers") or case.method.upper() not in (
        "POST",
        "PATCH",
    ):
        return
    body = case.body
    if not isinstance(body, dict):
        return
    timeout = body.get("timeout_s")
    if isinstance(timeout, float | int) and not isinstance(timeout, bool) and 1 <= timeout < 10:
        # A test connects within its server's timeout: give a loaded machine room (the
        # minimum of 1 s is still sent as an invalid value's neighbour, below it).
        body["timeout_s"] = 10.0
    if not isinstance(body.get("url"), str):
        return
    try:
        _BASE_URL.validate_python(body["url"])
    except ValidationError:
        return
    body["url"] = os.environ[MCP_URL_ENV]


_CHECK_TIMEOUTS = {"connect_s": 10.0, "ttft_s": 30.0, "idle_s": 30.0, "deadline_s": 60.0}


def _seeded_provider_check(case: Any) -> None:
    """Check only the seeded provider (the simulator on loopback).

    A check calls the provider, and providers the fuzzer makes point wherever generated URLs
    do: a host name would be looked up in DNS and an address called (tests reach loopback
    only), a closed loopback port would be a 502. Unknown ids (404) are the other operations'
    cases to cover.
    """
    if case.method.upper() != "POST" or not case.operation.path.endswith("/test"):
        return
    if not case.operation.path.startswith("/api/v1/providers/"):
        return
    params = case.path_parameters or {}
    value = params.get("provider_id")
    if isinstance(value, str) and UUID_TEXT.fullmatch(value):
        seeded = params["provider_id"] = os.environ[SEEDED_PROVIDER_ENV]
        # The fuzzer PATCHes the seeded provider's timeouts too, down to 2.2e-16 s (seen in
        # CI): a check then ends in a correct 504 `provider-timeout`, which reads as a server
        # error. The check is of a working provider within limits it can meet.
        _call(
            "PATCH",
            f"{os.environ[BASE_URL_ENV]}/api/v1/providers/{seeded}",
            os.environ[FUZZ_KEY_ENV],
            {"timeouts": _CHECK_TIMEOUTS},
        )
        # Without a model the check calls the provider's first, and the fuzzer may have
        # renamed the seeded provider's models (PATCH is covered on it), or names one of its
        # own: the simulator then answers 404 for a name it never served, a correct 400
        # `provider-rejected` that reads as valid input refused. The simulator's own model
        # keeps the call meaningful.
        case.body = {"model": SEEDED_MODEL}


def _fresh_mcp_server(case: Any) -> None:
    """Half of the DELETEs of an MCP server get one made for them (as routines do)."""
    params = case.path_parameters or {}
    value = params.get("mcp_server_id")
    if case.method.upper() != "DELETE" or not isinstance(value, str):
        return
    if not UUID_TEXT.fullmatch(value) or hashlib.sha256(value.encode()).digest()[0] % 2:
        return
    made = _call(
        "POST",
        f"{os.environ[BASE_URL_ENV]}/api/v1/mcp-servers",
        os.environ[FUZZ_KEY_ENV],
        {
            "name": f"doomed-{os.urandom(6).hex()}",
            "transport": "http",
            "url": os.environ[MCP_URL_ENV],
        },
    )
    if isinstance(made, dict) and "id" in made:
        params["mcp_server_id"] = made["id"]


def _excused_mcp(where: tuple[Any, Any], error: dict[str, Any], case: Any, body: Any) -> bool:
    """An MCP server's 422s that depend on server settings or on the stored server:

    - `command` off `BULLPEN_PROCESS_ALLOW` (empty on the fuzz server);
    - on a change, a field of the other transport than the stored server's (`url` or
      `headers` of a stdio server, `command` or `env` of an http one), and a `url` moved to
      another origin without `headers` (headers go only where they were given for);
    - `headers` naming one header twice in another case, or one the client sets itself
      (`Host`, `Content-Type`, …): case-insensitive names, which JSON Schema cannot compare.
    """
    code = error.get("code")
    if where[1] in ("command", "stdio.command") and code == "not_allowed":
        return True
    if code in ("not_for_http", "not_for_stdio"):
        return case.method.upper() == "PATCH"
    if where == ("body", "headers") and code == "required_for_new_origin":
        return "url" in body and "headers" not in body
    if where in (("body", "url"), ("body", "http.url")):  # `http.`: the create's transport
        return _refused_url(body.get("url"))
    headers = body.get("headers")
    if where[1] in ("headers", "http.headers") and isinstance(headers, dict):
        lowered = [str(name).lower() for name in headers]
        return len(set(lowered)) != len(lowered) or bool(set(lowered) & RESERVED_HEADERS)
    return False
