"""Where ``run`` and ``chat`` send their spans: OTLP, the console, or nowhere said out loud.

The library traces to the global tracer provider when the config says ``otel: true``
(docs/observability.md); a library never installs one, an application does, and for these verbs
the CLI is the application. So the CLI installs an SDK provider: with an OTLP exporter when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set, and with the SDK's console
exporter (one JSON line per span on stderr) under ``--trace console``, which also turns tracing
on without the config key. Nothing is silent: ``otel: true`` with no SDK installed, no exporter
package for the endpoint, or nowhere to send spans is one stderr line that says what to do, and
the run goes on untraced. A provider already installed (``opentelemetry-instrument``) is used
as it is. The SDK provider flushes and shuts its exporters down when the process exits (its
``shutdown_on_exit``). Nothing of OpenTelemetry is imported unless tracing is asked for.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
from rich.console import Console

from ..config import OtelConfig, RuntimeConfig
from ._setup import CliError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["INSTALL", "TRACE_CHOICES", "start_tracing"]

#: The install command a warning names.
INSTALL: Final = "pip install 'dsh-agent-loop[otel-export]'"
#: The values of ``--trace``.
TRACE_CHOICES: Final = ("console",)
_ENDPOINTS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def _traced(config: RuntimeConfig, on: bool) -> RuntimeConfig:
    """``config`` with tracing on (its ``captureContent`` kept) or off."""
    otel = config.plugin.otel
    otel = (OtelConfig() if otel is None else attrs.evolve(otel, enabled=True)) if on else None
    return attrs.evolve(config, plugin=attrs.evolve(config.plugin, otel=otel))


def _otlp_exporter(environ: Mapping[str, str]) -> tuple[SpanExporter | None, str]:
    """The OTLP exporter the environment asks for, or None and the transport it lacks."""
    protocol = next((environ[k] for k in _PROTOCOLS if environ.get(k)), "http/protobuf")
    transport = "grpc" if protocol == "grpc" else "http"
    try:  # the transport's package is optional: imported by name, only when asked for
        name = f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter"
        exporter: SpanExporter = importlib.import_module(name).OTLPSpanExporter()
    except ImportError:
        return None, transport
    return exporter, transport


def start_tracing(
    config: RuntimeConfig,
    option: str | None,
    errors: Console,
    clean: Callable[[str], str],
    environ: Mapping[str, str] = os.environ,
) -> RuntimeConfig:
    """Install the span exporters ``otel`` and ``--trace`` ask for.

    Args:
        config: The loaded config (its ``otel`` key).
        option: ``--trace``'s value (``console``), or None.
        errors: The stderr console a warning is one line of.
        clean: Makes a span's line safe for the terminal (``TerminalGuard.clean``).
        environ: The ``OTEL_*`` variables.

    Returns:
        The config to run: tracing on, or off when spans could go nowhere.

    Raises:
        CliError: ``--trace console`` without the OpenTelemetry SDK (exit 2).
    """
    otel = config.plugin.otel
    if option is None and (otel is None or not otel.enabled):
        return config

    def warn(text: str) -> None:
        errors.print(text, soft_wrap=True, markup=False, highlight=False)

    where = f"{config.source}: otel: true"
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        if option is not None:
            problem = f"--trace {option}: the OpenTelemetry SDK is not installed ({INSTALL})"
            raise CliError(problem) from None
        warn(f"{where}, but the OpenTelemetry SDK is not installed: no spans ({INSTALL})")
        return _traced(config, False)
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _traced(config, True)  # the process has its provider already
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    attributes: dict[str, Any] = {} if named else {"service.name": "dsh-agent"}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporting = False
    endpoint = next((environ[k] for k in _ENDPOINTS if environ.get(k)), None)
    if endpoint is not None:
        exporter, missing = _otlp_exporter(environ)
        if exporter is None:
            package = f"opentelemetry-exporter-otlp-proto-{missing}"
            warn(f"{where}: OTLP export needs {package} ({INSTALL}); spans to {endpoint} are lost")
        else:
            provider.add_span_processor(BatchSpanProcessor(exporter))
            exporting = True
    if option == "console":

        def one_line(span: Any) -> str:
            return clean(span.to_json(indent=None)) + "\n"

        console = ConsoleSpanExporter(out=sys.stderr, formatter=one_line)
        provider.add_span_processor(SimpleSpanProcessor(console))
        exporting = True
    if not exporting:
        if endpoint is None:
            warn(
                f"{where}, but spans go nowhere: set OTEL_EXPORTER_OTLP_ENDPOINT, or pass"
                " --trace console"
            )
        provider.shutdown()
        return _traced(config, False)
    trace.set_tracer_provider(provider)
    return _traced(config, True)
