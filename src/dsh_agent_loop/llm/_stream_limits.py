"""``StreamLimits``: how much one streamed model reply may cost before the attempt fails.

A provider's stream is untrusted input: a server may send a line that never ends, one enormous
event, an endless answer, or nothing but keep-alive comments. Each HTTP adapter (``openai``,
``anthropic``) reads its streams within these bounds; the defaults stop a hostile peer long
before it costs a few hundred megabytes, and leave room for the largest honest replies (a whole
file written as one tool call's arguments in a single frame, a 128k-token answer). Past a byte
or size cap the attempt fails ``BAD_STREAM`` (not retried by default); past the idle limit it
fails ``TIMEOUT`` (transient, retried). ``docs/configuration.md`` lists them with the provider
keys (``stream_limits:``).
"""

from __future__ import annotations

import math
from typing import Any, Final, final

import attrs

__all__ = ["DEFAULT_STREAM_LIMITS", "StreamLimits"]


def _positive_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"StreamLimits.{attribute.name} must be a positive integer, not {value!r}")


def _idle(_: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"StreamLimits.{attribute.name} must be a number, not {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"StreamLimits.{attribute.name} must be positive and finite")


@final
@attrs.frozen
class StreamLimits:
    """Bounds on one provider's streams (every attempt is read within them).

    Example: ``OpenAIAdapter("local", base_url=..., stream_limits=StreamLimits(idle_timeout=60))``;
    in a config file ``stream_limits: {idle_timeout: 60}`` under the provider.
    """

    max_line_bytes: int = attrs.field(default=4 << 20, validator=_positive_int)
    """One SSE line, in UTF-8 bytes (4 MiB). Counted as the bytes arrive: a line without an end
    fails the attempt as soon as it passes the cap (``BAD_STREAM``), never read whole."""
    max_event_bytes: int = attrs.field(default=8 << 20, validator=_positive_int)
    """One SSE event's ``data`` (its data lines joined), in UTF-8 bytes (8 MiB); more is
    ``BAD_STREAM``."""
    max_output_chars: int = attrs.field(default=2_000_000, validator=_positive_int)
    """Characters of text, reasoning and tool-call arguments one attempt may stream, all
    counted together (2,000,000); more is ``BAD_STREAM``."""
    idle_timeout: float | None = attrs.field(default=None, validator=_idle)
    """Seconds an attempt may stream without progress (None: the provider's read timeout,
    300 s by default). Only what the adapter turns into a chunk counts: keep-alive comments,
    blank lines, pings and frames that carry nothing do not, so a stream of only those ends
    ``TIMEOUT``."""

    def changed(self) -> dict[str, Any]:
        """The fields that differ from the defaults (the section that would give these limits)."""
        return {
            field.name: getattr(self, field.name)
            for field in attrs.fields(type(self))
            if getattr(self, field.name) != field.default
        }


#: The limits of a provider that sets none.
DEFAULT_STREAM_LIMITS: Final = StreamLimits()
