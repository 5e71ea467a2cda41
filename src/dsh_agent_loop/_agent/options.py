"""``AgentOptions``: what an agent is created with (its ``TurnBudget`` is defined in ``limits``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, final

import attrs

from .._errors import InvalidOptionError
from .._limits import TurnBudget as TurnBudget
from .._permissions import Permissions
from .._sandbox import Sandbox

__all__ = ["AgentOptions", "CompactionPolicy", "TurnBudget", "check_provider"]

#: ``summarizer(messages, instructions) -> summary text``.
Summarizer = Callable[[Sequence[Any], "str | None"], Awaitable[str]]
#: ``token_counter(messages) -> tokens`` of a whole request.
TokenCounter = Callable[[Sequence[Any]], int]


def _names(names: Iterable[str]) -> frozenset[str]:
    return frozenset((names,) if isinstance(names, str) else names)  # one name is a set of one


@final
@attrs.frozen
class CompactionPolicy:
    """When and how an agent's older history is summarised (``docs/context.md``).

    Before a step whose estimated input reaches ``trigger_ratio`` of the context window, the
    surface after node 0 and before the last ``keep_recent_turns`` turns (never splitting a tool
    call from its result) is summarised and replaced by one ``user/message`` with
    ``source: compaction``. A provider's context-overflow error (``CONTEXT_OVERFLOW``) compacts
    and retries the step once.
    """

    trigger_ratio: float = 0.8
    """Compact when estimated input tokens / context window reaches this (0 < ratio <= 1)."""
    keep_recent_turns: int = 2
    """Turns kept verbatim, the running turn included (fewer when nothing older is left)."""
    instructions: str | None = None
    """Extra instructions for the summary (what to keep)."""
    summarizer: Summarizer | None = attrs.field(default=None, eq=False)
    """``async (messages, instructions) -> str``; default: one model call on the agent's route."""
    token_counter: TokenCounter | None = attrs.field(default=None, eq=False)
    """``(messages) -> int`` counting a whole request; default: reported usage plus an
    estimate of what was added since (``CHARS_PER_TOKEN`` characters a token)."""

    def validate(self) -> None:
        """Check the values.

        Raises:
            InvalidOptionError: a ratio outside (0, 1], a negative or non-integer turn count,
                or a summarizer/token counter that is not callable.
        """
        ratio = self.trigger_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise InvalidOptionError(f"compaction.trigger_ratio must be in (0, 1], got {ratio!r}")
        keep = self.keep_recent_turns
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InvalidOptionError(
                f"compaction.keep_recent_turns must be a non-negative integer, got {keep!r}"
            )
        for name in ("summarizer", "token_counter"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidOptionError(f"compaction.{name} must be callable, got {value!r}")


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
    compaction: CompactionPolicy | None = None
    """This agent's compaction policy (None: the runtime's, if any)."""
    permissions: Permissions | None = None
    """This agent's permission policy (None: the runtime's, or its parent's for a sub-agent;
    ``docs/security.md``)."""
    sandbox: Sandbox | None = None
    """How ``run_command`` confines this agent's commands (None: the runtime's, or its
    parent's for a sub-agent; ``docs/security.md``)."""

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
        if self.compaction is not None:
            self.compaction.validate()


def check_provider(options: AgentOptions, known: Collection[str]) -> None:
    """Refuse a provider nobody registered when the agent is created, not at its first call.

    Raises:
        InvalidOptionError: ``options.provider`` is set and not one of ``known``.
    """
    provider = options.provider
    if provider is not None and provider not in known:
        names = ", ".join(sorted(known)) if known else "none registered"
        raise InvalidOptionError(
            f"agent {options.id!r}: unknown provider {provider!r} (known: {names})"
        )
