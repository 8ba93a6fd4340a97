"""The trace context a new run is stored with (W3C `traceparent`), for this task of asyncio.

Tracing sets it (an HTTP request's span, a run's span while it executes) and the store reads
it where it enqueues a run, so a worker, in this process or another, continues the trace that
created the run. With tracing off nothing sets it, and a run is stored without one.
"""

from __future__ import annotations

from contextvars import ContextVar

TRACE_PARENT: ContextVar[str | None] = ContextVar("bullpen_trace_parent", default=None)
TRACE_PARENT_MAX = 55  # `00-<32 hex>-<16 hex>-<2 hex>`: the only version Bullpen writes
