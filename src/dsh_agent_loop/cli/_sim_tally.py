"""What ``dsh-agent simulate`` finds reading its stored sessions back: ``Tally``.

One pass over each session's events counts them, times every step (``step/start`` to
``step/end``) and every turn (``turn/start`` to ``turn/end``), counts the session's steps and
its turns by how they ended, digests the conversation (prompts, replies, tool calls: no ids,
no times) and checks the log with ``invariants.check``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import attrs

from .. import invariants
from ..events import (
    ASSISTANT_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from ._sim_summary import DIGEST_MODULUS

__all__ = ["Tally"]


@attrs.define
class Tally:
    """What reading the stored sessions back found."""

    events: int = 0
    steps: int = 0
    violations: int = 0
    samples: list[str] = attrs.field(factory=list)
    step_times: list[float] = attrs.field(factory=list)
    turn_times: list[float] = attrs.field(factory=list)
    """Seconds from each turn's ``turn/start`` to its ``turn/end``."""
    turn_ends: dict[str, int] = attrs.field(factory=dict)
    agent_steps: dict[int, int] = attrs.field(factory=dict)
    """Sessions by the steps each holds."""
    digest: int = 0
    """The sum of the sessions' conversation digests (``SimSummary.replies_digest``)."""

    def add(self, session_id: str, events: Sequence[Event]) -> None:
        """Count, time and check one session's ``events``."""
        self.events += len(events)
        started: float | None = None
        turn_began: float | None = None
        steps = 0
        conversation = hashlib.blake2b(digest_size=8)
        for event in events:
            if event.type in _SPOKEN:
                conversation.update(_spoken(event))
            elif event.type == STEP_START:
                started = event.time
            elif event.type == STEP_END:
                steps += 1
                if started is not None:
                    self.step_times.append(event.time - started)
                started = None
            elif event.type == TURN_START:
                turn_began = event.time
            elif event.type == TURN_END:
                kind = str((event.data.get("reason") or {}).get("kind", "?"))
                self.turn_ends[kind] = self.turn_ends.get(kind, 0) + 1
                if turn_began is not None:
                    self.turn_times.append(event.time - turn_began)
                turn_began = None
        self.steps += steps
        self.agent_steps[steps] = self.agent_steps.get(steps, 0) + 1
        self.digest = (self.digest + int.from_bytes(conversation.digest())) % DIGEST_MODULUS
        found = invariants.check(events)
        self.violations += len(found)
        for violation in found[: max(0, 5 - len(self.samples))]:
            self.samples.append(f"{session_id}: {violation}")


#: What ``Tally.digest`` reads: prompts, replies and tool calls (no ids, no times).
_SPOKEN: Final = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_CALL})


def _spoken(event: Event) -> bytes:
    """The words of a prompt or a reply, or a tool call's name and arguments."""
    data = event.data
    if event.type == TOOL_CALL:
        return f"{event.type}|{data.get('name')}|{data.get('arguments')}|".encode()
    content = (data.get("message") or {}).get("content") or ()
    texts = (block.get("text", "") for block in content if block.get("type") == "text")
    return f"{event.type}|{'|'.join(texts)}|".encode()
