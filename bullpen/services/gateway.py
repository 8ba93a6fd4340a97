"""The gateway's configuration: providers and model routes per workspace.

- `GatewayConfig`: create, change, delete and read providers and model routes, each change
  audited in its transaction. API keys are sealed (AES-GCM) before they reach the store and
  are never returned; callers see a masked hint. A provider's URL must pass the outbound
  guard (`BULLPEN_OUTBOUND_ALLOW`, as webhook agents' do), and a key is only ever sent to the
  origin it was given for: moving a provider to another scheme, host or port needs the key
  again (else an admin could point the provider at a listener of theirs and read the key
  off the next call).
- `GatewayConfig.check_provider`: one minimal streamed call to a provider now, through the
  gateway's client (its timeouts, its key, the outbound guard), at most `CHECKS_PER_WORKSPACE`
  at once per workspace and process.
- `Directory`: the catalog the gateway calls from, per workspace, cached for a short time
  (changes made in this process apply at once; other processes see them within the TTL).

The usage ledger (cost rows of relay calls) is in `bullpen.services.ledger`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal
from bullpen.domain.records.gateway import ProviderRecord, RouteRecord
from bullpen.errors import Conflict, InvalidInput, ModelNotFound, NotFound, RateLimited
from bullpen.gateway.catalog import Catalog, Price, Provider, Target, Timeouts
from bullpen.gateway.check import CheckResult
from bullpen.security.outbound import OutboundAllow, OutboundRefused, check_url
from bullpen.security.secrets import SecretBox, hint
from bullpen.store import audit
from bullpen.store import gateway as gateway_store
from bullpen.store.base import Connection, Store

log = logging.getLogger(__name__)

MAX_CHAIN = 8
CHECKS_PER_WORKSPACE = 2  # provider checks in flight at once, per workspace and process

Checker = Callable[[Provider, str], Awaitable[CheckResult]]


def key_context(provider_id: UUID) -> bytes:
    """The associated data binding a sealed key to its provider row."""
    return b"provider:" + provider_id.bytes


class ProviderKeyRequired(InvalidInput):
    """A provider's URL moves to another origin while its key would be kept."""

    slug = "provider-key-required"
    title = "The provider's API key is required again"


def origin(url: str) -> tuple[str, str, int]:
    """Where a URL's requests go: scheme, host (as written, lower-cased) and port."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


class Directory:
    """Each workspace's catalog: its providers and routes, plus the built-in ones."""

    def __init__(
        self,
        store: Store,
        box: SecretBox,
        *,
        builtins: Sequence[Provider],
        ttl_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._box = box
        self._builtins = {p.name: p for p in builtins}
        self._ttl_s = ttl_s
        self._clock = clock
        self._cached: dict[UUID, tuple[float, Catalog]] = {}
        self._loading: dict[UUID, asyncio.Future[Catalog]] = {}

    @property
    def builtin_names(self) -> frozenset[str]:
        """Provider names no workspace may take."""
        return frozenset(self._builtins)

    @property
    def builtins(self) -> list[Provider]:
        """The operator's providers every workspace has (the simulator), by name."""
        return [self._builtins[name] for name in sorted(self._builtins)]

    async def catalog(self, workspace_id: UUID) -> Catalog:
        """The workspace's catalog; one load at a time per workspace, shared by all waiters."""
        found = self._cached.get(workspace_id)
        if found is not None and found[0] > self._clock():
            return found[1]
        pending = self._loading.get(workspace_id)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not pending.cancelled() or (current is not None and current.cancelling()):
                    raise  # this caller was cancelled
            # The loader was cancelled (its run stopped, its client went away), not this
            # caller: its CancelledError would end this run or request as if it had been.
            return await self.catalog(workspace_id)
        future: asyncio.Future[Catalog] = asyncio.get_running_loop().create_future()
        self._loading[workspace_id] = future
        try:
            catalog = await self._load(workspace_id)
        except asyncio.CancelledError:
            future.cancel()  # the waiters load it again themselves
            raise
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._loading[workspace_id]
        self._cached[workspace_id] = (self._clock() + self._ttl_s, catalog)
        future.set_result(catalog)
        return catalog

    def invalidate(self, workspace_id: UUID) -> None:
        """Forget a workspace's catalog (after a change made here)."""
        self._cached.pop(workspace_id, None)

    async def _load(self, workspace_id: UUID) -> Catalog:
        async with self._store.read() as conn:
            provider_rows = await gateway_store.list_providers(conn, workspace_id)
            route_rows = await gateway_store.list_routes(conn, workspace_id)
        found = dict(self._builtins)
        for provider in provider_rows:
            found[provider.name] = self._provider(provider)
        routes: dict[str, tuple[Target, ...]] = {}
        for route in route_rows:
            chain = tuple(
                Target(found[link["provider"]], link["model"])
                for link in route.chain
                if link["provider"] in found
            )
            if chain:
                routes[route.name] = chain
        return Catalog(providers=found, routes=routes)

    def opened(self, row: ProviderRecord) -> Provider:
        """A stored provider as the gateway calls it (its key unsealed)."""
        return self._provider(row)

    def _provider(self, row: ProviderRecord) -> Provider:
        api_key = None
        if row.api_key_ciphertext is not None:
            api_key = self._box.open(row.api_key_ciphertext, key_context(row.id))
        return Provider(
            key=str(row.id),
            name=row.name,
            base_url=row.base_url,
            timeouts=Timeouts(
                connect_s=row.connect_timeout_s,
                ttft_s=row.ttft_timeout_s,
                idle_s=row.idle_timeout_s,
                deadline_s=row.deadline_s,
            ),
            prices={
                m["name"]: Price(
                    input=m.get("input_per_mtok", 0.0),
                    cached_input=m.get("cached_input_per_mtok", 0.0),
                    output=m.get("output_per_mtok", 0.0),
                )
                for m in row.models
            },
            api_key=api_key,
        )


class GatewayConfig:
    """Providers and model routes of the caller's workspace."""

    def __init__(
        self,
        store: Store,
        box: SecretBox,
        directory: Directory,
        clock: Callable[[], datetime],
        defaults: Timeouts,
        outbound: OutboundAllow,
        checker: Checker | None = None,
    ) -> None:
        self._store = store
        self._box = box
        self._directory = directory
        self._clock = clock
        self._defaults = defaults
        self._outbound = outbound
        self._checker = checker
        self._checking: Counter[UUID] = Counter()

    # ---- providers ------------------------------------------------------------------------

    async def list_providers(self, principal: Principal) -> list[ProviderRecord]:
        """The workspace's providers by name."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await gateway_store.list_providers(conn, principal.workspace_id)

    async def get_provider(self, principal: Principal, provider_id: UUID) -> ProviderRecord:
        """One provider; another workspace's is NotFound."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await self._provider(conn, principal, provider_id)

    async def create_provider(
        self,
        principal: Principal,
        *,
        name: str,
        base_url: str,
        api_key: str | None,
        models: list[dict[str, Any]],
        timeouts: dict[str, float],
    ) -> ProviderRecord:
        """Add a provider; its key is sealed and only its hint kept in the clear."""
        need(principal, Permission.PROVIDERS_WRITE)
        self._check_name(name)
        self._check_url(base_url)
        provider_id = uuid.uuid4()
        now = self._clock()
        values: dict[str, Any] = {
            "name": name,
            "base_url": base_url,
            "models": models,
            "api_key_ciphertext": None,
            "api_key_hint": None,
            **self._timeouts(timeouts),
        }
        if api_key is not None:
            values["api_key_ciphertext"] = self._box.seal(api_key, key_context(provider_id))
            values["api_key_hint"] = hint(api_key)
        async with self._store.write() as conn:
            await gateway_store.create_provider(
                conn,
                provider_id=provider_id,
                workspace_id=principal.workspace_id,
                values=values,
                now=now,
            )
            await audit.record_by(
                conn,
                principal,
                "provider.create",
                "provider",
                provider_id,
                now,
                _auditable(values),
            )
            row = await self._provider(conn, principal, provider_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def update_provider(
        self, principal: Principal, provider_id: UUID, changes: dict[str, Any]
    ) -> ProviderRecord:
        """Change fields; `api_key` replaces the key, or removes it when None."""
        need(principal, Permission.PROVIDERS_WRITE)
        if "name" in changes:
            self._check_name(changes["name"])
        if "base_url" in changes:
            self._check_url(changes["base_url"])
        now = self._clock()
        async with self._store.write() as conn:
            # Locked: a key set meanwhile by another request must be seen by the check below.
            before = await self._provider(conn, principal, provider_id, for_update=True)
            if (
                "base_url" in changes
                and "api_key" not in changes
                and before.api_key_ciphertext is not None
                and origin(changes["base_url"]) != origin(before.base_url)
            ):
                message = (
                    "a provider's API key is only sent where it was given for: changing the "
                    "scheme, host or port of base_url needs api_key in the same request "
                    "(or api_key: null to call the new address without a key)"
                )
                raise ProviderKeyRequired(
                    message,
                    errors=[_field("api_key", message, "required_for_new_origin")],
                )
            values = {k: v for k, v in changes.items() if k not in ("api_key", "timeouts")}
            if "timeouts" in changes:
                current = {
                    "connect_s": before.connect_timeout_s,
                    "ttft_s": before.ttft_timeout_s,
                    "idle_s": before.idle_timeout_s,
                    "deadline_s": before.deadline_s,
                }
                values |= self._timeouts({**current, **changes["timeouts"]})
            if "api_key" in changes:
                key = changes["api_key"]
                values["api_key_ciphertext"] = (
                    None if key is None else self._box.seal(key, key_context(provider_id))
                )
                values["api_key_hint"] = None if key is None else hint(key)
            if "name" in values and values["name"] != before.name:
                await self._check_unused(conn, principal.workspace_id, before.name)
            changed = {k: v for k, v in values.items() if getattr(before, k) != v}
            if not changed:
                return before
            await gateway_store.update_provider(conn, provider_id, changed, now)
            await audit.record_by(
                conn,
                principal,
                "provider.update",
                "provider",
                provider_id,
                now,
                {
                    "before": _auditable({k: getattr(before, k) for k in changed}),
                    "after": _auditable(changed),
                },
            )
            row = await self._provider(conn, principal, provider_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def delete_provider(self, principal: Principal, provider_id: UUID) -> None:
        """Delete a provider no route uses (409 names the routes that do)."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._provider(conn, principal, provider_id)
            await self._check_unused(conn, principal.workspace_id, before.name)
            await gateway_store.delete_provider(conn, provider_id)
            await audit.record_by(
                conn,
                principal,
                "provider.delete",
                "provider",
                provider_id,
                now,
                {"name": before.name, "base_url": before.base_url},
            )
        self._directory.invalidate(principal.workspace_id)

    async def check_provider(
        self, principal: Principal, provider_id: UUID, model: str | None = None
    ) -> CheckResult:
        """Call the provider once now (`model`, else the first it lists) and time the answer;
        a failure is the client's typed ProviderError, its text free of the key."""
        need(principal, Permission.PROVIDERS_WRITE)
        if self._checker is None:
            raise Conflict("this process cannot call providers")
        async with self._store.read() as conn:
            row = await self._provider(conn, principal, provider_id)
        offered = [m["name"] for m in row.models]
        # As a route's link: a model the provider does not list is not found (404).
        if model is None:
            if not offered:
                raise ModelNotFound(
                    f"provider {row.name!r} lists no models: name the model to check"
                )
            model = offered[0]
        elif offered and model not in offered:
            raise ModelNotFound(
                f"provider {row.name!r} offers no model {model!r} (it offers {', '.join(offered)})"
            )
        workspace = principal.workspace_id
        if self._checking[workspace] >= CHECKS_PER_WORKSPACE:
            raise RateLimited(
                f"at most {CHECKS_PER_WORKSPACE} provider checks run at once in a workspace",
                retry_after=1.0,
            )
        self._checking[workspace] += 1
        try:
            result = await self._checker(self._directory.opened(row), model)
        finally:
            self._checking[workspace] -= 1
            if not self._checking[workspace]:
                del self._checking[workspace]
        log.info("provider %r checked: %s answered in %.0f ms", row.name, model, result.latency_ms)
        return result

    # ---- routes ---------------------------------------------------------------------------

    async def list_routes(self, principal: Principal) -> list[RouteRecord]:
        """The workspace's model routes by name."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await gateway_store.list_routes(conn, principal.workspace_id)

    async def get_route(self, principal: Principal, route_id: UUID) -> RouteRecord:
        """One route; another workspace's is NotFound."""
        need(principal, Permission.PROVIDERS_READ)
        async with self._store.read() as conn:
            return await self._route(conn, principal, route_id)

    async def create_route(
        self, principal: Principal, *, name: str, chain: list[dict[str, str]]
    ) -> RouteRecord:
        """Add a route whose every link names a provider (and a model it offers)."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            await self._check_chain(conn, principal.workspace_id, chain)
            route_id = await gateway_store.create_route(
                conn, workspace_id=principal.workspace_id, name=name, chain=chain, now=now
            )
            await audit.record_by(
                conn,
                principal,
                "route.create",
                "model_route",
                route_id,
                now,
                {"name": name, "chain": chain},
            )
            row = await self._route(conn, principal, route_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def update_route(
        self, principal: Principal, route_id: UUID, changes: dict[str, Any]
    ) -> RouteRecord:
        """Rename a route or replace its chain."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._route(conn, principal, route_id)
            if "chain" in changes:
                await self._check_chain(conn, principal.workspace_id, changes["chain"])
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if not changed:
                return before
            await gateway_store.update_route(conn, route_id, changed, now)
            await audit.record_by(
                conn,
                principal,
                "route.update",
                "model_route",
                route_id,
                now,
                {"before": {k: getattr(before, k) for k in changed}, "after": changed},
            )
            row = await self._route(conn, principal, route_id)
        self._directory.invalidate(principal.workspace_id)
        return row

    async def delete_route(self, principal: Principal, route_id: UUID) -> None:
        """Delete a route."""
        need(principal, Permission.PROVIDERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._route(conn, principal, route_id)
            await gateway_store.delete_route(conn, route_id)
            await audit.record_by(
                conn,
                principal,
                "route.delete",
                "model_route",
                route_id,
                now,
                {"name": before.name, "chain": before.chain},
            )
        self._directory.invalidate(principal.workspace_id)

    # ---- checks ---------------------------------------------------------------------------

    def _check_name(self, name: str) -> None:
        if name in self._directory.builtin_names:
            raise Conflict(f"{name!r} is the name of a built-in provider; choose another")

    def _check_url(self, base_url: str) -> None:
        """The outbound guard's URL check (host names are checked again when connecting)."""
        try:
            check_url(base_url, self._outbound)
        except InvalidInput as err:
            code = "outbound_refused" if isinstance(err, OutboundRefused) else "invalid_url"
            raise type(err)(err.detail, errors=[_field("base_url", err.detail, code)]) from None

    def _timeouts(self, given: dict[str, float]) -> dict[str, float]:
        d = self._defaults
        out = {
            "connect_timeout_s": given.get("connect_s", d.connect_s),
            "ttft_timeout_s": given.get("ttft_s", d.ttft_s),
            "idle_timeout_s": given.get("idle_s", d.idle_s),
            "deadline_s": given.get("deadline_s", d.deadline_s),
        }
        return out

    async def _check_chain(
        self, conn: Connection, workspace_id: UUID, chain: list[dict[str, str]]
    ) -> None:
        if not 1 <= len(chain) <= MAX_CHAIN:
            raise InvalidInput(f"a route's chain has 1 to {MAX_CHAIN} links")
        rows = {r.name: r for r in await gateway_store.list_providers(conn, workspace_id)}
        builtins = self._directory.builtin_names
        for i, link in enumerate(chain):
            name, model = link["provider"], link["model"]
            row = rows.get(name)
            if row is None and name not in builtins:
                raise NotFound(f"chain[{i}]: no provider named {name!r} in this workspace")
            offered = [m["name"] for m in row.models] if row is not None else None
            if offered and model not in offered:
                raise NotFound(
                    f"chain[{i}]: provider {name!r} offers no model {model!r} "
                    f"(it offers {', '.join(offered)})"
                )

    async def _check_unused(self, conn: Connection, workspace_id: UUID, name: str) -> None:
        using = [
            r.name
            for r in await gateway_store.list_routes(conn, workspace_id)
            if any(link["provider"] == name for link in r.chain)
        ]
        if using:
            raise Conflict(
                f"provider {name!r} is used by model routes {', '.join(sorted(using))}; "
                "change those routes first"
            )

    async def _provider(
        self, conn: Connection, principal: Principal, provider_id: UUID, *, for_update: bool = False
    ) -> ProviderRecord:
        row = await gateway_store.get_provider(
            conn, principal.workspace_id, provider_id, for_update=for_update
        )
        if row is None:
            raise NotFound("no such provider")
        return row

    async def _route(self, conn: Connection, principal: Principal, route_id: UUID) -> RouteRecord:
        row = await gateway_store.get_route(conn, principal.workspace_id, route_id)
        if row is None:
            raise NotFound("no such model route")
        return row


def _field(field: str, message: str, code: str) -> dict[str, str]:
    return {"location": "body", "field": field, "message": message, "code": code}


def _auditable(values: dict[str, Any]) -> dict[str, Any]:
    """Provider values fit for the audit log: the sealed key becomes whether one is set."""
    out = {k: v for k, v in values.items() if k != "api_key_ciphertext"}
    if "api_key_ciphertext" in values:
        out["api_key_set"] = values["api_key_ciphertext"] is not None
    return out
