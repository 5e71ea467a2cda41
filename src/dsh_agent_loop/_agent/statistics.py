"""``AgentStatistics``: a snapshot of one agent's counters, counted since it was created or resumed.

Nothing is counted on the hot path for statistics alone: steps, tool calls and token totals are
the session's loop-state counters (``LoopState.counters``, an int increment per ``step/start``,
``tool/call`` and usage-carrying ``assistant/message``), read at snapshot time minus what they
were when the agent instance was built — so a resumed agent counts its own work, not the log's.
"""

from __future__ import annotations

from typing import final

import attrs

__all__ = ["AgentStatistics", "Counters"]

Counters = tuple[int, int, int, int, int, int]
"""``(steps, tool_calls, input, output, cache-read, reasoning tokens)``, as ``LoopState`` counts."""


@final
@attrs.frozen
class AgentStatistics:
    """A snapshot of one agent's counters (``agent.statistics()``)."""

    turns: int
    """Turns this agent instance ran."""
    events: int
    """Events in its session log (stored history included)."""
    status: str
    """``"idle"`` or ``"running"``."""
    subscribers: int
    """Live ``subscribe()`` channels."""
    steps: int = 0
    """Steps entered (``step/start``)."""
    tool_calls: int = 0
    """Tool calls the model asked for (``tool/call``, executed or not)."""
    input_tokens: int = 0
    """Input tokens, summed over the usage recorded on assistant messages."""
    output_tokens: int = 0
    """Output tokens (same source)."""
    cache_read_tokens: int = 0
    """Input tokens served from the provider's cache (same source; 0 when not reported)."""
    reasoning_tokens: int = 0
    """Reasoning tokens (same source; 0 when not reported)."""

    @classmethod
    def of(
        cls,
        *,
        turns: int,
        events: int,
        status: str,
        subscribers: int,
        now: Counters,
        base: Counters,
    ) -> AgentStatistics:
        """The snapshot whose log counters are ``now - base`` (``base``: at build time)."""
        steps, calls, inp, out, cache, reasoning = (a - b for a, b in zip(now, base, strict=True))
        return cls(turns, events, status, subscribers, steps, calls, inp, out, cache, reasoning)
