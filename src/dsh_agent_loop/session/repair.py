"""Crash repair (SPEC §13–§14): the events that close a turn interrupted by a process crash.

A crash loses the model stream in flight (nothing of it was stored), so repair works only from
what is stored. For the open turn, every model tool call without a result gets one, in model
order: ``TOOL_OUTCOME_UNKNOWN`` when its ``tool/call`` is stored (the tool may have run: its side
effects should be verified, never assumed absent), or a synthetic ``tool/call`` followed by
``TOOL_NOT_STARTED`` when none is (so every result cites a call). Then ``step/end`` if a step is
open, then ``turn/end {kind: interrupted}``. A log without an open turn needs nothing, so
repairing twice gives the same log as repairing once. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._frozen import FrozenDict
from ..events import (
    ASSISTANT_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Event,
    make_event,
)
from .records import tool_call_data, tool_result_data

__all__ = ["NOT_STARTED_TEXT", "OUTCOME_UNKNOWN_TEXT", "repair_events"]

OUTCOME_UNKNOWN_TEXT: Final = (
    "Error: the process stopped while this tool call was running; its outcome is unknown. "
    "Verify its side effects before repeating it."
)
NOT_STARTED_TEXT: Final = "Error: the process stopped before this tool call was started."


def _open_turn(events: Sequence[Event]) -> int | None:
    """Index of the ``turn/start`` of the open turn, or None."""
    for i in range(len(events) - 1, -1, -1):
        t = events[i].type
        if t == TURN_END:
            return None
        if t == TURN_START:
            return i
    return None


def _scan(
    events: Sequence[Event],
) -> tuple[int | None, list[tuple[int, FrozenDict]], dict[str, int], set[str]]:
    """Open step, model calls (step, block) in order, tool/call seqs, answered call ids."""
    open_step: int | None = None
    calls: list[tuple[int, FrozenDict]] = []
    call_seqs: dict[str, int] = {}
    answered: set[str] = set()
    for event in events:
        t, data = event.type, event.data
        if t == STEP_START:
            open_step = data["step"]
        elif t == STEP_END:
            open_step = None
        elif t == ASSISTANT_MESSAGE:
            content = data["message"]["content"]
            calls.extend((data["step"], b) for b in content if b["type"] == "tool-call")
        elif t == TOOL_CALL:
            call_seqs[data["call_id"]] = event.seq  # type: ignore[assignment]
        elif t == TOOL_RESULT:
            answered.add(data["message"]["call_id"])
    return open_step, calls, call_seqs, answered


def repair_events(events: Sequence[Event], now: float) -> list[Event]:
    """The closers for ``events`` (seqs continue the log), or ``[]`` when no turn is open."""
    start = _open_turn(events)
    if start is None:
        return []
    turn = events[start].data["turn"]
    open_step, calls, call_seqs, answered = _scan(events[start:])
    out: list[Event] = []

    def add(type_: str, data: FrozenDict, cites: tuple[int, ...] | None = None) -> int:
        seq = len(events) + len(out)
        out.append(make_event(type_, seq, now, data, None, cites))
        return seq

    for step, block in calls:
        call_id = block["call_id"]
        if call_id in answered:
            continue
        answered.add(call_id)
        if call_id in call_seqs:
            error = ("OutcomeUnknown", "TOOL_OUTCOME_UNKNOWN")
            data = tool_result_data(turn, step, block, OUTCOME_UNKNOWN_TEXT, error=error)
            add(TOOL_RESULT, data, (call_seqs[call_id],))
            continue
        call_seq = add(TOOL_CALL, tool_call_data(turn, step, block))
        error = ("NotStarted", "TOOL_NOT_STARTED")
        data = tool_result_data(turn, step, block, NOT_STARTED_TEXT, error=error)
        add(TOOL_RESULT, data, (call_seq,))
    if open_step is not None:
        add(STEP_END, FrozenDict(turn=turn, step=open_step))
    add(TURN_END, FrozenDict(turn=turn, reason=FrozenDict(kind="interrupted")))
    return out
