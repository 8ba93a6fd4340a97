"""A fault-injecting TCP proxy for the fault tests (TEST-PLAN FC-3; Toxiproxy is not packaged
here): it sits between `bullpen worker` processes and PostgreSQL, on loopback only.

Modes, switched while connections are open:
- `PASS`: bytes flow both ways.
- `PARTITION`: nothing flows either way and new connections are accepted but hear nothing
  (the network is gone, TCP has not noticed: a half-open connection). Bytes are held, as TCP
  retransmission would hold them, and flow again when the mode goes back to `PASS`; a peer
  that closed meanwhile closes its side then.
- `RESET`: every open connection is reset at once (RST), and new ones are reset on accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
from collections.abc import AsyncIterator

_CHUNK = 65536


class Mode(enum.Enum):
    """What the proxy does to traffic right now."""

    PASS = "pass"
    PARTITION = "partition"
    RESET = "reset"


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `target`, with faults switched by `mode`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.accepted = 0
        self._mode = Mode.PASS
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def mode(self) -> Mode:
        """The current mode."""
        return self._mode

    def set_mode(self, mode: Mode) -> None:
        """Switch modes; RESET resets every open connection at once."""
        self._mode = mode
        if mode is Mode.PASS:
            self._flowing.set()
        else:
            self._flowing.clear()
        if mode is Mode.RESET:
            for pair in list(self._pairs):
                for writer in pair:
                    _reset(writer)
            self._pairs.clear()

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.set_mode(Mode.RESET)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._mode is Mode.RESET:
            _reset(writer)
            return
        await self._flowing.wait()  # a partitioned connect hears nothing until it heals
        if self._mode is Mode.RESET:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, pair)),
            asyncio.create_task(self._pump(up_reader, writer, pair)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            async for data in _chunks(reader):
                await self._flowing.wait()
                if pair not in self._pairs:
                    return  # reset meanwhile
                writer.write(data)
                await writer.drain()
            await self._flowing.wait()
        except (ConnectionError, OSError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for each in pair:
                    each.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(_CHUNK):
        yield data


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
