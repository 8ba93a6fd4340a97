"""A `process` agent's environment: the operator's allow-list of names, its sealed secrets,
and what the API and the audit log show of both (issue 19, finding 7).

`BULLPEN_PROCESS_ENV_ALLOW` lists the names configs may set in `env` and `secret_env`: names, or
prefixes ending in `*` (`LC_*`), matched case-sensitively. `PATH`, `HOME` and `BULLPEN_…` are
Bullpen's own and never allowed. There is no deny-list: too many names make some program load
code or send its traffic elsewhere (`OPENSSL_CONF`, `LUA_INIT`, `GIT_SSH_COMMAND`,
`http_proxy`, …) for a list of them to be complete, so a name is refused unless the operator
names it.

Each `secret_env` value is sealed (`SecretBox`, AES-GCM, bound to the agent and the name) and
opened only by the worker that starts the command. The API shows `secret_env_hints` (the last 4
characters of a value of 16 or more, else nothing), or only the names to readers without
`agents:write`, who see `env`'s names but not its values either. Stored values are kept across a
config change only while `command`, `cwd` and `env` stay the same, so a changed config cannot
give them to another program or point the program elsewhere.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from bullpen.errors import BullpenError, InvalidInput
from bullpen.security.secrets import SecretBox

ENV_ALLOW_SETTING = "BULLPEN_PROCESS_ENV_ALLOW"
# Locale and time zone: names whose values only choose how text, dates and colours look.
ENV_ALLOW_DEFAULT = "LANG,LANGUAGE,LC_*,TZ,NO_COLOR"
ENV_MAX_ENTRIES = 32  # `env` and `secret_env` together
# Names Bullpen sets itself, compared case-insensitively (Bullpen reads its own settings so):
# never settable by a config, whatever the operator allows.
ENV_RESERVED_NAMES = frozenset({"PATH", "HOME"})
ENV_RESERVED_PREFIX = "BULLPEN_"
SECRET_HINT_MIN_CHARS = 16  # shorter secret values show no character at all
_ENV_ALLOW_ENTRY = r"[A-Za-z_][A-Za-z0-9_]*\*?"


class ProcessEnvRefused(InvalidInput):
    """A `process` agent's config sets an environment variable the operator does not allow."""

    slug = "process-env-not-allowed"
    title = "Environment variable not allowed"


class ProcessSecretEnvRequired(InvalidInput):
    """A config change would give a `process` agent's sealed secrets to another program."""

    slug = "process-secret-env-required"
    title = "Secret environment needed again"


def env_name_reserved(name: str) -> bool:
    """True for the names Bullpen sets itself (`PATH`, `HOME`, `BULLPEN_…`)."""
    upper = name.upper()
    return upper in ENV_RESERVED_NAMES or upper.startswith(ENV_RESERVED_PREFIX)


@dataclass(frozen=True, slots=True)
class EnvAllow:
    """The environment names `process` agents may set (`BULLPEN_PROCESS_ENV_ALLOW`)."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str) -> EnvAllow:
        """Comma-separated names and prefixes ending in `*` (`LC_*`); matched case-sensitively."""
        entries = [part.strip() for part in raw.split(",") if part.strip()]
        bad = sorted(entry for entry in entries if re.fullmatch(_ENV_ALLOW_ENTRY, entry) is None)
        if bad:
            raise BullpenError(
                f"{ENV_ALLOW_SETTING} takes variable names and prefixes ending in `*` "
                f"(`LC_*`), not {', '.join(bad)}"
            )
        reserved = sorted(entry for entry in entries if env_name_reserved(entry.rstrip("*")))
        if reserved:
            raise BullpenError(
                f"{ENV_ALLOW_SETTING} cannot allow {', '.join(reserved)}: PATH, HOME and "
                "BULLPEN_… are set by Bullpen"
            )
        return cls(
            names=frozenset(entry for entry in entries if not entry.endswith("*")),
            prefixes=tuple(sorted({entry[:-1] for entry in entries if entry.endswith("*")})),
        )

    def allows(self, name: str) -> bool:
        """Whether a config may set `name`."""
        if env_name_reserved(name):
            return False
        return name in self.names or name.startswith(self.prefixes)


def secret_env_context(agent_id: UUID, name: str) -> bytes:
    """The associated data binding a sealed secret env value to its agent and name."""
    return b"agent-process-env:" + agent_id.bytes + name.encode()


def secret_hint(value: str) -> str:
    """What the API shows of a secret env value: its last 4 characters, if it is long."""
    return "…" + value[-4:] if len(value) >= SECRET_HINT_MIN_CHARS else "…"


def sealed_secrets(plain: Mapping[str, str], box: SecretBox, agent_id: UUID) -> dict[str, Any]:
    """The stored form of secret env values: sealed, with their hints (nothing for none)."""
    if not plain:
        return {}
    return {
        "secret_env_sealed": {
            name: base64.b64encode(box.seal(value, secret_env_context(agent_id, name))).decode()
            for name, value in plain.items()
        },
        "secret_env_hints": {name: secret_hint(value) for name, value in plain.items()},
    }


def open_secrets(
    sealed: Mapping[str, str], box: SecretBox | None, agent_id: UUID
) -> dict[str, str]:
    """Stored secret env values, opened (the worker holds them only to start the command)."""
    if not sealed:
        return {}
    if box is None:
        raise InvalidInput("this worker cannot open a process agent's secret_env")
    opened = {}
    for name, value in sealed.items():
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError:
            raise InvalidInput(
                f"the agent's secret_env {name} is damaged; set secret_env again"
            ) from None
        opened[name] = box.open(raw, secret_env_context(agent_id, name))
    return opened


def _runs_the_same(config: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    """Whether two stored configs run the same program the same way (so keep its secrets)."""
    return all(
        config.get(key, default) == previous.get(key, default)
        for key, default in (("command", None), ("cwd", None), ("env", {}))
    )


def kept_secrets(stored: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """`previous`'s sealed secrets and hints, if the new config may keep them."""
    sealed = previous.get("secret_env_sealed") if previous is not None else None
    if previous is None or not isinstance(sealed, Mapping) or not sealed:
        return {}
    if not _runs_the_same(stored, previous):
        message = (
            f"changing command, cwd or env needs secret_env again ({', '.join(sorted(sealed))}), "
            "or `{}` to drop it: stored secrets are kept only while what runs stays the same"
        )
        raise ProcessSecretEnvRequired(
            message, errors=[_config_error("config.secret_env", message, "required")]
        )
    hints = previous.get("secret_env_hints")
    hints = hints if isinstance(hints, Mapping) else {}
    return {
        "secret_env_sealed": dict(sealed),
        "secret_env_hints": {name: hints.get(name, "…") for name in sealed},
    }


def public_config(stored: Mapping[str, Any], *, values: bool) -> dict[str, Any]:
    """What the API and the audit log show of a stored config: never a secret value.

    With `values` (callers that may change agents, and the audit log): `env` and
    `secret_env_hints` (when there are secrets). Without: `env_names` and `secret_env_names`.
    """
    shown = {
        key: stored[key] for key in ("command", "cwd", "env", "timeout_s", "stdin") if key in stored
    }
    hints = stored.get("secret_env_hints")
    hints = dict(hints) if isinstance(hints, Mapping) else {}
    if values:
        if hints:
            shown["secret_env_hints"] = hints
        return shown
    env = shown.pop("env", None)
    shown["env_names"] = sorted(env) if isinstance(env, Mapping) else []
    shown["secret_env_names"] = sorted(hints)
    return shown


def check_env(env: Collection[str], secret_env: Collection[str], allow: EnvAllow) -> None:
    """Refuse names the operator does not allow, a name in both, and too many in all."""
    errors = [
        _config_error(
            f"config.{field}.{name}", f"{ENV_ALLOW_SETTING} does not allow {name}", "not_allowed"
        )
        for field, names in (("env", env), ("secret_env", secret_env))
        for name in sorted(names)
        if not allow.allows(name)
    ]
    if errors:
        refused = ", ".join(dict.fromkeys(e["field"].split(".", 2)[2] for e in errors))
        raise ProcessEnvRefused(
            f"may not set {refused}: {ENV_ALLOW_SETTING} does not allow it (the operator lists "
            "the names agents may set; PATH, HOME and BULLPEN_… never)",
            errors=errors,
        )
    both = sorted(set(env) & set(secret_env))
    if both:
        message = f"{', '.join(both)} may be in env or in secret_env, not in both"
        raise InvalidInput(
            message, errors=[_config_error(f"config.secret_env.{both[0]}", message, "duplicate")]
        )
    if len(env) + len(secret_env) > ENV_MAX_ENTRIES:
        message = f"env and secret_env may hold {ENV_MAX_ENTRIES} variables in all"
        raise InvalidInput(
            message, errors=[_config_error("config.secret_env", message, "too_many")]
        )


def _config_error(field: str, message: str, code: str) -> dict[str, str]:
    return {"location": "body", "field": field, "message": message, "code": code}
