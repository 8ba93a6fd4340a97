"""The `process` adapter: run an operator-allowed command on the worker's machine.

The operator names the executables agents may run in `BULLPEN_PROCESS_ALLOW` (comma-separated
absolute paths; empty turns the adapter off). An agent's config is checked against it when it is
saved and again at every run, since the list can change in between. Each delivery of a run:

- starts `command` as the leader of a new session, so of its own process group, in `cwd` or in
  a fresh temporary directory that is removed afterwards;
- builds its environment from scratch: `PATH=/usr/local/bin:/usr/bin:/bin`, `LANG=C.UTF-8`,
  `HOME` (the working directory), `BULLPEN_RUN_ID` and `BULLPEN_TASK_ID` (not secrets), then the
  config's `env` and its `secret_env` (opened only here); nothing of the worker's own environment
  (provider keys, `BULLPEN_SECRET_KEY`, the database URL) is passed on;
- writes the run context (`RunContext.as_dict()`, one JSON line) to stdin and closes it, or
  gives it /dev/null (`stdin: "none"`);
- streams stdout as `text` as it arrives (UTF-8, invalid bytes replaced) and each stderr line
  as a `log` event `{"stream": "stderr", "line": ...}`; a line longer than 8 KiB is cut there
  and gets `"truncated": true`. NUL characters become U+FFFD (PostgreSQL text cannot hold them);
- ends `done` with stdout as the result when the command exits 0. A result longer than 1 Mi
  characters keeps its last 1 Mi characters after a `[… earlier output cut …]` line (the
  events still hold all of it).

A run fails (`ProcessFailed`, not retried) when the command cannot start, exits non-zero (the
error ends with its last non-empty stderr line), dies of a signal, or writes more than 16 MiB to
stdout and stderr together (the group is killed there; the events up to the cap are kept); it
fails with `ProcessTimeout` after `timeout_s`.

Ending: on timeout or cancellation the group gets SIGTERM, and the leader has the grace period
(5 s) to exit before the group gets SIGKILL; over the output cap it gets SIGKILL at once. What
the leader leaves running when it exits, on any path, is killed (SIGKILL) at once. The adapter
returns only once the leader is reaped and every pipe is closed; output still in the pipes is
collected for at most the grace period (a process that left the group with setsid is out of
reach and may hold them open).

This scrubs the environment; it does not sandbox. The command runs as the worker's user and can
read whatever that user can, such as Bullpen's data directory. A worker that runs `process`
agents makes itself non-dumpable (`protect_worker`), so a command running as the same
(non-root) user cannot read the worker's environment through /proc/<pid>/environ. The
allow-list is the trust boundary; allow wrappers that drop privileges or sandbox when agents are
not fully trusted.

The environment names a config may set are the operator's too (`BULLPEN_PROCESS_ENV_ALLOW`,
checked when a config is saved and again at every run), and its `secret_env` is sealed and never
shown: see `process_env`. Output handling is `process_output`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import io
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
)

from bullpen.agents.base import NO_NUL, RunContext, done, no_nul_secret
from bullpen.agents.process_env import (
    ENV_ALLOW_DEFAULT,
    ENV_ALLOW_SETTING,
    ENV_MAX_ENTRIES,
    EnvAllow,
    check_env,
    kept_secrets,
    open_secrets,
    sealed_secrets,
)
from bullpen.agents.process_output import (
    OutputBudget,
    OutputSink,
    PipeReader,
    StderrSink,
    StdoutSink,
)
from bullpen.domain.runs import RunOutcome
from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.secrets import SecretBox

log = logging.getLogger(__name__)

ALLOW_SETTING = "BULLPEN_PROCESS_ALLOW"

# Small enough that the largest config fits the API's 64 KiB request body with room to spare.
COMMAND_MAX_ITEMS = 32
ARG_MAX_CHARS = 512
ENV_NAME_MAX_CHARS = 128
ENV_VALUE_MAX_CHARS = 1024
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TIMEOUT_DEFAULT_S = 600.0
TIMEOUT_MAX_S = 86_400.0

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_MAX_BYTES = 16 * 1024 * 1024
RESULT_MAX_CHARS = 1024 * 1024
KILL_GRACE_S = 5.0
_ERROR_LINE_MAX_CHARS = 500

Argument = Annotated[str, StringConstraints(max_length=ARG_MAX_CHARS, pattern=NO_NUL)]
AbsolutePath = Annotated[str, StringConstraints(max_length=ARG_MAX_CHARS, pattern=r"^/[^\x00]*$")]
EnvName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ENV_NAME_MAX_CHARS, pattern=ENV_NAME_PATTERN),
]
EnvValue = Annotated[str, StringConstraints(max_length=ENV_VALUE_MAX_CHARS, pattern=NO_NUL)]


SecretEnvValue = Annotated[
    SecretStr,
    Field(max_length=ENV_VALUE_MAX_CHARS, json_schema_extra={"pattern": NO_NUL}),
    AfterValidator(no_nul_secret),
]
# Names outside the pattern are refused too (pydantic documents the pattern alone).
_ENV_NAMES_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "propertyNames": {"minLength": 1, "maxLength": ENV_NAME_MAX_CHARS, "pattern": ENV_NAME_PATTERN},
}


class ProcessFailed(BullpenError):
    """A `process` agent's command could not start, exited non-zero, or was stopped."""

    status = 502
    slug = "process-failed"
    title = "Process failed"


class ProcessTimeout(ProcessFailed):
    """A `process` agent's command ran past its `timeout_s`."""

    status = 504
    slug = "process-timeout"
    title = "Process timed out"


class ProcessFields(BaseModel):
    """What a `process` agent's config holds both as given and as stored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    command: Annotated[list[Argument], Field(min_length=1, max_length=COMMAND_MAX_ITEMS)] = Field(
        description="The executable (an absolute path the operator allows in "
        f"`{ALLOW_SETTING}`) and its arguments; no shell is involved.",
        # The first item is the executable: absolute (JSON Schema 2020-12 `prefixItems`).
        json_schema_extra={
            "prefixItems": [
                {"type": "string", "maxLength": ARG_MAX_CHARS, "pattern": r"^/[^\x00]*$"}
            ]
        },
    )
    cwd: AbsolutePath | None = Field(
        default=None,
        description="Working directory (absolute, must exist on the worker); omit for a fresh "
        "temporary directory per run, removed afterwards. `HOME` is set to it.",
    )
    env: Annotated[dict[EnvName, EnvValue], Field(max_length=ENV_MAX_ENTRIES)] = Field(
        default_factory=dict,
        description="Extra environment variables, not secret: their values are shown to "
        "callers with `agents:write` and in the audit log (other readers see the names only). "
        f"Only names the operator allows in `{ENV_ALLOW_SETTING}` (else 422 "
        "`process-env-not-allowed`), never `PATH`, `HOME` or `BULLPEN_…`; at most "
        f"{ENV_MAX_ENTRIES} with `secret_env`. The worker's own environment is never passed on.",
        json_schema_extra=_ENV_NAMES_SCHEMA,
    )
    timeout_s: float = Field(
        default=TIMEOUT_DEFAULT_S,
        gt=0,
        le=TIMEOUT_MAX_S,
        description="The run fails, and the command's process group is ended, after this long.",
    )
    stdin: Literal["context", "none"] = Field(
        default="context",
        description="`context`: the run context as one JSON line on stdin, then end of file; "
        "`none`: stdin is /dev/null.",
    )

    @field_validator("command")
    @classmethod
    def _absolute_executable(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("/"):
            raise ValueError("command[0] must be the executable's absolute path")
        return value


class ProcessAgentConfig(ProcessFields):
    """A `process` agent's configuration: the command it runs and how."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "command": ["/usr/local/bin/triage", "--json"],
                    "env": {"TEAM": "blue"},
                    "secret_env": {"TRIAGE_TOKEN": "tok-…"},
                },
            ]
        },
    )

    secret_env: (
        Annotated[
            dict[EnvName, SecretEnvValue],
            Field(max_length=ENV_MAX_ENTRIES, json_schema_extra=_ENV_NAMES_SCHEMA),
        ]
        | None
    ) = Field(
        default=None,
        description="Secret environment variables (names as for `env`): sealed when saved, "
        "given to the command only, never shown again (the config shows `secret_env_hints`). "
        "Leave it out of a config change to keep the stored values: allowed only while "
        "`command`, `cwd` and `env` stay as they are (else 422 `process-secret-env-required`); "
        "`{}` removes them.",
    )

    def stored(self) -> dict[str, Any]:
        """The config as the worker reads it, without `secret_env` (`stored_config` adds it
        sealed); an unset `cwd` is left out, not null."""
        return self.model_dump(exclude_none=True, exclude={"secret_env"})


class StoredProcessConfig(ProcessFields):
    """A `process` agent's config as stored: its secrets sealed, with their hints."""

    secret_env_sealed: dict[EnvName, str] = Field(default_factory=dict)
    secret_env_hints: dict[EnvName, str] = Field(default_factory=dict)


def stored_config(
    config: ProcessAgentConfig,
    *,
    box: SecretBox,
    agent_id: UUID,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config to store: `secret_env` sealed, or `previous`'s sealed values kept.

    Raises ProcessSecretEnvRequired when `secret_env` is left out, `previous` has secrets, and
    `command`, `cwd` or `env` changed.
    """
    stored = config.stored()
    if config.secret_env is None:
        return stored | kept_secrets(stored, previous)
    plain = {name: value.get_secret_value() for name, value in config.secret_env.items()}
    return stored | sealed_secrets(plain, box, agent_id)


def load_config(raw: Mapping[str, Any]) -> StoredProcessConfig:
    """Read and check an agent's stored config at run time."""
    try:
        return StoredProcessConfig.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise InvalidInput(
            f"the agent's process config is invalid: {where}: {first['msg']}"
        ) from exc


def parse_allow(raw: str) -> frozenset[str]:
    """The executables `BULLPEN_PROCESS_ALLOW` names (comma-separated absolute paths)."""
    paths = frozenset(part.strip() for part in raw.split(",") if part.strip())
    relative = sorted(path for path in paths if not path.startswith("/"))
    if relative:
        raise BullpenError(f"{ALLOW_SETTING} takes absolute paths only, not {', '.join(relative)}")
    return paths


def check_allowed(config: ProcessFields, allow: Collection[str]) -> None:
    """Refuse the config unless the operator allows its executable (exact path match)."""
    if not allow:
        message = f"process agents are off on this server: {ALLOW_SETTING} allows no executable"
    elif config.command[0] not in allow:
        message = f"{config.command[0]!r} is not an executable {ALLOW_SETTING} allows"
    else:
        return
    raise InvalidInput(
        message,
        errors=[
            {
                "location": "body",
                "field": "config.command.0",
                "message": message,
                "code": "not_allowed",
            }
        ],
    )


def environment(
    config: ProcessFields, ctx: RunContext, home: str, secrets: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The command's whole environment: the fixed base, the run's ids, the config's `env` and
    its opened `secret_env`."""
    return {
        "PATH": BASE_PATH,
        "LANG": "C.UTF-8",
        **config.env,
        **(secrets or {}),
        # After the config's entries, so nothing can replace them (the config refuses them too).
        "HOME": home,
        "BULLPEN_RUN_ID": str(ctx.run.id),
        "BULLPEN_TASK_ID": str(ctx.run.task_id),
    }


_PR_SET_DUMPABLE = 4


def protect_worker() -> bool:
    """Make this process non-dumpable (Linux): its /proc/<pid>/environ and memory are then
    readable by root only, not by the commands it starts. Returns whether it took effect."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux: nothing to do
        return False


class ProcessAdapter:
    """Runs `process` agents: one allowed command per delivery of a run."""

    def __init__(
        self,
        allow: Collection[str],
        *,
        env_allow: EnvAllow | None = None,
        box: SecretBox | None = None,
        kill_grace_s: float = KILL_GRACE_S,
        output_max_bytes: int = OUTPUT_MAX_BYTES,
        result_max_chars: int = RESULT_MAX_CHARS,
    ) -> None:
        self._allow = frozenset(allow)
        self._env_allow = EnvAllow.parse(ENV_ALLOW_DEFAULT) if env_allow is None else env_allow
        self._box = box
        self._grace = kill_grace_s
        self._output_max = output_max_bytes
        self._result_max = result_max_chars

    async def run(self, ctx: RunContext) -> RunOutcome:
        """Run the agent's command once; `done` with its stdout, or a `BullpenError`."""
        config = load_config(ctx.run.agent_config)
        check_allowed(config, self._allow)
        check_env(config.env, config.secret_env_sealed, self._env_allow)
        secrets = open_secrets(config.secret_env_sealed, self._box, ctx.run.agent_id)
        if config.cwd is not None:
            if not await asyncio.to_thread(os.path.isdir, config.cwd):
                raise InvalidInput(f"cwd {config.cwd!r} is not a directory on this worker")
            return await self._run_in(ctx, config, config.cwd, secrets)
        workdir = tempfile.mkdtemp(prefix="bullpen-run-")
        try:
            return await self._run_in(ctx, config, workdir, secrets)
        finally:
            await asyncio.to_thread(_remove_tree, workdir)

    async def _run_in(
        self, ctx: RunContext, config: StoredProcessConfig, cwd: str, secrets: Mapping[str, str]
    ) -> RunOutcome:
        loop = asyncio.get_running_loop()
        # Each pipe end is a file object: closing one twice (its transport, then this stack) is
        # harmless, and the stack closes whatever no transport took.
        with contextlib.ExitStack() as files:
            proc, out_r, err_r, in_w = await _spawn(ctx, config, cwd, secrets, files)
            group = _Group(proc, self._grace)
            budget = OutputBudget(self._output_max, group.kill)
            stdout, stderr = StdoutSink(ctx.events, self._result_max), StderrSink(ctx.events)
            readers: list[PipeReader] = []
            transports: list[asyncio.BaseTransport] = []
            stdin: asyncio.WriteTransport | None = None
            try:
                sink: OutputSink
                for end, sink in ((out_r, stdout), (err_r, stderr)):
                    transport, reader = await loop.connect_read_pipe(
                        functools.partial(PipeReader, sink, budget, group.kill), end
                    )
                    transports.append(transport)
                    readers.append(reader)
                if in_w is not None:
                    stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, in_w)
                    # Buffered by the transport and written as the command reads: never blocks.
                    stdin.write(json.dumps(ctx.as_dict()).encode() + b"\n")
                    stdin.close()
                try:
                    async with asyncio.timeout(config.timeout_s):
                        await proc.wait()
                except TimeoutError:
                    raise ProcessTimeout(f"timed out after {config.timeout_s:g} s") from None
            finally:
                try:
                    await group.end()
                    if readers:  # what the group wrote before it ended is still in the pipes
                        await asyncio.wait([r.closed for r in readers], timeout=self._grace)
                finally:
                    # Nothing reaches the events once the adapter has returned.
                    for reader in readers:
                        reader.detach()
                    for pipe in transports:
                        pipe.close()
                    # Unwritten context for a command that is gone: drop it and the pipe.
                    if stdin is not None and stdin.get_write_buffer_size():
                        stdin.abort()
        for reader in readers:
            if reader.error is not None:
                raise reader.error
        if budget.exceeded:
            raise ProcessFailed(
                f"stopped after writing more than {self._output_max} bytes to stdout and stderr"
            )
        return _outcome(proc.returncode, stdout, stderr)


async def _spawn(
    ctx: RunContext,
    config: StoredProcessConfig,
    cwd: str,
    secrets: Mapping[str, str],
    files: contextlib.ExitStack,
) -> tuple[asyncio.subprocess.Process, io.FileIO, io.FileIO, io.FileIO | None]:
    """Start the command as a new session's leader; its stdout, stderr and stdin pipes."""
    out_r, out_w = _pipe(files)
    err_r, err_w = _pipe(files)
    in_r, in_w = _pipe(files) if config.stdin == "context" else (None, None)
    try:
        proc = await asyncio.create_subprocess_exec(
            *config.command,
            stdin=asyncio.subprocess.DEVNULL if in_r is None else in_r,
            stdout=out_w,
            stderr=err_w,
            cwd=cwd,
            env=environment(config, ctx, cwd, secrets),
            start_new_session=True,
        )
    except OSError as exc:
        raise ProcessFailed(f"could not start {config.command[0]}: {exc.strerror or exc}") from exc
    finally:
        # The child holds its own copies; ours would keep the pipes from ending.
        for end in (out_w, err_w, in_r):
            if end is not None:
                end.close()
    return proc, out_r, err_r, in_w


class _Group:
    """The command's process group (its id is the leader's pid), until the run has ended it."""

    def __init__(self, proc: asyncio.subprocess.Process, grace_s: float) -> None:
        self._proc = proc
        self._grace = grace_s
        self._ended = False

    def kill(self) -> None:
        """SIGKILL the group now; nothing once it has been ended (its id may be reused)."""
        if not self._ended:
            _signal_group(self._proc.pid, signal.SIGKILL)

    async def end(self) -> None:
        """SIGTERM a running leader's group; SIGKILL what is left once it exits or at the grace."""
        proc = self._proc
        try:
            if proc.returncode is None and _signal_group(proc.pid, signal.SIGTERM):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._grace):
                        await proc.wait()
        finally:
            # Also on a second cancellation: the group never outlives the run.
            self.kill()
            self._ended = True
            await proc.wait()


def _outcome(code: int | None, stdout: StdoutSink, stderr: StderrSink) -> RunOutcome:
    if code == 0:
        return done(stdout.result())
    last = stderr.last_line
    tail = "" if last is None else f": {last[:_ERROR_LINE_MAX_CHARS]}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        raise ProcessFailed(f"killed by {name}{tail}")
    raise ProcessFailed(f"exited with status {code}{tail}")


def _pipe(files: contextlib.ExitStack) -> tuple[io.FileIO, io.FileIO]:
    read_fd, write_fd = os.pipe()
    read_end = files.enter_context(io.FileIO(read_fd, "r"))
    return read_end, files.enter_context(io.FileIO(write_fd, "w"))


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a process group; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its user (setuid): out of reach, still there
        return True
    return True


def _remove_tree(path: str) -> None:
    """Remove a run's directory, opening up directories the command made read-only."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    if os.path.islink(path):  # the command replaced its directory: remove only the link
        os.unlink(path)
        return
    # Top down, each directory opened before it is listed; never through a symbolic link.
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            inner = os.path.join(root, name)
            if not os.path.islink(inner):
                with contextlib.suppress(OSError):
                    os.chmod(inner, 0o700)
    try:
        shutil.rmtree(path)
    except OSError as exc:
        log.warning("could not remove a process run's directory %s: %s", path, exc)
