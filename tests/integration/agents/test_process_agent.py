"""The `process` adapter against real processes: streaming, outcomes, ending the group, hygiene."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bullpen.agents.base import RunContext, TaskBrief
from bullpen.agents.process import (
    ProcessAdapter,
    ProcessAgentConfig,
    ProcessFailed,
    ProcessTimeout,
    check_allowed,
    parse_allow,
    stored_config,
)
from bullpen.agents.process_env import (
    ENV_ALLOW_DEFAULT,
    EnvAllow,
    ProcessEnvRefused,
    ProcessSecretEnvRequired,
    check_env,
    public_config,
    secret_hint,
)
from bullpen.agents.process_output import RESULT_CUT_MARK
from bullpen.domain.events import EventKind
from bullpen.domain.runs import ClaimedRun, RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.secrets import SecretBox
from bullpen.settings import Settings

SH, CAT, ENV = "/bin/sh", "/bin/cat", "/usr/bin/env"
ALLOW = frozenset({SH, CAT, ENV})
ENV_ALLOW = EnvAllow.parse("TEAM,GREETING,API_*,LANG,LC_*")
BOX = SecretBox(b"k" * 40)
GRACE_S = 0.5


class Recorder:
    """The events sink: records what the adapter writes, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []

    def text(self, delta: str) -> None:
        self.items.append(("text", delta))

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        self.items.append((kind.value, data))

    @property
    def stdout(self) -> str:
        return "".join(data for kind, data in self.items if kind == "text")

    @property
    def logs(self) -> list[dict[str, Any]]:
        return [data for kind, data in self.items if kind == "log"]


def context(
    config: dict[str, Any],
    events: Recorder,
    prompt: str = "Say hi",
    agent_id: uuid.UUID | None = None,
) -> RunContext:
    task_id = uuid.uuid4()
    run = ClaimedRun(
        id=uuid.uuid4(),
        task_id=task_id,
        workspace_id=uuid.uuid4(),
        agent_id=agent_id or uuid.uuid4(),
        attempt=1,
        failures=0,
        prompt=prompt,
        agent_adapter="process",
        agent_config=config,
    )
    task = TaskBrief(id=task_id, key="T-1", title="Greet", prompt=prompt, parent_id=None)
    return RunContext(
        run=run, task=task, agent_name="runner", events=events, started_at=datetime.now(UTC)
    )


def shell(script: str, **config: Any) -> dict[str, Any]:
    return {"command": [SH, "-c", script], **config}


async def run(config: dict[str, Any], events: Recorder | None = None, **adapter: Any) -> RunOutcome:
    adapter.setdefault("kill_grace_s", GRACE_S)
    adapter.setdefault("env_allow", ENV_ALLOW)
    adapter.setdefault("box", BOX)
    return await ProcessAdapter(ALLOW, **adapter).run(context(config, events or Recorder()))


async def gone(pid: int, within_s: float = 3.0) -> bool:
    """Whether the process has ended (a zombie waiting for its new parent counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        await asyncio.sleep(0.02)
    return False


async def wait_for(path: Path, within_s: float = 3.0) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was not written")


# Streaming and the result.


async def test_stdout_streams_as_text_and_stderr_lines_as_logs_in_order() -> None:
    events = Recorder()
    script = "printf 'one\\n'; sleep 0.2; printf 'warn 1\\nwarn 2\\n' >&2; sleep 0.2; printf two"
    outcome = await run(shell(script), events)
    assert events.items == [
        ("text", "one\n"),
        ("log", {"stream": "stderr", "line": "warn 1"}),
        ("log", {"stream": "stderr", "line": "warn 2"}),
        ("text", "two"),
    ]
    assert outcome.status is RunStatus.DONE
    assert outcome.result == "one\ntwo"
    assert outcome.error is None


async def test_text_streams_without_waiting_for_a_newline_and_cancel_ends_the_group(
    tmp_path: Path,
) -> None:
    events = Recorder()
    script = "sleep 300 & echo $$ $! > pids; printf partial; wait"
    task = asyncio.create_task(run(shell(script, cwd=str(tmp_path)), events))
    deadline = time.monotonic() + 3
    while events.stdout != "partial" and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert events.stdout == "partial"
    leader, grandchild = map(int, (await wait_for(tmp_path / "pids")).split())
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < GRACE_S + 1
    assert await gone(leader)
    assert await gone(grandchild)


async def test_a_utf8_character_split_across_writes_arrives_whole() -> None:
    events = Recorder()
    outcome = await run(shell("printf '\\303'; sleep 0.2; printf '\\251 \\377 a\\000b'"), events)
    assert outcome.result == "é \ufffd a\ufffdb"
    assert events.stdout == outcome.result


async def test_long_stderr_lines_are_cut_and_marked() -> None:
    events = Recorder()
    script = "head -c 20000 /dev/zero | tr '\\0' x >&2; printf '\\nshort\\r\\nlast' >&2"
    await run(shell(script), events)
    assert events.logs == [
        {"stream": "stderr", "line": "x" * 8192, "truncated": True},
        {"stream": "stderr", "line": "short"},
        {"stream": "stderr", "line": "last"},
    ]


async def test_the_run_context_arrives_on_stdin() -> None:
    events = Recorder()
    prompt = "Summarise the ticket ✓ " + "x" * 300_000  # over a pipe's buffer: written as read
    ctx = context({"command": [CAT]}, events, prompt=prompt)
    outcome = await ProcessAdapter(ALLOW).run(ctx)
    assert outcome.result is not None and outcome.result.endswith("\n")
    assert json.loads(outcome.result) == ctx.as_dict()
    assert json.loads(outcome.result)["task"]["prompt"] == prompt


async def test_stdin_none_gives_end_of_file_at_once() -> None:
    assert (await run(shell("cat; echo end", stdin="none"))).result == "end\n"


async def test_a_large_context_the_command_never_reads_does_not_block() -> None:
    started = time.monotonic()
    ctx = context(shell("echo ok"), Recorder(), prompt="p" * 2_000_000)  # far over a pipe's buffer
    outcome = await ProcessAdapter(ALLOW, kill_grace_s=GRACE_S).run(ctx)
    assert outcome.result == "ok\n"
    assert time.monotonic() - started < 3


# Failures.


async def test_a_non_zero_exit_fails_with_the_status_and_last_stderr_line() -> None:
    with pytest.raises(ProcessFailed) as caught:
        await run(shell("echo first >&2; echo 'disk full' >&2; echo >&2; exit 3"))
    assert caught.value.detail == "exited with status 3: disk full"
    assert caught.value.transient is False
    assert caught.value.slug == "process-failed"


async def test_a_non_zero_exit_without_stderr_says_the_status_only() -> None:
    with pytest.raises(ProcessFailed, match=r"^exited with status 1$"):
        await run(shell("exit 1"))


async def test_death_by_a_signal_names_the_signal() -> None:
    with pytest.raises(ProcessFailed, match=r"^killed by SIGUSR1$"):
        await run(shell("kill -USR1 $$"))


async def test_a_command_that_cannot_start_fails_permanently(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-agent")
    adapter = ProcessAdapter({missing})
    with pytest.raises(ProcessFailed, match="could not start") as caught:
        await adapter.run(context({"command": [missing]}, Recorder()))
    assert caught.value.transient is False


async def test_a_timeout_ends_the_whole_group(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ProcessTimeout) as caught:
        await run(shell("sleep 300 & echo $! > pid; wait", cwd=str(tmp_path), timeout_s=0.3))
    assert caught.value.detail == "timed out after 0.3 s"
    assert caught.value.slug == "process-timeout"
    assert time.monotonic() - started < 0.3 + GRACE_S + 1
    assert await gone(int((tmp_path / "pid").read_text()))


async def test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace(tmp_path: Path) -> None:
    script = "trap '' TERM; sleep 300 & echo $! > pid; wait"
    started = time.monotonic()
    with pytest.raises(ProcessTimeout):
        await run(shell(script, cwd=str(tmp_path), timeout_s=0.2))
    elapsed = time.monotonic() - started
    assert 0.2 + GRACE_S <= elapsed < 0.2 + GRACE_S + 1
    assert await gone(int((tmp_path / "pid").read_text()))


async def test_what_a_successful_command_leaves_running_is_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    # The background sleep holds stdout open: the run must not wait for it.
    outcome = await run(shell("sleep 300 & echo $! > pid; echo done", cwd=str(tmp_path)))
    assert outcome.result == "done\n"
    assert time.monotonic() - started < 2
    assert await gone(int((tmp_path / "pid").read_text()))


async def test_a_process_that_left_the_group_cannot_hold_the_run(tmp_path: Path) -> None:
    # The escaped sleep writes its pid once it leads its own session, and holds stdout open.
    script = (
        "setsid sh -c 'echo $$ > pid; exec sleep 30' & "
        "while [ ! -s pid ]; do sleep 0.01; done; echo hi"
    )
    started = time.monotonic()
    outcome = await run(shell(script, cwd=str(tmp_path)))
    elapsed = time.monotonic() - started
    escaped = int((tmp_path / "pid").read_text())
    try:
        assert outcome.result == "hi\n"
        assert GRACE_S <= elapsed < GRACE_S + 1.5
        assert not await gone(escaped, within_s=0.1)
    finally:
        os.kill(escaped, signal.SIGKILL)


async def test_an_events_sink_that_fails_ends_the_run_with_its_error(tmp_path: Path) -> None:
    class Broken(Recorder):
        def text(self, delta: str) -> None:
            raise RuntimeError("event log unavailable")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="event log unavailable"):
        await run(shell("echo $$ > pid; echo hi; sleep 300", cwd=str(tmp_path)), Broken())
    assert time.monotonic() - started < 2
    assert await gone(int((tmp_path / "pid").read_text()))


# Output caps.


async def test_output_over_the_cap_stops_the_run_and_keeps_events_up_to_it() -> None:
    events = Recorder()
    with pytest.raises(ProcessFailed) as caught:
        await run(shell("yes 0123456789abcde | head -c 20000000"), events)
    assert caught.value.detail == (
        "stopped after writing more than 16777216 bytes to stdout and stderr"
    )
    assert len(events.stdout) == 16 * 1024 * 1024
    assert events.stdout.startswith("0123456789abcde\n0123")


async def test_the_result_keeps_the_tail_of_long_output() -> None:
    events = Recorder()
    outcome = await run(shell("seq 1 3000"), events, result_max_chars=1000)
    full = "".join(f"{n}\n" for n in range(1, 3001))
    assert events.stdout == full
    assert outcome.result == RESULT_CUT_MARK + full[-1000:]


# The environment.


async def test_the_environment_carries_only_the_base_and_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    canaries = {
        "BULLPEN_SECRET_KEY": "canary-secret-key-4f1c",
        "BULLPEN_DATABASE_URL": "postgresql://canary:canary-db-77aa@db/bullpen",
        "OPENAI_API_KEY": "sk-canary-openai-9e2d",
        "ANTHROPIC_API_KEY": "sk-ant-canary-31b0",
    }
    for name, value in canaries.items():
        monkeypatch.setenv(name, value)
    events = Recorder()
    ctx = context({"command": [ENV], "env": {"GREETING": "hello"}}, events)
    outcome = await ProcessAdapter(ALLOW, env_allow=ENV_ALLOW).run(ctx)
    assert outcome.result is not None
    seen = dict(line.split("=", 1) for line in outcome.result.splitlines())
    assert seen.keys() == {"PATH", "HOME", "LANG", "BULLPEN_RUN_ID", "BULLPEN_TASK_ID", "GREETING"}
    assert seen["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert seen["LANG"] == "C.UTF-8"
    assert seen["GREETING"] == "hello"
    assert seen["BULLPEN_RUN_ID"] == str(ctx.run.id)
    assert seen["BULLPEN_TASK_ID"] == str(ctx.run.task_id)
    everything = json.dumps(events.items) + outcome.result
    for name, value in canaries.items():
        assert name not in everything
        assert value not in everything


async def test_home_is_the_default_working_directory_and_it_is_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "keep").write_text("mine")
    outcome = await run(shell(f'pwd; echo "$HOME"; mkdir -p d/e; ln -s {outside} d/e/link'))
    assert outcome.result is not None
    cwd, home = outcome.result.splitlines()
    assert cwd == home
    assert Path(cwd).parent == Path(tempfile.gettempdir())
    assert not os.path.lexists(cwd)
    # The link into another directory was removed, not followed.
    assert (outside / "keep").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes read-only directories regardless")
async def test_directories_the_command_made_read_only_are_removed_too(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    script = (
        "pwd; mkdir -p d/e/g && touch d/e/f && chmod 000 d/e && chmod 500 d; "
        f"ln -s {outside} link; chmod 000 ."
    )
    outcome = await run(shell(script))
    assert outcome.result is not None
    assert not os.path.lexists(outcome.result.strip())
    assert outside.stat().st_mode & 0o777 == 0o755


async def test_the_default_working_directory_is_removed_after_a_failure() -> None:
    events = Recorder()
    with pytest.raises(ProcessFailed):
        await run(shell("pwd; exit 2"), events)
    assert not Path(events.stdout.strip()).exists()


async def test_a_configured_working_directory_is_used_and_kept(tmp_path: Path) -> None:
    outcome = await run(shell("pwd; touch made-here", cwd=str(tmp_path)))
    assert outcome.result == f"{tmp_path}\n"
    assert (tmp_path / "made-here").exists()


async def test_a_missing_working_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="is not a directory"):
        await run(shell("true", cwd=str(tmp_path / "missing")))


# The allow-list and the config.


def test_parse_allow_reads_comma_separated_absolute_paths() -> None:
    assert parse_allow("") == frozenset()
    assert parse_allow(" /bin/sh , /usr/bin/env,, ") == {"/bin/sh", "/usr/bin/env"}
    with pytest.raises(BullpenError, match="BULLPEN_PROCESS_ALLOW takes absolute paths"):
        parse_allow("/bin/sh,python3")


def test_check_allowed_refuses_everything_when_the_list_is_empty() -> None:
    config = ProcessAgentConfig(command=[SH])
    with pytest.raises(InvalidInput, match=r"process agents are off.*BULLPEN_PROCESS_ALLOW"):
        check_allowed(config, frozenset())


def test_check_allowed_refuses_an_unlisted_executable() -> None:
    with pytest.raises(InvalidInput, match="'/bin/bash' is not an executable BULLPEN_PROCESS_ALL"):
        check_allowed(ProcessAgentConfig(command=["/bin/bash"]), ALLOW)
    with pytest.raises(InvalidInput) as caught:
        check_allowed(ProcessAgentConfig(command=["/usr/bin/../../bin/sh"]), ALLOW)
    assert caught.value.errors is not None
    assert caught.value.errors[0]["field"] == "config.command.0"
    check_allowed(ProcessAgentConfig(command=[SH, "-c", "true"]), ALLOW)


@pytest.mark.parametrize("allow", [frozenset(), frozenset({CAT})])
async def test_the_allow_list_is_checked_again_at_run_time(
    tmp_path: Path, allow: frozenset[str]
) -> None:
    adapter = ProcessAdapter(allow)
    with pytest.raises(InvalidInput, match="BULLPEN_PROCESS_ALLOW"):
        await adapter.run(context(shell("touch ran", cwd=str(tmp_path)), Recorder()))
    assert not (tmp_path / "ran").exists()


# Names the old deny-list let through (issue 19, finding 7), and ones it refused.
REFUSED_BY_DEFAULT = [
    "OPENSSL_CONF",
    "LUA_INIT",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_PARAMETERS",
    "LESSOPEN",
    "ZDOTDIR",
    "http_proxy",
    "LD_PRELOAD",
    "PYTHONPATH",
    "BASH_ENV",
    "NODE_OPTIONS",
    "TEAM",
]
RESERVED = ["PATH", "HOME", "path", "BULLPEN_SECRET_KEY", "bullpen_database_url"]


@pytest.mark.parametrize("name", REFUSED_BY_DEFAULT + RESERVED)
def test_the_default_env_allow_list_refuses_all_but_locale_and_time_zone(name: str) -> None:
    assert Settings.model_fields["process_env_allow"].default == ENV_ALLOW_DEFAULT
    default = EnvAllow.parse(ENV_ALLOW_DEFAULT)
    for field in ("env", "secret_env"):
        names = {"env": {}, "secret_env": {}} | {field: {name: "x"}}
        with pytest.raises(ProcessEnvRefused, match=f"may not set {name}:") as caught:
            check_env(names["env"], names["secret_env"], default)
        assert caught.value.errors == [
            {
                "location": "body",
                "field": f"config.{field}.{name}",
                "message": f"BULLPEN_PROCESS_ENV_ALLOW does not allow {name}",
                "code": "not_allowed",
            }
        ]
    for allowed in ("LANG", "LANGUAGE", "LC_ALL", "LC_TIME", "TZ", "NO_COLOR"):
        check_env({allowed: "x"}, {}, default)


def test_the_env_allow_list_takes_names_and_prefixes_case_sensitively() -> None:
    allow = EnvAllow.parse(" TEAM , API_*,, LC_* ")
    assert [allow.allows(n) for n in ("TEAM", "API_TOKEN", "API_", "LC_ALL")] == [True] * 4
    assert [allow.allows(n) for n in ("team", "TEAMS", "api_token", "APITOKEN")] == [False] * 4
    # Bullpen's own names never, whatever the list says.
    assert not any(EnvAllow.parse("B*,P*,H*,b*,p*").allows(name) for name in RESERVED)
    assert EnvAllow.parse("") == EnvAllow()
    for bad in ("*", "A-B", "A*B", "1A", "BULLPEN_*", "PATH", "home"):
        with pytest.raises(BullpenError, match="BULLPEN_PROCESS_ENV_ALLOW"):
            EnvAllow.parse(f"TEAM,{bad}")


@pytest.mark.parametrize(
    ("env", "secret_env", "code"),
    [
        ({"TEAM": "a"}, {"TEAM": "b"}, "duplicate"),
        ({f"API_{i}": "a" for i in range(20)}, {f"API_S{i}": "b" for i in range(13)}, "too_many"),
    ],
)
def test_a_name_in_both_or_too_many_in_all_is_refused(
    env: dict[str, str], secret_env: dict[str, str], code: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_env(env, secret_env, ENV_ALLOW)
    assert caught.value.errors is not None and caught.value.errors[0]["code"] == code


@pytest.mark.parametrize(
    "config",
    [
        {"command": []},
        {"command": ["sh"]},
        {"command": [SH, "a\x00b"]},
        {"command": [SH] + ["x"] * 100},
        {"command": [SH, "x" * 4097]},
        {"command": [SH], "env": {"1ABC": "x"}},
        {"command": [SH], "env": {"A-B": "x"}},
        {"command": [SH], "env": {"A": "nul\x00"}},
        {"command": [SH], "secret_env": {"A": "nul\x00"}},
        {"command": [SH], "secret_env": {"A": "x" * 1025}},
        {"command": [SH], "secret_env": {"A-B": "x"}},
        {"command": [SH], "secret_env": {"A": 1}},
        {"command": [SH], "secret_env_sealed": {"A": "x"}},
        {"command": [SH], "env": {f"V{i}": "x" for i in range(101)}},
        {"command": [SH], "cwd": "relative/dir"},
        {"command": [SH], "timeout_s": 0},
        {"command": [SH], "timeout_s": 86_401},
        {"command": [SH], "timeout_s": "60"},
        {"command": [SH], "stdin": "file"},
        {"command": [SH], "shell": True},
    ],
)
def test_bad_configs_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ProcessAgentConfig.model_validate(config)


def test_a_good_config_is_stored_without_unset_options() -> None:
    config = ProcessAgentConfig.model_validate(
        {"command": [SH, "-c", "echo"], "env": {"TEAM": "blue", "LANG": "de_DE.UTF-8"}}
    )
    assert config.stored() == {
        "command": [SH, "-c", "echo"],
        "env": {"TEAM": "blue", "LANG": "de_DE.UTF-8"},
        "timeout_s": 600.0,
        "stdin": "context",
    }
    assert ProcessAgentConfig.model_validate(config.stored()) == config


async def test_a_bad_stored_config_fails_the_run_as_invalid() -> None:
    with pytest.raises(InvalidInput, match=r"config is invalid: timeout_s"):
        await run({"command": [SH], "timeout_s": -1})


@pytest.mark.parametrize("field", ["env", "secret_env_sealed"])
async def test_the_env_allow_list_is_checked_again_at_run_time(tmp_path: Path, field: str) -> None:
    # Stored while the operator allowed it; the operator has since taken TEAM off the list.
    config = shell("touch ran", cwd=str(tmp_path)) | {field: {"TEAM": "x"}}
    with pytest.raises(ProcessEnvRefused, match="may not set TEAM"):
        await run(config, env_allow=EnvAllow.parse("LANG"))
    assert not (tmp_path / "ran").exists()


# Secret env.

CANARY = "canary-secret-env-3a9c01d2e4b5a6f7"


def sealed(agent_id: uuid.UUID, secret_env: dict[str, str], **config: Any) -> dict[str, Any]:
    given = ProcessAgentConfig.model_validate({**config, "secret_env": secret_env})
    return stored_config(given, box=BOX, agent_id=agent_id)


async def test_secret_env_is_sealed_at_rest_and_reaches_only_the_command() -> None:
    agent_id = uuid.uuid4()
    script = 'printf %s "$API_TOKEN" | sha256sum; printf %s "$TEAM"'
    stored = sealed(agent_id, {"API_TOKEN": CANARY}, command=[SH, "-c", script], env={"TEAM": "b"})
    assert CANARY not in json.dumps(stored)
    assert stored["secret_env_hints"] == {"API_TOKEN": "…" + CANARY[-4:]}
    assert set(stored["secret_env_sealed"]) == {"API_TOKEN"}
    events = Recorder()
    adapter = ProcessAdapter(ALLOW, env_allow=ENV_ALLOW, box=BOX, kill_grace_s=GRACE_S)
    outcome = await adapter.run(context(stored, events, agent_id=agent_id))
    assert outcome.result == hashlib.sha256(CANARY.encode()).hexdigest() + "  -\nb"
    assert CANARY not in json.dumps(events.items)
    # Bound to its agent: a sealed value copied to another agent's config does not open.
    with pytest.raises(BullpenError, match="does not open"):
        await adapter.run(context(stored, Recorder(), agent_id=uuid.uuid4()))
    # Bound to its name: moved to another name, it does not open either.
    moved = stored | {"secret_env_sealed": {"API_OTHER": stored["secret_env_sealed"]["API_TOKEN"]}}
    with pytest.raises(BullpenError, match="does not open"):
        await adapter.run(context(moved, Recorder(), agent_id=agent_id))


async def test_damaged_or_unopenable_secret_env_fails_the_run_as_invalid() -> None:
    agent_id = uuid.uuid4()
    stored = sealed(agent_id, {"API_TOKEN": CANARY}, command=[SH, "-c", "true"])
    damaged = stored | {"secret_env_sealed": {"API_TOKEN": "not base64!"}}
    with pytest.raises(InvalidInput, match="secret_env API_TOKEN is damaged"):
        await run(damaged)
    no_box = ProcessAdapter(ALLOW, env_allow=ENV_ALLOW, kill_grace_s=GRACE_S)
    with pytest.raises(InvalidInput, match="cannot open"):
        await no_box.run(context(stored, Recorder(), agent_id=agent_id))


def test_secret_hints_show_nothing_of_short_values() -> None:
    assert secret_hint("short-secret") == "…"
    assert secret_hint("x" * 15) == "…"
    assert secret_hint("0123456789abcdef") == "…cdef"


def test_a_config_change_keeps_secret_env_only_while_what_runs_is_the_same() -> None:
    agent_id = uuid.uuid4()
    base = {"command": [SH, "-c", "run"], "cwd": "/srv", "env": {"TEAM": "b"}}
    previous = sealed(agent_id, {"API_TOKEN": CANARY}, **base)

    def change(**config: Any) -> dict[str, Any]:
        given = ProcessAgentConfig.model_validate(config)
        return stored_config(given, box=BOX, agent_id=agent_id, previous=previous)

    kept = change(**base, timeout_s=5.0, stdin="none")
    assert kept["secret_env_sealed"] == previous["secret_env_sealed"]
    assert kept["secret_env_hints"] == previous["secret_env_hints"]
    for moved in (
        base | {"command": [SH, "-c", "run", "--verbose"]},
        base | {"command": [ENV]},
        base | {"cwd": "/tmp"},
        {k: v for k, v in base.items() if k != "cwd"},
        base | {"env": {"TEAM": "c"}},
        base | {"env": {}},
    ):
        with pytest.raises(
            ProcessSecretEnvRequired, match=r"needs secret_env again \(API_TOKEN\)"
        ) as err:
            change(**moved)
        assert err.value.errors is not None and err.value.errors[0]["field"] == "config.secret_env"
        assert CANARY not in str(err.value.detail)
        # Sent again, or dropped with {}, the change is made.
        renewed = change(**moved, secret_env={"API_TOKEN": "another-secret-value"})
        assert renewed["secret_env_sealed"] != previous["secret_env_sealed"]
        assert "secret_env_sealed" not in change(**moved, secret_env={})
    # An agent without secrets changes freely.
    plain = ProcessAgentConfig.model_validate(base)
    assert (
        stored_config(plain, box=BOX, agent_id=agent_id, previous=plain.stored()) == plain.stored()
    )


def test_readers_without_agents_write_see_names_only() -> None:
    stored = sealed(
        uuid.uuid4(), {"API_TOKEN": CANARY}, command=[SH], env={"TEAM": "blue", "LANG": "C"}
    )
    writer = public_config(stored, values=True)
    assert writer == {
        "command": [SH],
        "env": {"TEAM": "blue", "LANG": "C"},
        "timeout_s": 600.0,
        "stdin": "context",
        "secret_env_hints": {"API_TOKEN": "…" + CANARY[-4:]},
    }
    reader = public_config(stored, values=False)
    assert reader == {
        "command": [SH],
        "env_names": ["LANG", "TEAM"],
        "secret_env_names": ["API_TOKEN"],
        "timeout_s": 600.0,
        "stdin": "context",
    }
    assert "blue" not in json.dumps(reader)
    assert "sealed" not in json.dumps(writer) + json.dumps(reader)


# Hygiene.


async def test_no_file_descriptor_or_task_outlives_its_run(tmp_path: Path) -> None:
    fds = Path("/proc/self/fd")
    await run(shell("echo warm-up"))
    before = sorted(os.listdir(fds))
    configs = [
        shell("echo out; echo err >&2"),
        shell("cat >/dev/null; exit 4", stdin="context"),
        shell("sleep 5", timeout_s=0.05),
        shell("sleep 5 & echo left-running"),
        {"command": [CAT]},
    ]
    for i in range(50):
        with pytest.raises(BullpenError) if i % 5 in (1, 2) else contextlib.nullcontext():
            await run(configs[i % 5], kill_grace_s=0.2)
    await asyncio.sleep(0.05)  # transports finish closing on the next loop iterations
    assert sorted(os.listdir(fds)) == before
    assert asyncio.all_tasks() == {asyncio.current_task()}
