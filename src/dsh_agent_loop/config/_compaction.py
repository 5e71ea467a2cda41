"""The ``compaction`` key (plugin config block and ``agents[]``): when history is summarised.

``compaction: {triggerRatio: 0.8, keepRecentTurns: 2, instructions: "..."}`` gives every agent
(or one declared agent) a ``CompactionPolicy``; ``compaction: {}`` is the defaults. A custom
summarizer or token counter is Python-only (``CompactionPolicy`` in ``open_runtime``). The record
holds the data keys only; the runtime's composition (``_compose.py``) makes the policy of it.
"""

from __future__ import annotations

from typing import final

import attrs

from ._rules import NonNegativeInt, Ratio

__all__ = ["CompactionConfig"]


@final
@attrs.frozen
class CompactionConfig:
    """``compaction``: the data keys of a ``CompactionPolicy``."""

    trigger_ratio: Ratio = 0.8
    """Compact when the estimated input reaches this share of the context window."""
    keep_recent_turns: NonNegativeInt = 2
    """Turns kept verbatim."""
    instructions: str | None = None
    """Extra instructions for the summary."""
