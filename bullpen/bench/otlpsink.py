"""An OTLP/HTTP trace receiver on 127.0.0.1 for benches: what a traced server exports arrives
here and is counted (requests, bytes, spans), then answered as a collector would.

`bullpen bench --tracing` points the traced server's `OTEL_EXPORTER_OTLP_ENDPOINT` at it, so
the server pays for building, batching, encoding and sending every span, as it would to a real
collector, and the report can show that the spans did arrive.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["OtlpSink", "otlp_sink"]

_PROTOBUF = "application/x-protobuf"


@dataclass
class OtlpSink:
    """A running receiver: its base URL (what `OTEL_EXPORTER_OTLP_ENDPOINT` takes) and what
    it received so far."""

    url: str
    requests: int = 0
    bytes: int = 0
    spans: int = 0
    refused: int = 0  # bodies that were not an export request

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "requests": self.requests,
            "bytes": self.bytes,
            "spans": self.spans,
            "refused": self.refused,
        }


@contextlib.asynccontextmanager
async def otlp_sink() -> AsyncIterator[OtlpSink]:
    """Serve `POST /v1/traces` on a free loopback port until the block ends."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    answer = ExportTraceServiceResponse().SerializeToString()
    sink = OtlpSink(url="")

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        export = ExportTraceServiceRequest()
        try:
            if request.content_type != _PROTOBUF:
                raise DecodeError(request.content_type)
            export.ParseFromString(body)
        except DecodeError:
            sink.refused += 1
            return web.Response(status=400)
        sink.requests += 1
        sink.bytes += len(body)
        sink.spans += sum(
            len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans
        )
        return web.Response(body=answer, content_type=_PROTOBUF)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        sink.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield sink
    finally:
        await runner.cleanup()
        sock.close()
