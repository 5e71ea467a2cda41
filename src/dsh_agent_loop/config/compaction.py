"""The ``compaction`` key (plugin config block and ``agents[]``): when history is summarised.

``compaction: {triggerRatio: 0.8, keepRecentTurns: 2, instructions: "..."}`` gives every agent
(or one declared agent) a ``CompactionPolicy``; ``compaction: {}`` is the defaults. A custom
summarizer or token counter is Python-only (``CompactionPolicy`` in ``open_runtime``).
"""

from __future__ import annotations

from typing import final

import attrs

from ..agent.options import CompactionPolicy
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

    def policy(self) -> CompactionPolicy:
        """The ``CompactionPolicy`` this entry describes."""
        return CompactionPolicy(
            trigger_ratio=self.trigger_ratio,
            keep_recent_turns=self.keep_recent_turns,
            instructions=self.instructions,
        )
