"""AZ-6 for providers: a provider's URL and every address the gateway connects to pass the
outbound guard (`BULLPEN_OUTBOUND_ALLOW`), a changed origin needs the key again, and a
non-public provider's failures all look alike to callers.

Only loopback is ever connected to. Non-loopback addresses are refused before any connect:
at create and update they are never resolved; at call time a resolver stub (DNS, the true
external edge) makes a name resolve to them, and a spy on the loop's `create_connection`
proves no connect was even attempted (it refuses any non-loopback address itself, so a
broken guard still sends no traffic).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any

import aiohttp
import orjson
import pytest
import sqlalchemy as sa
from aiohttp.abc import AbstractResolver, ResolveResult
from prometheus_client import CollectorRegistry

from bullpen.errors import ProviderError
from bullpen.gateway.breaker import BreakerPolicy, Breakers
from bullpen.gateway.catalog import Price, Provider, Target, Timeouts
from bullpen.gateway.client import GatewayClient
from bullpen.gateway.metrics import GatewayMetrics
from bullpen.gateway.router import Call, Router, content_of
from bullpen.security.outbound import OutboundAllow
from bullpen.simulator.provider import SimConfig, SimulatedProvider
from bullpen.store.tables import providers
from tests.support.db import rows
from tests.support.http import call, problem
from tests.support.servers import RunningServer
from tests.support.tasks import new_task, wait_status

CANARY = "sk-canary-PROVIDERKEY-7f3a9c0d1e2b"
NEW_KEY = "sk-replacement-key-5566778899"
MESSAGES = [{"role": "user", "content": "Say something short please"}]
PROBLEMS = "https://bullpen.dev/problems/"

# Hosts a provider URL may not name unless the allow-list does: each address class, in each
# written form that reaches it.
NON_PUBLIC_URLS = [
    "http://127.0.0.1:8080/v1",
    "http://127.9.9.9/v1",
    "http://10.0.0.1/v1",
    "http://10.255.0.9:8000/v1",
    "http://172.16.0.1/v1",
    "http://172.31.255.254/v1",
    "http://192.168.1.10/v1",
    "http://169.254.169.254/latest/meta-data",
    "http://0.0.0.0:9/v1",
    "http://100.64.0.1/v1",
    "http://[::1]:8080/v1",
    "http://[::ffff:127.0.0.1]/v1",
    "http://[::ffff:169.254.169.254]/v1",
    "http://[fd00::1]/v1",
    "http://[fe80::1]/v1",
    "http://localhost:11434/v1",
    "https://LOCALHOST./v1",
]
# Numeric forms the C library reads as 127.0.0.1 (decimal, octal, hex, short).
LEGACY_URLS = [
    "http://2130706433/v1",
    "http://0177.0.0.1/v1",
    "http://0x7f.0.0.1/v1",
    "http://0x7f000001/v1",
    "http://017700000001/v1",
    "http://127.1/v1",
]


def provider_body(base_url: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "remote",
        "base_url": base_url,
        "api_key": CANARY,
        "models": [{"name": "m"}],
        "timeouts": {"connect_s": 2, "ttft_s": 2},
        **fields,
    }


# ---- a listener that records what reaches it ------------------------------------------------


@dataclass
class Listener:
    """A loopback TCP server: counts connections, keeps each request head, answers `answer`
    (nothing at all when None: the connection just stays open)."""

    answer: bytes | None
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            if self.answer is None:
                await reader.read()  # until the client gives up
                return
            writer.write(self.answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def received(self, secret: str) -> bool:
        return any(secret.encode() in head for head in self.heads)


def http_answer(status: str, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


UNAUTHORIZED = http_answer(
    "401 Unauthorized",
    "application/json",
    b'{"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}',
)


@pytest.fixture
async def listen() -> AsyncIterator[Any]:
    servers: list[asyncio.Server] = []

    async def start(answer: bytes | None = UNAUTHORIZED) -> Listener:
        listener = Listener(answer)
        server = await asyncio.start_server(listener.serve, "127.0.0.1", 0)
        listener.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return listener

    yield start
    for server in servers:
        server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def relay(
    http: aiohttp.ClientSession, server: RunningServer, model: str
) -> tuple[int, dict[str, Any], str]:
    body = {"model": model, "messages": MESSAGES}
    async with http.post(
        f"{server.base_url}/v1/chat/completions", json=body, headers=server.auth
    ) as resp:
        text = await resp.text()
        return resp.status, await resp.json(content_type=None), text


# ---- create and update ----------------------------------------------------------------------


@pytest.mark.with_settings(outbound_allow="")
async def test_provider_urls_to_non_public_addresses_are_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for url in NON_PUBLIC_URLS + LEGACY_URLS:
        reply = await call(http, server, "POST", "/api/v1/providers", body=provider_body(url))
        body = problem(reply, 422)
        expected = "validation" if url in LEGACY_URLS else "outbound-refused"
        assert body["type"] == PROBLEMS + expected, (url, body)
        assert [e["field"] for e in body["errors"]] == ["base_url"], (url, body)
        if url not in LEGACY_URLS:
            assert "BULLPEN_OUTBOUND_ALLOW" in body["detail"]
        assert CANARY not in reply.text
    assert await rows(server, sa.select(providers)) == []

    # A provider at a public name (never resolved at this point) may not move to one either.
    made = await call(
        http, server, "POST", "/api/v1/providers", body=provider_body("https://llm.example.com/v1")
    )
    assert made.status == 201, made.text
    path = f"/api/v1/providers/{made.body['id']}"
    for url in NON_PUBLIC_URLS + LEGACY_URLS:
        reply = await call(http, server, "PATCH", path, body={"base_url": url, "api_key": NEW_KEY})
        assert problem(reply, 422)["errors"][0]["field"] == "base_url", url
    [row] = await rows(server, sa.select(providers))
    assert row.base_url == "https://llm.example.com/v1" and row.api_key_hint == "sk-…1e2b"


@pytest.mark.with_settings(outbound_allow="10.0.0.0/8, llm.internal")
async def test_the_allow_list_admits_provider_urls_it_names(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for name, url in (("ten", "http://10.1.2.3:8000/v1"), ("named", "http://llm.internal/v1")):
        made = await call(
            http, server, "POST", "/api/v1/providers", body=provider_body(url, name=name)
        )
        assert made.status == 201, made.text
    refused = await call(
        http,
        server,
        "POST",
        "/api/v1/providers",
        body=provider_body("http://192.168.0.10/v1", name="other"),
    )
    assert problem(refused, 422)["type"] == PROBLEMS + "outbound-refused"


# ---- a changed origin needs the key again ---------------------------------------------------


@pytest.mark.with_settings(outbound_allow="127.0.0.0/8")
async def test_a_providers_key_is_never_sent_to_a_changed_host(
    server: RunningServer, http: aiohttp.ClientSession, listen: Any
) -> None:
    assert server.services.simulator is not None
    sim_url = server.services.simulator.base_url  # http://127.0.0.1:<port>/v1
    made = await call(
        http,
        server,
        "POST",
        "/api/v1/providers",
        body=provider_body(sim_url, models=[{"name": "sim-1"}]),
    )
    assert made.status == 201, made.text
    path = f"/api/v1/providers/{made.body['id']}"
    listener = await listen()

    # Another port, scheme or host, with the key kept: refused, nothing changes.
    for moved in (
        listener.url,
        sim_url.replace("http://", "https://"),
        sim_url.replace("127.0.0.1", "127.0.0.2"),
        f"http://127.0.0.1:{free_port()}/v1",
    ):
        for body in ({"base_url": moved}, {"base_url": moved, "name": "renamed"}):
            reply = await call(http, server, "PATCH", path, body=body)
            refused = problem(reply, 422)
            assert refused["type"] == PROBLEMS + "provider-key-required", reply.text
            assert [e["field"] for e in refused["errors"]] == ["api_key"]
            assert CANARY not in reply.text and "e2b" not in refused["detail"]
    got = await call(http, server, "GET", path)
    assert got.body["base_url"] == sim_url and got.body["name"] == "remote"

    # The key still goes where it went: the provider answers, the listener hears nothing.
    status, _, text = await relay(http, server, "remote/sim-1")
    assert status == 200, text
    assert listener.connections == 0

    # The same origin under another path keeps the key.
    same = await call(http, server, "PATCH", path, body={"base_url": sim_url.replace("/v1", "/v2")})
    assert same.status == 200 and same.body["api_key_hint"] == "sk-…1e2b"

    # Moving with a new key (or none) is allowed; the canary never reaches the new host.
    moved = await call(
        http, server, "PATCH", path, body={"base_url": listener.url, "api_key": NEW_KEY}
    )
    assert moved.status == 200, moved.text
    assert moved.body["api_key_hint"] == "sk-…8899" and CANARY not in moved.text
    status, _, text = await relay(http, server, "remote/sim-1")
    assert status == 502 and CANARY not in text and NEW_KEY not in text
    assert listener.connections == 1 and listener.received(f"Bearer {NEW_KEY}")
    assert not listener.received(CANARY)

    other = await listen()
    keyless = await call(http, server, "PATCH", path, body={"base_url": other.url, "api_key": None})
    assert keyless.status == 200 and keyless.body["api_key_hint"] is None
    await relay(http, server, "remote/sim-1")
    assert other.connections == 1 and not other.received("Authorization")


# ---- at call time ---------------------------------------------------------------------------


@pytest.mark.with_settings(outbound_allow="")
async def test_a_stored_non_public_url_is_refused_before_connecting(
    server: RunningServer, http: aiohttp.ClientSession, listen: Any
) -> None:
    """A row written before the check existed (or edited in the database) is refused where
    the gateway connects: the name or number is resolved, and the address checked."""
    made = await call(
        http, server, "POST", "/api/v1/providers", body=provider_body("https://llm.example.com/v1")
    )
    assert made.status == 201, made.text
    listener = await listen()
    svc = server.services
    for url in (
        listener.url,
        f"http://2130706433:{listener.port}/v1",
        f"http://0x7f.1:{listener.port}/v1",
        f"http://localhost:{listener.port}/v1",
    ):
        async with svc.store.write() as conn:
            await conn.execute(sa.update(providers).values(base_url=url))
        svc.directory.invalidate(server.boot.workspace_id)
        status, body, text = await relay(http, server, "remote/m")
        assert listener.connections == 0, url
        assert status == 502, text
        assert body["type"] == PROBLEMS + "provider"
        assert "non-public" in body["detail"] and "BULLPEN_OUTBOUND_ALLOW" in body["detail"]
        assert CANARY not in text and "127.0.0.1" not in text


@pytest.mark.with_settings(outbound_allow="127.0.0.1/32")
async def test_errors_from_non_public_providers_look_alike(
    server: RunningServer, http: aiohttp.ClientSession, listen: Any
) -> None:
    """A closed port, a web page, another protocol and a silent service: one answer."""
    targets = {
        "target1": f"http://127.0.0.1:{free_port()}/v1",
        "target2": (
            await listen(
                http_answer("403 Forbidden", "text/html", b"<h1>internal admin panel</h1>")
            )
        ).url,
        "target3": (await listen(b"SSH-2.0-OpenSSH_9.2p1 internal-bastion\r\n")).url,
        "target4": (
            await listen(
                http_answer(
                    "418 I'm a teapot", "application/json", b'{"error": "internal teapot api"}'
                )
            )
        ).url,
        "target5": (await listen(None)).url,
    }
    answers: dict[str, tuple[int, str, str]] = {}
    for name, url in targets.items():
        body = provider_body(url, name=name, timeouts={"connect_s": 2, "ttft_s": 0.5})
        made = await call(http, server, "POST", "/api/v1/providers", body=body)
        assert made.status == 201, made.text
        status, problem_body, _ = await relay(http, server, f"{name}/m")
        answers[name] = (status, problem_body["type"], problem_body["detail"].replace(name, "X"))
        for leak in ("403", "418", "admin", "SSH", "teapot", "reached", "timed", "Error"):
            assert leak not in problem_body["detail"], (name, problem_body)
    assert len(set(answers.values())) == 1, answers


@pytest.mark.with_settings(outbound_allow="127.0.0.1/32", max_attempts=1)
async def test_runs_on_non_public_providers_fail_alike(
    server: RunningServer, http: aiohttp.ClientSession, listen: Any
) -> None:
    """The run's error and its record of attempts say no more than the relay does."""
    page = await listen(http_answer("403 Forbidden", "text/html", b"<h1>internal admin</h1>"))
    seen = []
    for name, url in (("target1", page.url), ("target2", f"http://127.0.0.1:{free_port()}/v1")):
        made = await call(
            http, server, "POST", "/api/v1/providers", body=provider_body(url, name=name)
        )
        assert made.status == 201, made.text
        agent = f"/api/v1/agents/{server.boot.agent_id}"
        patched = await call(http, server, "PATCH", agent, body={"config": {"model": f"{name}/m"}})
        assert patched.status == 200, patched.text
        task = await new_task(http, server)
        run = (await wait_status(http, server, task["id"], "failed"))["run"]
        shown = orjson.dumps([run["error"], run["error_code"], run["llm_calls"]]).decode()
        for leak in ("403", "admin", "reached", "Error", "http-", "connect"):
            assert leak not in shown, run
        seen.append(shown.replace(name, "X"))
    assert seen[0] == seen[1], seen
    assert "non-public address" in seen[0]


# ---- the guard where the gateway connects (resolver stub) -----------------------------------

LIMITS = Timeouts(connect_s=2.0, ttft_s=2.0, idle_s=2.0, deadline_s=10.0)
SIM = SimConfig(ttft_ms=5, tokens_per_second=2000, response_tokens=4, models=("m",))


class StubResolver(AbstractResolver):
    """DNS as a test wants it: each name resolves to the addresses given (in order)."""

    def __init__(self, answers: Mapping[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError(f"no such name {host!r}")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.answers[host]
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
async def connects(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[tuple[Any, Any]]]:
    """Every `create_connection` of the loop, by (host, port); non-loopback ones are refused
    here, never attempted."""
    loop = asyncio.get_running_loop()
    real = loop.create_connection
    seen: list[tuple[Any, Any]] = []

    async def spy(factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        seen.append((host, port))
        try:
            loopback = ip_address(str(host)).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConnectionRefusedError(f"the test refuses to connect to {host!r}")
        return await real(factory, host, port, **kwargs)

    monkeypatch.setattr(loop, "create_connection", spy)
    yield seen


async def stream_once(
    client: GatewayClient, provider: Provider
) -> tuple[str, ProviderError | None]:
    breakers = Breakers(BreakerPolicy(failures=5, window_s=30, cooldown_s=1))
    router = Router(client, breakers, GatewayMetrics(CollectorRegistry(), breakers))
    call_ = Call()
    text = []
    try:
        async for batch in router.stream([Target(provider, "m")], {"messages": MESSAGES}, call_):
            text += [content_of(c) or "" for c in batch]
    except ProviderError as err:
        return "".join(text), err
    return "".join(text), None


def provider_at(host: str, port: int, **fields: Any) -> Provider:
    return Provider(
        key=host,
        name="p",
        base_url=f"http://{host}:{port}/v1",
        timeouts=LIMITS,
        prices={"m": Price()},
        api_key=CANARY,
        **fields,
    )


REBOUND = [
    ["127.0.0.1"],
    ["10.0.0.1"],
    ["172.16.5.4"],
    ["192.168.0.1"],
    ["169.254.169.254"],
    ["100.64.0.1"],
    ["0.0.0.0"],
    ["::1"],
    ["::ffff:127.0.0.1"],
    ["::ffff:169.254.169.254"],
    ["64:ff9b::a9fe:a9fe"],
    ["fe80::1"],
    ["fd00::1"],
    ["93.184.215.14", "10.0.0.1"],  # one public answer does not vouch for the other
]


@pytest.mark.parametrize("addresses", REBOUND, ids=lambda a: ",".join(a))
async def test_a_name_resolving_to_a_non_public_address_is_refused_before_connecting(
    addresses: list[str], connects: list[tuple[Any, Any]]
) -> None:
    resolver = StubResolver({"llm.rebind.test": addresses})
    async with GatewayClient(OutboundAllow(), resolver) as client:
        text, error = await stream_once(client, provider_at("llm.rebind.test", 443))
    assert text == "" and error is not None
    assert error.reason == "outbound-refused" and not error.transient
    assert "non-public" in error.detail and CANARY not in error.detail
    assert resolver.asked == ["llm.rebind.test"]
    assert connects == []


async def test_the_gateway_connects_to_the_address_it_checked(
    connects: list[tuple[Any, Any]],
) -> None:
    """Resolved once, checked, then connected to by number: a name cannot answer the check
    with one address and the connect with another (DNS rebinding)."""
    async with SimulatedProvider(SIM) as sim:
        port = int(sim.base_url.split(":")[2].split("/")[0])
        resolver = StubResolver({"sim.internal.test": ["127.0.0.1"]})
        allow = OutboundAllow.parse("127.0.0.1/32")
        async with GatewayClient(allow, resolver) as client:
            text, error = await stream_once(client, provider_at("sim.internal.test", port))
        assert error is None and text
        assert connects == [("127.0.0.1", port)]
        assert resolver.asked == ["sim.internal.test"]


async def test_built_in_providers_are_not_guarded_but_workspace_ones_are(
    connects: list[tuple[Any, Any]],
) -> None:
    """The simulator Bullpen itself runs on loopback stays reachable with an empty allow-list;
    a workspace's provider at the very same URL is refused."""
    async with SimulatedProvider(SIM) as sim:
        port = int(sim.base_url.split(":")[2].split("/")[0])
        async with GatewayClient(OutboundAllow()) as client:
            text, error = await stream_once(client, provider_at("127.0.0.1", port, builtin=True))
            assert error is None and text
            text, error = await stream_once(client, provider_at("127.0.0.1", port))
            assert error is not None and error.reason == "outbound-refused"
        assert connects == [("127.0.0.1", port)]
        assert sim.total_requests == 1
