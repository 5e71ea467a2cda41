"""The ``otel`` key of the plugin config block: trace agents with the global tracer provider.

``otel: true`` turns tracing on, ``otel: {captureContent: true}`` also records message content;
absent (or ``otel: false``) nothing is traced and ``opentelemetry`` is never imported.
"""

from __future__ import annotations

from typing import final

import attrs

__all__ = ["OtelConfig"]


@final
@attrs.frozen
class OtelConfig:
    """``otel``: OpenTelemetry spans of turns, model attempts and tool calls (extra ``otel``)."""

    enabled: bool = True
    """Trace (``otel: false`` reads as ``enabled: false``)."""
    capture_content: bool = False
    """Record messages, tool arguments and tool results on the spans (``captureContent``)."""
