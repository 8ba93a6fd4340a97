"""Tracing's set-up from the standard `OTEL_*` variables: off unless they turn it on.

On: a `TracerProvider` of this process's own (never the global one, so nothing else in the
process is traced by accident), its sampler and resource from the SDK's variables
(`OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), and each exporter
behind a `BatchSpanProcessor` (`OTEL_BSP_*`): spans are queued and exported by a thread of its
own, never on the event loop, and dropped rather than queued without bound when the collector
is slow. OpenTelemetry is imported here, only when tracing is on.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from bullpen import __version__
from bullpen.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from bullpen.telemetry.spans import Tracing

_TRACES_PATH = "v1/traces"


def otlp_traces_endpoint(settings: Settings) -> str:
    """Where OTLP/HTTP spans go: the traces endpoint as given, else `<endpoint>/v1/traces`."""
    if settings.otel_exporter_otlp_traces_endpoint:
        return settings.otel_exporter_otlp_traces_endpoint
    base = settings.otel_exporter_otlp_endpoint or "http://localhost:4318"
    return base if base.endswith("/" + _TRACES_PATH) else base.rstrip("/") + "/" + _TRACES_PATH


@asynccontextmanager
async def open_tracing(
    settings: Settings, extra: SpanExporter | None = None
) -> AsyncIterator[Tracing | None]:
    """This process's tracing, or None when it is off; `extra` (tests) is one more exporter,
    and turns tracing on by itself. What has ended is exported on exit."""
    exporters = settings.trace_exporters
    if not exporters and extra is None:
        yield None
        return
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from bullpen.telemetry.spans import Tracing

    resource = Resource.create(
        {
            "service.version": __version__,
            SERVICE_INSTANCE_ID: f"{socket.gethostname()}:{os.getpid()}",
        }
    )
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "bullpen"}))
    provider = TracerProvider(resource=resource)
    chosen: list[SpanExporter] = []
    if "otlp" in exporters:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        chosen.append(OTLPSpanExporter(endpoint=otlp_traces_endpoint(settings)))
    if "console" in exporters:
        chosen.append(ConsoleSpanExporter())
    if extra is not None:
        chosen.append(extra)
    for exporter in chosen:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing = Tracing(
        provider.get_tracer("bullpen", __version__),
        capture=settings.otel_capture_message_content,
        flush=provider.force_flush,
        close=provider.shutdown,
    )
    try:
        yield tracing
    finally:
        # Flushes what has ended, then stops the export threads: it waits on the collector,
        # so not on the event loop.
        await asyncio.to_thread(provider.shutdown)
