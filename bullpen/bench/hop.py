"""A pass-through TCP hop: what one more process in the path costs, before any gateway work.

`python -m bullpen.bench.hop LISTEN_PORT TARGET_PORT` accepts connections on 127.0.0.1 and
pipes each one, both ways and byte for byte, to a connection of its own to the target on
127.0.0.1 (no HTTP parsing, no buffering beyond the sockets', on uvloop, the runtime the
API serves on). The relay bench streams through it next to its direct and relayed rounds:
hop minus direct is the floor any relay on the same machine stands on, and relay minus hop
is what the gateway itself adds.

`hop_server` runs the same pipe in the calling process, for tests.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import uvloop

HOST = "127.0.0.1"


class _Side(asyncio.Protocol):
    """One end of a pipe: what it receives is written to its peer's transport.

    Until the peer is connected, received bytes (and an end of input) wait: the client may
    send its request before the hop has reached the target. An end of input is passed on as
    one (a half-close); the pipe closes once both ends have ended, or either is lost.
    Back-pressure passes through: while a peer cannot keep up with writes, this side stops
    reading.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._early: list[bytes] = []
        self.ended = False
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def join(self, peer: _Side) -> None:
        """Start piping to `peer` (what arrived meanwhile goes first)."""
        self.peer = peer
        if self._lost or peer.transport is None:
            self.close()
            peer.close()
            return
        for data in self._early:
            peer.transport.write(data)
        self._early.clear()
        if self.ended:
            self._pass_end()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)
        else:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        if self.peer is not None:
            self._pass_end()
        return True  # keep the transport open: the other way may still carry bytes

    def _pass_end(self) -> None:
        peer = self.peer
        assert peer is not None
        if peer.ended:
            self.close()
            peer.close()
        elif peer.transport is not None and peer.transport.can_write_eof():
            peer.transport.write_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.transport = None
        if self.peer is not None:
            self.peer.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def close(self) -> None:
        """Close this end once its writes are out (its peer follows from `connection_lost`)."""
        if self.transport is not None:
            self.transport.close()


class _Inbound(_Side):
    """A client's connection: opens the target connection it is piped to."""

    def __init__(self, target_port: int) -> None:
        super().__init__()
        self._target_port = target_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._reach())

    async def _reach(self) -> None:
        loop = asyncio.get_running_loop()
        outbound = _Side()
        try:
            await loop.create_connection(lambda: outbound, HOST, self._target_port)
        except OSError:
            self.close()
            return
        outbound.join(self)
        self.join(outbound)


async def hop_server(listen_port: int, target_port: int) -> asyncio.Server:
    """Listen on `listen_port` (0: any free port) and pipe every connection to the target."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Inbound(target_port), HOST, listen_port)


async def _serve(listen_port: int, target_port: int) -> None:
    server = await hop_server(listen_port, target_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    """Entry point: `python -m bullpen.bench.hop LISTEN_PORT TARGET_PORT`."""
    try:
        listen_port, target_port = (int(a) for a in argv)
    except ValueError:
        print("usage: python -m bullpen.bench.hop LISTEN_PORT TARGET_PORT", file=sys.stderr)
        return 2
    uvloop.run(_serve(listen_port, target_port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
