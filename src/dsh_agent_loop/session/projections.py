"""Projections folded synchronously on every append: the inbox and the loop's own state.

The inbox fold (SPEC §5) applies ``agent/inbox/spliced`` events at list coordinates; a
persisted splice whose coordinates are out of range fails with ``invalid persisted inbox
splice at session seq N``. The loop-state fold tracks what the driver and crash repair need
from the log alone (turn and step numbers, open turn/step, the latest request header and
context, the runtime-context text, the message-id counter). All sans-I/O.
"""

from __future__ import annotations

from typing import Any, Final

from .._frozen import FrozenDict
from ..errors import AgentLoopError
from ..events import (
    ASSISTANT_MESSAGE,
    INBOX_SPLICED,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from .history import message_text

__all__ = ["NEXT_STEP", "NEXT_TURN", "InboxProjection", "InvalidSpliceError", "LoopState"]

NEXT_TURN: Final = "next-turn"
NEXT_STEP: Final = "next-step"
RUNTIME_CONTEXT_SOURCE: Final = "runtime-context"


class InvalidSpliceError(AgentLoopError):
    """A persisted inbox splice has coordinates outside its list."""

    code = "INVALID_INBOX_SPLICE"


def _id_number(message_id: Any) -> int:
    if isinstance(message_id, str) and message_id.startswith("m-"):
        try:
            return int(message_id[2:])
        except ValueError:
            return 0
    return 0


class InboxProjection:
    """The two pending lists, rebuilt from splices."""

    __slots__ = (
        "lists",
        "max_id",
    )

    types = frozenset({INBOX_SPLICED, USER_MESSAGE})

    def __init__(self) -> None:
        self.lists: dict[str, list[FrozenDict]] = {NEXT_TURN: [], NEXT_STEP: []}
        self.max_id = 0
        """Highest ``m-<n>`` seen, so new ids stay unique per session."""

    def fold(self, event: Event) -> None:
        """Fold one splice (or note a user message id)."""
        data = event.data
        if event.type == USER_MESSAGE:
            n = _id_number(data["message"].get("id"))
            if n > self.max_id:
                self.max_id = n
            return
        target = self.lists.get(str(data.get("target")))
        start, removed = data.get("start"), data.get("removed_count")
        inserted = data.get("inserted", ())
        if (
            target is None
            or type(start) is not int
            or type(removed) is not int
            or not 0 <= start <= len(target)
            or not 0 <= removed <= len(target) - start
        ):
            raise InvalidSpliceError(f"invalid persisted inbox splice at session seq {event.seq}")
        target[start : start + removed] = inserted
        for message in inserted:
            n = _id_number(message.get("id"))
            if n > self.max_id:
                self.max_id = n

    def ids(self) -> set[str]:
        """Ids pending in either list."""
        return {m["id"] for lst in self.lists.values() for m in lst}


class LoopState:
    """What the driver derives from the log: turns, steps, request records, context text."""

    __slots__ = (
        "call_ids",
        "context",
        "header",
        "open_step",
        "open_turn",
        "runtime_context",
        "step",
        "turn",
    )

    types = frozenset(
        {
            TURN_START,
            TURN_END,
            STEP_START,
            STEP_END,
            REQUEST_HEADER,
            REQUEST_CONTEXT,
            USER_MESSAGE,
            ASSISTANT_MESSAGE,
        }
    )

    def __init__(self) -> None:
        self.turn = 0
        self.open_turn = False
        self.step = 0
        self.open_step = False
        self.header: FrozenDict | None = None
        """The latest ``request/header`` header."""
        self.context: FrozenDict | None = None
        """The latest ``request/context`` data."""
        self.runtime_context: str | None = None
        """Text of the latest runtime-context ``user/message``."""
        self.call_ids: set[str] | None = None
        """Tool-call ids of every assistant message (made on the first call)."""

    def _note_calls(self, content: tuple[FrozenDict, ...]) -> None:
        for block in content:
            if block["type"] == "tool-call":
                if self.call_ids is None:
                    self.call_ids = set()
                self.call_ids.add(block["call_id"])

    def fold(self, event: Event) -> None:
        """Fold one event."""
        t = event.type
        data = event.data
        if t == STEP_START:
            self.step = data["step"]
            self.open_step = True
        elif t == STEP_END:
            self.open_step = False
        elif t == TURN_START:
            self.turn = data["turn"]
            self.open_turn = True
            self.step = 0
        elif t == TURN_END:
            self.open_turn = False
            self.open_step = False
        elif t == REQUEST_HEADER:
            self.header = data["header"]
        elif t == REQUEST_CONTEXT:
            self.context = data
        elif t == ASSISTANT_MESSAGE:
            self._note_calls(data["message"]["content"])
        elif t == USER_MESSAGE:
            message = data["message"]
            if message.get("source") == RUNTIME_CONTEXT_SOURCE:
                self.runtime_context = message_text(message)
