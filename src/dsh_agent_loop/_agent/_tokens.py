"""The built-in token estimate of an agent's history, kept incrementally (``docs/context.md``).

``CHARS_PER_TOKEN`` characters a token and ``MESSAGE_OVERHEAD`` tokens a message; the
``ContextTracker`` of one agent counts only what its history gained since it last looked, and
anchors the estimate at the latest usage a provider reported. Sans-I/O: it reads a ``Session``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

from ..events import ASSISTANT_MESSAGE, Event

if TYPE_CHECKING:
    from .._frozen import FrozenDict
    from .._session.log import Session

__all__ = [
    "CHARS_PER_TOKEN",
    "MESSAGE_OVERHEAD",
    "ContextTracker",
    "estimate_tokens",
    "message_chars",
]

#: Characters per token of the built-in estimate.
CHARS_PER_TOKEN: Final = 4
#: Tokens a message costs beyond its text (role, separators).
MESSAGE_OVERHEAD: Final = 4


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(k) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_chars(v) for v in value)
    return 0 if value is None else len(str(value))


def message_chars(message: Mapping[str, Any]) -> int:
    """Characters of a derived message the estimate counts (text, reasoning, calls, results)."""
    total = 0
    for block in message.get("content", ()):
        kind = block.get("type")
        if kind in ("text", "reasoning", "tool-result"):
            total += len(block.get("text") or "")
        elif kind == "tool-call":
            total += len(block.get("name") or "") + _text_chars(block.get("arguments"))
        else:
            total += _text_chars(block)
    return total


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The built-in estimate of ``messages``: characters / ``CHARS_PER_TOKEN`` plus overhead."""
    chars = sum(message_chars(m) for m in messages)
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD * len(messages)


@final
class ContextTracker:
    """One agent's running estimate of its history (made on first use).

    Everything is incremental: the character count grows with the messages appended since the
    last call, and the latest reported usage is found by looking only at the events appended
    since. A replacement (the surface generation moves) starts the count over.
    """

    __slots__ = (
        "_anchor",
        "_anchor_chars",
        "_chars",
        "_count",
        "_generation",
        "_schema_tokens",
        "_schemas",
        "_seen",
    )

    def __init__(self) -> None:
        self._generation = -1
        self._count = 0
        self._chars = 0
        self._schemas: Any = None
        self._schema_tokens = 0
        self._seen = 0
        self._anchor: tuple[int, int] | None = None
        """``(input_tokens, position)``: the latest report and how many messages it covered."""
        self._anchor_chars = 0
        """Characters of the messages before the anchor's position."""

    def schema_tokens(self, key: Any, schemas: Sequence[Mapping[str, Any]]) -> int:
        """The estimate of the tool schemas (remembered while ``key`` is the same object)."""
        if key is not self._schemas:
            self._schemas, self._schema_tokens = key, _schema_tokens(schemas)
        return self._schema_tokens

    def history(self, log: Session) -> tuple[int, Sequence[FrozenDict]]:
        """Characters of the whole derived history, and the history (O(new messages))."""
        surface = log.surface
        messages = surface.messages()
        if surface.generation != self._generation or len(messages) < self._count:
            self._generation, self._count, self._chars = surface.generation, 0, 0
        for i in range(self._count, len(messages)):
            self._chars += message_chars(messages[i])
        self._count = len(messages)
        return self._chars, messages

    def reported(self, log: Session, messages: Sequence[FrozenDict]) -> tuple[int, int, int] | None:
        """``(input_tokens, messages since, characters since)`` of the latest usage report.

        None when no request on the current surface reported usage, or a replacement came
        after it. Call ``history`` first.
        """
        end = len(log)
        if end < self._seen:
            self._seen, self._anchor = 0, None
        for seq in range(end - 1, self._seen - 1, -1):  # the newest decides; older ones don't
            event = log.event(seq)
            op = event.surface_op
            if op is not None and op != "append":
                self._anchor = None  # the surface changed under the report
                break
            if event.type == ASSISTANT_MESSAGE:
                self._anchor = self._locate(event, messages)
                break
        self._seen = end
        if self._anchor is None:
            return None
        tokens, position = self._anchor
        return tokens, len(messages) - position, self._chars - self._anchor_chars

    def _locate(self, event: Event, messages: Sequence[FrozenDict]) -> tuple[int, int] | None:
        usage = event.data.get("usage")
        tokens = usage.get("input_tokens") if usage is not None else None
        if not tokens:
            return None
        message = event.data["message"]
        after = 0
        for position in range(len(messages) - 1, -1, -1):
            item = messages[position]
            after += message_chars(item)
            if item is message:
                self._anchor_chars = self._chars - after
                return int(tokens), position
        return None


def _schema_tokens(schemas: Sequence[Mapping[str, Any]]) -> int:
    return math.ceil(sum(_text_chars(s) for s in schemas) / CHARS_PER_TOKEN)
