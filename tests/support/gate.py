"""A TCP relay that can be cut: a real outage between one process and a service."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


def moved(url: str, port: int) -> str:
    """`url` with its host and port replaced by 127.0.0.1:`port`."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    netloc[-1] = f"127.0.0.1:{port}"
    return parts._replace(netloc="@".join(netloc)).geturl()


class Gate:
    """A TCP relay to a service that can be cut (live connections reset, new ones refused)
    and restored: a real outage between one process and the service."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def __aenter__(self) -> Gate:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        self._server.close()
        await self._server.wait_closed()

    def cut(self) -> None:
        self._open = False
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self._open = True

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        self._writers -= {writer, up_writer}


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()
