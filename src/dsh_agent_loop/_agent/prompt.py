"""System-prompt projection: assembly records and the reconciliation decision table.

See docs/design.md#system-prompt.

System nodes are the surviving ``system/message`` surface events; node 0 is the head and the
effective prompt is the latest non-empty node. Given the rendered prompt, the route's
capability and whether a new request series starts, ``reconcile`` returns the system events to
append, in order:

1. No node yet: append the render, even if empty (it reserves node 0; empty = no wire message).
2. Route not ``in-history``, a new series, or an empty render: every non-empty later node gets
   an empty replacement, then the head is replaced if its text differs from the render —
   consolidation happens even when the effective text is already the render.
3. Otherwise (in-history, continuing, non-empty): nothing when the effective text equals the
   render, else append the render as a new node.

Sans-I/O: it reads ``(seq, text)`` pairs and returns drafts; the driver appends them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, final

import attrs

from .._frozen import FrozenDict, from_shape, shape

__all__ = [
    "PromptAssembly",
    "PromptSection",
    "SystemDraft",
    "reconcile",
    "render",
    "system_message",
]


@final
@attrs.frozen
class PromptSection:
    """One section of the system prompt (``kind`` is free-form: ``persona``, ``tools``, ...)."""

    kind: str
    text: str


def _to_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


@final
@attrs.frozen
class PromptAssembly:
    """What ``system-prompt/assemble`` passes and returns: prompt sections and visible tools."""

    sections: tuple[PromptSection, ...] = attrs.field(default=(), converter=_to_tuple)
    tools: tuple[Any, ...] = attrs.field(default=(), converter=_to_tuple)
    """``Tool`` objects visible to the model this step."""


def render(assembly: PromptAssembly) -> str:
    """The prompt text: non-empty section texts joined by a blank line."""
    return "\n\n".join(s.text for s in assembly.sections if s.text)


@final
@attrs.frozen
class SystemDraft:
    """A ``system/message`` to append; ``replaces`` is the seq it replaces, or None (append)."""

    text: str
    replaces: int | None = None


def system_message(text: str) -> FrozenDict:
    """The model-facing system message for ``text`` (empty text → empty content)."""
    content = (from_shape(_TEXT_BLOCK, ("text", text)),) if text else ()
    return from_shape(_SYSTEM, ("system", content))


# The shapes ``system_message`` builds (``from_shape``: one C call each).
_TEXT_BLOCK = shape(("type", "text"))
_SYSTEM = shape(("role", "content"))


def reconcile(
    nodes: Sequence[tuple[int, str]], rendered: str, *, in_history: bool, new_series: bool
) -> list[SystemDraft]:
    """Decide the system events for this request (see the module docstring).

    Args:
        nodes: ``(seq, text)`` of the surviving system nodes, head first.
        rendered: The rendered prompt.
        in_history: The prepared route accepts later system messages.
        new_series: A new request series starts with this request.
    """
    if not nodes:
        return [SystemDraft(rendered)]
    if not in_history or new_series or not rendered:
        drafts = [SystemDraft("", seq) for seq, text in nodes[1:] if text]
        head_seq, head_text = nodes[0]
        if head_text != rendered:
            drafts.append(SystemDraft(rendered, head_seq))
        return drafts
    effective = next((text for _, text in reversed(nodes) if text), "")
    return [] if effective == rendered else [SystemDraft(rendered)]
