"""The guard on calls to addresses users configure (webhook agents): no SSRF.

A user who can set an agent's URL could otherwise make the worker call the cloud metadata
service, the database, or anything else on its network. Only public addresses are called,
plus what `BULLPEN_OUTBOUND_ALLOW` names: CIDRs (`10.1.0.0/16`) and host names
(`agents.internal`, allowed whatever they resolve to).

Two checks, both needed:

- `check_url` runs on the configured URL and on every redirect hop before the request: the
  scheme, no user info, and a literal IP address (which aiohttp connects to without asking
  the resolver) must be allowed. Legacy numeric IPv4 forms (`2130706433`, `0x7f.1`,
  `127.1`) and `localhost` are refused outright.
- `GuardedResolver` is the connector's resolver: a host name is resolved, and refused when
  any of its addresses is not allowed. The address checked is the address connected to, so
  a name that changes its answer between a check and the connect (DNS rebinding) gains
  nothing.

Refusals raise `OutboundRefused` (permanent: the same target is refused next time too).

The gateway applies the same rules to workspace providers: `check_url` when a provider is
created or changed, and `AddressGuard` on every new connection, where it counts: the host is
resolved once, every address it resolves to must be allowed, and the connection goes to one of
those checked addresses, never to the name. A row stored before the check existed, or edited in
the database, meets the same refusal. Built-in providers (the simulator `bullpen up` starts, or
`BULLPEN_SIM_URL`) are configured by the operator, not by a workspace, and are not guarded: see
`GatewayClient`. Both guards ask one question, `first_refused`.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from bullpen.errors import InvalidInput

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

SETTING = "BULLPEN_OUTBOUND_ALLOW"
SCHEMES = frozenset({"http", "https"})


class OutboundRefused(InvalidInput):
    """A URL, or an address its host resolves to, may not be called from this server."""

    slug = "outbound-refused"
    title = "Outbound address refused"


# What each non-public range is, in the words of the refusal. Ordered: the first match names it.
_NON_PUBLIC: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ip_network(cidr), why)
    for cidr, why in (
        ("0.0.0.0/8", "unspecified, 'this network'"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared, carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local, e.g. cloud metadata"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("::/8", "reserved, IPv4-compatible or translated"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo tunnel"),
        ("2001::/23", "IETF protocol assignment"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4 tunnel"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment-routing"),
        ("fc00::/7", "unique-local, private"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_NAT64 = IPv6Network("64:ff9b::/96")
_GLOBAL_UNICAST = IPv6Network("2000::/3")


def embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv4-mapped (`::ffff:a.b.c.d`) or NAT64 address stands for."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def refusal_reason(address: IPAddress) -> str | None:
    """Why an address is not public (`"loopback"`, `"private"`, ...), or None if it is."""
    if isinstance(address, IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            why = refusal_reason(inner)
            return None if why is None else f"{why}, as {inner}"
    for network, why in _NON_PUBLIC:
        if address in network:
            return why
    if isinstance(address, IPv6Address) and address not in _GLOBAL_UNICAST:
        return "reserved"
    if not address.is_global:
        return "non-global"
    return None


def _host_name(entry: str) -> str | None:
    """`entry` as a lower-case DNS name without its trailing dot, or None if it is not one."""
    name = entry.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or labels[-1].isdigit():
        return None  # a numeric last label is an IPv4 address in some form, never a name
    for label in labels:
        if not 0 < len(label) <= 63 or label[0] == "-" or label[-1] == "-":
            return None
        if not all(c.isascii() and (c.isalnum() or c == "-") for c in label):
            return None
    return name


@dataclass(frozen=True, slots=True)
class OutboundAllow:
    """The non-public targets an operator allowed: networks, and host names by name."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, spec: str) -> OutboundAllow:
        """Read the comma-separated setting; a malformed entry is a ValueError naming it."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in spec.split(","):
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ip_network(entry))
                continue
            except ValueError as err:
                if "/" in entry:
                    raise ValueError(f"{SETTING}: {entry!r} is not a valid CIDR ({err})") from None
            name = _host_name(entry)
            if name is None:
                raise ValueError(
                    f"{SETTING}: {entry!r} is neither a CIDR (10.1.0.0/16), an address "
                    "(10.1.2.3) nor a host name (agents.internal)"
                )
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def permits_name(self, host: str) -> bool:
        """Whether the host name is allowed by name (whatever it resolves to)."""
        return host.lower().removesuffix(".") in self.hosts

    def refusal(self, address: IPAddress) -> str | None:
        """Why connecting to the address is refused, or None when it is allowed."""
        why = refusal_reason(address)
        if why is None:
            return None
        candidates = [address]
        if isinstance(address, IPv6Address) and (inner := embedded_ipv4(address)) is not None:
            candidates.append(inner)
        if any(a in net for a in candidates for net in self.networks):
            return None
        return why


def first_refused(
    allow: OutboundAllow, host: str, addresses: Sequence[IPAddress]
) -> tuple[IPAddress, str] | None:
    """The first of `host`'s addresses that may not be called, and why; None when all may."""
    if allow.permits_name(host):
        return None
    for address in addresses:
        why = allow.refusal(address)
        if why is not None:
            return address, why
    return None


def _refused(host: str, address: IPAddress, why: str) -> OutboundRefused:
    shown = host if host == str(address) else f"{host} ({address})"
    return OutboundRefused(
        f"refused to call {shown}: not a public address ({why}); if this target is intended, "
        f"add it to {SETTING} (a CIDR or the host name)"
    )


def _legacy_ipv4(host: str) -> bool:
    """Whether the C library would read `host` as an IPv4 address (`127.1`, `0x7f000001`)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def check_url(url: str | URL, allow: OutboundAllow) -> URL:
    """The URL, checked for an outbound call; raise InvalidInput or OutboundRefused.

    Host names other than `localhost` are not resolved here: `GuardedResolver` checks the
    addresses when connecting.
    """
    try:
        parsed = url if isinstance(url, URL) else URL(url)
    except (ValueError, TypeError):
        raise InvalidInput("the url is not a valid URL") from None
    if parsed.scheme not in SCHEMES:
        raise InvalidInput("the url must start with http:// or https://")
    if parsed.user is not None or parsed.password is not None:
        raise InvalidInput("the url must not contain a user name or password")
    try:
        host = parsed.host
    except UnicodeError:  # a punycode label (`xn--…`) that decodes to nothing valid
        raise InvalidInput("the url's host is not a valid host name") from None
    if not host:
        raise InvalidInput("the url has no host")
    if allow.permits_name(host):
        return parsed
    try:
        address = ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        why = allow.refusal(address)
        if why is not None:
            raise _refused(host, address, why)
        return parsed
    if ":" in host:  # brackets that hold no IPv6 address (yarl takes them as a name)
        raise InvalidInput(f"the url's host {host!r} is not a valid IPv6 address")
    if _legacy_ipv4(host):
        raise InvalidInput(
            f"the url's host {host!r} reads as an IPv4 address in a legacy form; "
            "write the address as four decimal numbers (1.2.3.4)"
        )
    name = host.lower().removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        raise OutboundRefused(
            f"refused to call {host}: not a public address (loopback); if this target is "
            f"intended, add it to {SETTING} (the host name)"
        )
    return parsed


class GuardedResolver(AbstractResolver):
    """A resolver that refuses a host when any address it resolves to is not allowed.

    `inner` does the lookups (aiohttp's default resolver when None); tests pass their own
    to make a name resolve to a chosen address.
    """

    def __init__(self, allow: OutboundAllow, inner: AbstractResolver | None = None) -> None:
        self._allow = allow
        self._owns_inner = inner is None
        self._inner = aiohttp.DefaultResolver() if inner is None else inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The host's addresses, all of them allowed; else OutboundRefused."""
        found = await self._inner.resolve(host, port, family)
        refused = first_refused(self._allow, host, [ip_address(r["host"]) for r in found])
        if refused is not None:
            raise _refused(host, *refused)
        return found

    async def close(self) -> None:
        """Close the inner resolver if this guard made it."""
        if self._owns_inner:
            await self._inner.close()


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
        addresses = [ip_address(text) for _, text in found]
        refused = first_refused(self._allow, host, addresses)
        if refused is not None:
            address, why = refused
            raise OutboundRefused(
                f"refused to call {host} ({address}): not a public address ({why})"
            )
        public = not self._allow.permits_name(host) and all(
            refusal_reason(address) is None for address in addresses
        )
        return Checked(tuple(found), public)

    async def close(self) -> None:
        """Close the resolver if this guard made it."""
        if self._owns_resolver:
            await self._resolver.close()
