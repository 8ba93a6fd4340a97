"""Tracing is off by default and turned on by the standard OTEL_* variables only as
docs/tracing.md says; with it off, none of its code is loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from bullpen.settings import Settings
from bullpen.telemetry.setup import otlp_traces_endpoint


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, ()),
        ({"OTEL_SERVICE_NAME": "bullpen-eu"}, ()),  # naming a service turns nothing on
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console, OTLP"}, ("console", "otlp")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            ("otlp",),
        ),
    ],
)
def test_the_standard_variables_turn_tracing_on(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], exporters: tuple[str, ...]
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings().trace_exporters == exporters


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"otel_traces_exporter": "zipkin"}, "unsupported exporter(s) ['zipkin']"),
        ({"otel_traces_exporter": "otlp", "otel_exporter_otlp_protocol": "grpc"}, "'grpc'"),
        (
            {"otel_exporter_otlp_endpoint": "http://c", "otel_exporter_otlp_traces_protocol": "x"},
            "OTLP protocol 'x' is not supported",
        ),
        ({"otel_exporter_otlp_endpoint": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT must"),
    ],
)
def test_unsupported_trace_settings_are_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(**fields)
    assert message in str(raised.value)


def test_message_capture_is_asked_for_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    assert Settings().otel_capture_message_content is False
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    settings = Settings()
    assert settings.otel_capture_message_content is True
    assert settings.trace_exporters == ()  # it does not turn tracing on by itself


def test_the_traces_endpoint_follows_the_otlp_rules() -> None:
    assert otlp_traces_endpoint(Settings()) == "http://localhost:4318/v1/traces"
    base = Settings(otel_exporter_otlp_endpoint="http://c:4318/")
    assert otlp_traces_endpoint(base) == "http://c:4318/v1/traces"
    own = Settings(
        otel_exporter_otlp_endpoint="http://c:4318", otel_exporter_otlp_traces_endpoint="http://t/x"
    )
    assert otlp_traces_endpoint(own) == "http://t/x"  # a signal endpoint is used as given


def test_with_tracing_off_no_tracing_code_is_loaded() -> None:
    """Every module on a request's, a run's and a relayed call's path, and the CLI: neither the
    SDK, nor an exporter, nor Bullpen's span code (FastAPI itself imports the API package)."""
    code = (
        "import sys\n"
        "import bullpen.api.app, bullpen.app, bullpen.cli.main, bullpen.queue.worker\n"
        "import bullpen.agents.llm, bullpen.gateway.relay, bullpen.api.routes.relay\n"
        "print(sorted(m for m in sys.modules if m.startswith(\n"
        "    ('opentelemetry.sdk', 'opentelemetry.exporter', 'bullpen.telemetry.spans',\n"
        "     'bullpen.api.tracing'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_cli_names_a_bad_otel_variable_as_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from bullpen.cli.main import _settings
    from bullpen.errors import InvalidInput

    monkeypatch.setenv("OTEL_SDK_DISABLED", "maybe")
    with pytest.raises(InvalidInput) as raised:
        _settings(None, None)
    assert raised.value.detail.startswith("invalid settings: OTEL_SDK_DISABLED: ")
    assert "maybe" not in raised.value.detail  # never the value
