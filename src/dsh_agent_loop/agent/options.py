"""``AgentOptions`` and ``TurnBudget``: what an agent is created with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import attrs

from ..errors import InvalidOptionError

__all__ = ["AgentOptions", "TurnBudget"]


def _names(names: Iterable[str]) -> frozenset[str]:
    return frozenset((names,) if isinstance(names, str) else names)  # one name is a set of one


@final
@attrs.frozen
class TurnBudget:
    """Per-turn limits; exceeding one aborts the turn with cause ``hook`` (SPEC §16).

    The one budget record: agent options carry it, and the config (``turnBudget``) loads into it.
    """

    max_steps: int | None = None
    """Steps per turn."""
    max_tool_calls: int | None = None
    """Tool calls per turn."""
    max_total_tokens: int | None = None
    """Input plus output tokens over the turn."""
    max_seconds: float | None = None
    """Wall-clock (or runtime-clock) seconds per turn."""


@final
@attrs.frozen
class AgentOptions:
    """How an agent is created or resumed."""

    id: str
    """Agent id, unique among live agents of a runtime."""
    provider: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    cwd: str | None = None
    persona: str | None = None
    """Agent persona (a ``persona`` prompt section)."""
    tools: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    """Visible tool names; None = every runtime tool (built-in tools only when named)."""
    turn_budget: TurnBudget | None = None
    require_approval: frozenset[str] = attrs.field(default=frozenset(), converter=_names)
    """Names of tools whose every call waits for a person's decision (``agent.approve``)."""

    def validate(self) -> None:
        """Check option values.

        Raises:
            InvalidOptionError: an empty id, ``max_tokens <= 0``, an empty reasoning effort, or a
                negative budget.
        """
        if not self.id:
            raise InvalidOptionError("agent id must be a non-empty string")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens <= 0
        ):
            raise InvalidOptionError(
                f"max_tokens must be a positive integer, got {self.max_tokens!r}"
            )
        if self.reasoning_effort is not None and not self.reasoning_effort:
            raise InvalidOptionError("reasoning_effort must be non-empty when set")
        budget = self.turn_budget
        if budget is not None:
            for name in ("max_steps", "max_tool_calls", "max_total_tokens", "max_seconds"):
                value = getattr(budget, name)
                if value is not None and value <= 0:
                    raise InvalidOptionError(f"turn_budget.{name} must be positive, got {value!r}")
