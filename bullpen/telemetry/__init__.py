"""OpenTelemetry traces with the GenAI semantic conventions (docs/tracing.md).

`setup.open_tracing` builds a `spans.Tracing` from the settings, or None when tracing is off
(the default). Nothing else imports OpenTelemetry: with tracing off it is never imported, and
every hot path holds a `Tracing | None` it tests once, so no span, context or carrier is made.
"""
