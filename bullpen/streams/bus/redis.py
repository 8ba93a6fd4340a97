"""Redis Streams as the bus transport (`BULLPEN_REDIS_URL`).

Every process appends to one stream (`XADD ... MAXLEN ~ N`) and follows it with `XREAD
BLOCK` from the last id it read, so a listener that reconnects picks up where it stopped
(unless trimming got there first: readers re-read the store after any reconnect anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from bullpen.streams.bus.shared import Deliver

STREAM_KEY = "bullpen:events"
_BLOCK_MS = 2000
_READ_COUNT = 1000


class RedisStreams:
    """Messages over one Redis stream."""

    name = "redis"
    max_payload = 512 * 1024

    def __init__(self, url: str, *, key: str = STREAM_KEY, maxlen: int = 100_000) -> None:
        self._url = url
        self._key = key
        self._maxlen = maxlen
        # Commands time out well after a blocking read would have returned.
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5
        )
        self._last: Any = None

    async def send(self, payloads: list[bytes]) -> None:
        """XADD each payload, in order, in one round trip."""
        pipe = self._client.pipeline(transaction=False)
        for payload in payloads:
            pipe.xadd(self._key, {"p": payload}, maxlen=self._maxlen, approximate=True)
        await pipe.execute()

    async def listen(self, deliver: Deliver, connected: Callable[[], None]) -> None:
        """XREAD BLOCK from the last id read (at first, from the stream's newest entry)."""
        if self._last is None:
            newest = await self._client.xrevrange(self._key, count=1)
            self._last = newest[0][0] if newest else b"0-0"
        connected()
        while True:
            answer = await self._client.xread(
                {self._key: self._last}, count=_READ_COUNT, block=_BLOCK_MS
            )
            for _key, entries in answer or ():
                for entry_id, fields in entries:
                    self._last = entry_id
                    payload = fields.get(b"p")
                    if payload is not None:
                        deliver(payload)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()
