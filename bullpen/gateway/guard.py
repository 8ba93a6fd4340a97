"""The outbound guard where the gateway connects: the webhook agents' rules, for providers.

A workspace admin who sets a provider's URL could otherwise make the gateway call the cloud
metadata service, the database, or map the internal network by the errors it gets back. The
URL is checked when a provider is created or changed (`bullpen.agents.outbound.check_url`);
this module checks again on every new connection, where it counts: the host is resolved
once, every address it resolves to must be allowed (public, or named by
`BULLPEN_OUTBOUND_ALLOW`), and the connection goes to one of those checked addresses, never
to the name (a name that answers the check with one address and the connect with another,
DNS rebinding, gains nothing). A row stored before the check existed, or edited in the
database, meets the same refusal.

Built-in providers (the simulator `bullpen up` starts, or `BULLPEN_SIM_URL`) are configured
by the operator, not by a workspace, and are not guarded: see `GatewayClient`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from ipaddress import IPv6Address, ip_address

import aiohttp
from aiohttp.abc import AbstractResolver

from bullpen.agents.outbound import OutboundAllow, OutboundRefused, refusal_reason


@dataclass(frozen=True, slots=True)
class Checked:
    """Where a host may be connected to: its addresses, every one allowed."""

    addresses: tuple[tuple[socket.AddressFamily, str], ...]
    # Every address is public and the host is not allowed by name: failures of calls to it
    # may be shown as they are. Otherwise they are shown alike (see `GatewayClient`).
    public: bool


class AddressGuard:
    """Resolves a provider's host and refuses it when any address is not allowed.

    `resolver` does the lookups (aiohttp's default, the system's, when None); tests pass a
    stub to make a name resolve to a chosen address.
    """

    def __init__(self, allow: OutboundAllow, resolver: AbstractResolver | None = None) -> None:
        self._allow = allow
        self._owns_resolver = resolver is None
        self._resolver = aiohttp.DefaultResolver() if resolver is None else resolver

    async def check(self, host: str, port: int) -> Checked:
        """The host's addresses, all allowed; else OutboundRefused (nothing was connected)."""
        try:
            literal = ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            family = socket.AF_INET6 if isinstance(literal, IPv6Address) else socket.AF_INET
            found = [(family, host)]
        else:
            results = await self._resolver.resolve(host, port, socket.AF_UNSPEC)
            found = [(socket.AddressFamily(r["family"]), r["host"]) for r in results]
        if not found:
            raise OSError(f"{host!r} resolved to no address")
        by_name = self._allow.permits_name(host)
        public = not by_name
        for _, text in found:
            address = ip_address(text)
            if refusal_reason(address) is None:
                continue
            public = False
            why = None if by_name else self._allow.refusal(address)
            if why is not None:
                raise OutboundRefused(
                    f"refused to call {host} ({address}): not a public address ({why})"
                )
        return Checked(tuple(found), public)

    async def close(self) -> None:
        """Close the resolver if this guard made it."""
        if self._owns_resolver:
            await self._resolver.close()
