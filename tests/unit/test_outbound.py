"""The outbound guard's pure parts: address classes, the allow-list, URL checks, the resolver.

The resolver is given a stub lookup (DNS is a true external edge), so non-loopback private
ranges are refused here without any connect attempt: a broken guard sends no traffic.
"""

from __future__ import annotations

import socket
from ipaddress import ip_address, ip_network

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from bullpen.errors import InvalidInput
from bullpen.security.outbound import (
    AddressGuard,
    GuardedResolver,
    OutboundAllow,
    OutboundRefused,
    check_url,
    refusal_reason,
)

NOBODY = OutboundAllow()

ADDRESSES = [
    # Public.
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("2606:4700:4700::1111", None),
    ("2001:4860:4860::8888", None),
    ("::ffff:8.8.8.8", None),  # IPv4-mapped form of a public address
    ("64:ff9b::808:808", None),  # NAT64 form of 8.8.8.8
    # IPv4.
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("100.64.0.1", "shared"),
    ("100.127.255.254", "shared"),
    ("127.0.0.1", "loopback"),
    ("127.200.1.1", "loopback"),
    ("169.254.169.254", "link-local"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.9", "IETF"),
    ("192.0.2.10", "documentation"),
    ("192.88.99.1", "6to4"),
    ("192.168.1.1", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    # IPv6.
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
    ("::ffff:0:7f00:1", "reserved"),  # IPv4-translated
    ("::ffff:127.0.0.1", "loopback, as 127.0.0.1"),
    ("::ffff:10.1.2.3", "private, as 10.1.2.3"),
    ("::ffff:169.254.169.254", "link-local, e.g. cloud metadata, as 169.254.169.254"),
    ("::ffff:100.64.0.1", "shared"),
    ("64:ff9b::a00:1", "private, as 10.0.0.1"),
    ("64:ff9b::7f00:1", "loopback, as 127.0.0.1"),
    ("64:ff9b:1::1", "local-use NAT64"),
    ("100::1", "discard"),
    ("2001::1", "Teredo"),
    ("2001:10::1", "IETF"),
    ("2001:db8::1", "documentation"),
    ("2002:7f00:1::1", "6to4"),
    ("3fff::1", "documentation"),
    ("5f00::1", "segment-routing"),
    ("fc00::1", "unique-local"),
    ("fd12:3456::1", "unique-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("4000::1", "reserved"),  # outside global unicast 2000::/3
]


@pytest.mark.parametrize(("address", "why"), ADDRESSES)
def test_addresses_are_classified(address: str, why: str | None) -> None:
    reason = refusal_reason(ip_address(address))
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason


def test_allow_list_is_parsed() -> None:
    allow = OutboundAllow.parse(" 10.1.0.0/16, Agents.Internal. ,127.0.0.1,, fd00::/8 ")
    assert allow.networks == (
        ip_network("10.1.0.0/16"),
        ip_network("127.0.0.1/32"),
        ip_network("fd00::/8"),
    )
    assert allow.hosts == frozenset({"agents.internal"})
    assert OutboundAllow.parse("") == NOBODY
    assert OutboundAllow.parse(" , ") == NOBODY


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.1.2.3/16", "has host bits set"),
        ("10.0.0.0/33", "not a valid CIDR"),
        ("300.1.1.1", "neither"),
        ("10.1", "neither"),  # a legacy numeric form, not a name
        ("*.internal", "neither"),
        ("bad host", "neither"),
        ("-bad.example", "neither"),
        ("a" * 64 + ".example", "neither"),
        ("agents_internal", "neither"),
    ],
)
def test_malformed_allow_list_entries_are_refused_by_name(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match="BULLPEN_OUTBOUND_ALLOW") as caught:
        OutboundAllow.parse(f"10.0.0.0/8, {entry}")
    assert repr(entry) in str(caught.value) and says in str(caught.value)


def test_allowed_networks_and_names_lift_the_refusal() -> None:
    allow = OutboundAllow.parse("10.1.0.0/16, 127.0.0.1, agents.internal")
    assert allow.refusal(ip_address("10.1.2.3")) is None
    assert allow.refusal(ip_address("::ffff:10.1.2.3")) is None  # the mapped form too
    assert allow.refusal(ip_address("127.0.0.1")) is None
    assert allow.refusal(ip_address("127.0.0.2")) == "loopback"
    assert allow.refusal(ip_address("10.2.0.1")) == "private"
    assert allow.refusal(ip_address("8.8.8.8")) is None
    assert allow.permits_name("AGENTS.internal.")
    assert not allow.permits_name("other.internal")


@pytest.mark.parametrize(
    "url",
    [
        "https://agents.example.com/hook?x=1",
        "http://example.com:8080/",
        "http://8.8.8.8/hook",
        "http://[2606:4700:4700::1111]/hook",
        "HTTPS://Example.COM/Hook",
    ],
)
def test_public_urls_pass(url: str) -> None:
    checked = check_url(url, NOBODY)
    assert checked.scheme in {"http", "https"} and checked.host


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.com/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("example.com/hook", "http:// or https://"),
        ("http://user:pw@example.com/", "user name or password"),
        ("http://user@example.com/", "user name or password"),
        ("http:///hook", "no host"),
        ("http://2130706433/", "legacy form"),  # 127.0.0.1 in decimal
        ("http://017700000001/", "legacy form"),  # in octal
        ("http://0x7f.1/", "legacy form"),
        ("http://127.1/", "legacy form"),
        ("http://0/", "legacy form"),
        ("http://[F39d9a:2141]/v1", "not a valid IPv6 address"),  # found by the fuzzer
        ("http://xn--.com/", "not a valid host name"),  # found by the fuzzer (was a 500)
        ("http://xn--a.example/", "not a valid host name"),
    ],
)
def test_malformed_urls_are_invalid(url: str, says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_url(url, NOBODY)
    assert not isinstance(caught.value, OutboundRefused)
    assert says in caught.value.detail


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:8080/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://10.0.0.8/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://100.100.100.200/", "shared"),
        ("http://0.0.0.0:80/", "unspecified"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://localhost:8000/", "loopback"),
        ("http://LocalHost./", "loopback"),
        ("http://api.localhost/", "loopback"),
    ],
)
def test_non_public_targets_are_refused(url: str, why: str) -> None:
    with pytest.raises(OutboundRefused) as caught:
        check_url(url, NOBODY)
    detail = caught.value.detail
    assert why in detail and "BULLPEN_OUTBOUND_ALLOW" in detail
    assert caught.value.status == 422 and caught.value.slug == "outbound-refused"
    assert not caught.value.transient


def test_allowed_targets_pass() -> None:
    allow = OutboundAllow.parse("127.0.0.1/32, localhost, 10.0.0.0/8")
    assert check_url("http://127.0.0.1:9/x", allow).port == 9
    assert check_url("http://localhost:9/x", allow).host == "localhost"
    assert check_url("http://[::ffff:10.0.0.1]/", allow).host == "::ffff:a00:1"
    with pytest.raises(OutboundRefused):
        check_url("http://127.0.0.2/", allow)


class StubDns(AbstractResolver):
    """A DNS that answers from a table, and remembers what it was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.table[host]
        ]

    async def close(self) -> None:
        pass


DNS = {
    "public.example": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
    "ten.example": ["10.0.0.7"],
    "metadata.example": ["169.254.169.254"],
    "six.example": ["::1"],
    "mapped.example": ["::ffff:192.168.0.1"],
    "mixed.example": ["93.184.215.14", "10.0.0.7"],
    "agents.internal": ["10.9.9.9"],
}


async def test_the_resolver_passes_public_names() -> None:
    guard = GuardedResolver(NOBODY, StubDns(DNS))
    found = await guard.resolve("public.example", 443)
    assert [r["host"] for r in found] == DNS["public.example"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ten.example", "private"),
        ("metadata.example", "link-local"),
        ("six.example", "loopback"),
        ("mapped.example", "private, as 192.168.0.1"),
        ("mixed.example", "private"),  # one bad answer refuses the name
    ],
)
async def test_the_resolver_refuses_names_that_resolve_to_non_public_addresses(
    name: str, why: str
) -> None:
    dns = StubDns(DNS)
    with pytest.raises(OutboundRefused) as caught:
        await GuardedResolver(NOBODY, dns).resolve(name, 80)
    assert dns.asked == [name]
    assert name in caught.value.detail and why in caught.value.detail


async def test_the_resolver_lets_allowed_names_and_networks_through() -> None:
    dns = StubDns(DNS)
    by_name = GuardedResolver(OutboundAllow.parse("agents.internal"), dns)
    assert [r["host"] for r in await by_name.resolve("agents.internal", 80)] == ["10.9.9.9"]
    by_network = GuardedResolver(OutboundAllow.parse("10.0.0.0/24"), dns)
    assert [r["host"] for r in await by_network.resolve("ten.example", 80)] == ["10.0.0.7"]
    with pytest.raises(OutboundRefused):
        await by_network.resolve("agents.internal", 80)  # 10.9.9.9 is outside 10.0.0.0/24


async def test_the_real_resolver_refuses_localhost() -> None:
    guard = GuardedResolver(NOBODY)  # aiohttp's default resolver: /etc/hosts says loopback
    try:
        with pytest.raises(OutboundRefused, match="loopback"):
            await guard.resolve("localhost", 80)
    finally:
        await guard.close()


# The same rules where the gateway connects to workspace providers (issue 19, finding 2).


async def test_the_gateways_guard_checks_every_address_and_says_if_all_are_public() -> None:
    dns = StubDns(DNS)
    guard = AddressGuard(NOBODY, dns)
    found = await guard.check("public.example", 443)
    assert [a for _, a in found.addresses] == DNS["public.example"] and found.public
    assert [f for f, _ in found.addresses] == [socket.AF_INET, socket.AF_INET6]
    for name in ("ten.example", "metadata.example", "six.example", "mapped.example"):
        with pytest.raises(OutboundRefused, match="not a public address"):
            await guard.check(name, 443)
    with pytest.raises(OutboundRefused, match="private"):
        await guard.check("mixed.example", 443)  # one bad answer refuses the name
    # A literal address is checked as it is, with no lookup.
    assert (await guard.check("93.184.215.14", 443)).public
    with pytest.raises(OutboundRefused, match="link-local"):
        await guard.check("169.254.169.254", 80)
    with pytest.raises(OutboundRefused, match="loopback"):
        await guard.check("::ffff:127.0.0.1", 80)
    assert dns.asked == [
        "public.example",
        "ten.example",
        "metadata.example",
        "six.example",
        "mapped.example",
        "mixed.example",
    ]

    # Allowed non-public targets pass, marked not public (their errors are not shown as is).
    allowed = AddressGuard(OutboundAllow.parse("10.0.0.0/24, agents.internal"), dns)
    assert not (await allowed.check("ten.example", 80)).public
    assert not (await allowed.check("mixed.example", 80)).public
    assert not (await allowed.check("agents.internal", 80)).public  # allowed by name
    assert not (await allowed.check("10.0.0.9", 80)).public
    with pytest.raises(OutboundRefused):
        await allowed.check("10.0.1.9", 80)
