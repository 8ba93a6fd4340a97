"""Agent configs per adapter: what is checked and stored when an agent is configured, and what
the API shows of a stored config.

An `http` agent's signing secret is sealed (AES-GCM, bound to the agent's id) and never shown;
its url must be one Bullpen may call. A `process` agent's command must be on the operator's
allow-list (`BULLPEN_PROCESS_ALLOW`), and its environment names on `BULLPEN_PROCESS_ENV_ALLOW`;
its `secret_env` is sealed like the webhook secret and never shown, and its `env` values are
shown only to callers that may change agents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from bullpen.agents import http, process, process_env
from bullpen.errors import InvalidInput
from bullpen.security.outbound import OutboundAllow, OutboundRefused
from bullpen.security.secrets import SecretBox


@dataclass(frozen=True, slots=True)
class ConfigPolicy:
    """What the server allows agents to be configured with."""

    box: SecretBox
    outbound: OutboundAllow
    process_allow: frozenset[str]
    process_env_allow: process_env.EnvAllow

    def stored(
        self,
        adapter: str,
        config: BaseModel,
        agent_id: UUID,
        previous: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The config to store for an agent of `adapter`; InvalidInput if it is not one."""
        if adapter == "http" and isinstance(config, http.HttpAgentConfig):
            try:
                return http.stored_config(
                    config,
                    box=self.box,
                    agent_id=agent_id,
                    allow=self.outbound,
                    previous=previous,
                )
            except InvalidInput as err:
                if err.errors:
                    raise
                field, code = (
                    ("config.url", "outbound_refused")
                    if isinstance(err, OutboundRefused)
                    else ("config.secret", "missing")
                    if config.secret is None and "secret" in err.detail
                    else ("config.url", "invalid_url")
                )
                raise type(err)(err.detail, errors=[_field(field, err.detail, code)]) from None
        if adapter == "process" and isinstance(config, process.ProcessAgentConfig):
            process.check_allowed(config, self.process_allow)
            process_env.check_env(config.env, config.secret_env or {}, self.process_env_allow)
            stored = process.stored_config(
                config, box=self.box, agent_id=agent_id, previous=previous
            )
            if config.secret_env is None:  # values kept: their names must still be allowed
                process_env.check_env(
                    stored["env"], stored.get("secret_env_sealed", {}), self.process_env_allow
                )
            return stored
        if adapter == "llm" and not isinstance(
            config, (http.HttpAgentConfig, process.ProcessAgentConfig)
        ):
            return config.model_dump(exclude_none=True)  # unset options are left out, not null
        message = f"expected the config of an {adapter!r} agent"
        raise InvalidInput(
            f"the config is not an {adapter!r} agent's config",
            errors=[_field("config", message, "adapter_mismatch")],
        )


def _field(field: str, message: str, code: str) -> dict[str, str]:
    return {"location": "body", "field": field, "message": message, "code": code}


def public_config(adapter: str, stored: Mapping[str, Any], *, values: bool) -> dict[str, Any]:
    """What the API, the audit log and events may show of a stored config.

    `values`: whether the reader may see a `process` agent's `env` values (it may change
    agents, or it is the audit log); never its secret values.
    """
    if adapter == "http":
        return http.public_config(stored)
    if adapter == "process":
        return process_env.public_config(stored, values=values)
    return dict(stored)
