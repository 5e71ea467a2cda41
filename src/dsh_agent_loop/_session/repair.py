"""Crash repair: the events that close a turn interrupted by a process crash.

See docs/design.md#crash-repair.

A crash loses the model stream in flight (nothing of it was stored), so repair works only from
what is stored. For the open turn, every model tool call without a result gets one, in model
order: ``TOOL_OUTCOME_UNKNOWN`` when its ``tool/call`` is stored (the tool may have run: its side
effects should be verified, never assumed absent), or a synthetic ``tool/call`` followed by
``TOOL_NOT_STARTED`` when none is (so every result cites a call). Then ``step/end`` if a step is
open, then ``turn/end {kind: interrupted}``. A log without an open turn needs nothing, so
repairing twice gives the same log as repairing once. Sans-I/O.

Durable approval (``_agent/approvals.py``): a call of the open turn with a stored
``tool/approval-requested`` never ran, and a person may still decide it, so repair leaves it
alone and ends the turn ``{kind: awaiting-approval, call_ids}`` instead; it stays pending after
the resume. When the open turn is the continuation of such a turn, the calls it was settling
and did not answer get their result first: ``DENIED`` (with the message) for a denied one, which
never runs, and ``TOOL_OUTCOME_UNKNOWN`` for an approved one, which may have run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._frozen import FrozenDict
from ..events import (
    ASSISTANT_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_APPROVAL,
    TOOL_APPROVAL_REQUESTED,
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
) -> tuple[int | None, list[tuple[int, FrozenDict]], dict[str, int], set[str], list[str]]:
    """Open step, model calls (step, block), tool/call seqs, answered and deferred call ids."""
    open_step: int | None = None
    calls: list[tuple[int, FrozenDict]] = []
    call_seqs: dict[str, int] = {}
    answered: set[str] = set()
    deferred: list[str] = []
    for event in events:
        t, data = event.type, event.data
        if t == TOOL_APPROVAL_REQUESTED:
            deferred.append(data["call_id"])
        elif t == STEP_START:
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
    return open_step, calls, call_seqs, answered, deferred


def _carried(events: Sequence[Event], start: int) -> list[tuple[Event, FrozenDict | None]]:
    """The calls the turn opened at ``start`` continues: (its ``tool/call``, its decision)."""
    end = start - 1
    while end >= 0 and events[end].type != TURN_END:
        end -= 1
    if end < 0:
        return []
    reason = events[end].data["reason"]
    if reason["kind"] != "awaiting-approval":
        return []
    ids = set(reason.get("call_ids", ()))
    calls: dict[str, Event] = {}
    decisions: dict[str, FrozenDict] = {}
    for i in range(end - 1, -1, -1):
        if events[i].type == TURN_START:
            break
        if events[i].type == TOOL_CALL and events[i].data["call_id"] in ids:
            calls[events[i].data["call_id"]] = events[i]
    for event in events[end:start]:
        if event.type == TOOL_APPROVAL:
            decisions[event.data["call_id"]] = event.data
    ordered = sorted(calls.values(), key=lambda e: e.seq or 0)
    return [(e, decisions.get(e.data["call_id"])) for e in ordered]


def repair_events(events: Sequence[Event], now: float) -> list[Event]:
    """The closers for ``events`` (seqs continue the log), or ``[]`` when no turn is open."""
    start = _open_turn(events)
    if start is None:
        return []
    turn = events[start].data["turn"]
    open_step, calls, call_seqs, answered, deferred = _scan(events[start:])
    out: list[Event] = []

    def add(type_: str, data: FrozenDict, cites: tuple[int, ...] | None = None) -> int:
        seq = len(events) + len(out)
        out.append(make_event(type_, seq, now, data, None, cites))
        return seq

    for call, decision in _carried(events, start):
        if call.data["call_id"] in answered:
            continue
        block, step = call.data, open_step or 1
        if decision is not None and decision["decision"] != "approve":
            message = decision.get("message")
            text = f"Error: tool call denied: {message}" if message else "Error: tool call denied"
            data = tool_result_data(turn, step, block, text, error=("Denied", "DENIED"))
        else:
            error = ("OutcomeUnknown", "TOOL_OUTCOME_UNKNOWN")
            data = tool_result_data(turn, step, block, OUTCOME_UNKNOWN_TEXT, error=error)
        add(TOOL_RESULT, data, (call.seq,))  # type: ignore[arg-type]
    waiting = [c for c in deferred if c not in answered and c in call_seqs]
    for step, block in calls:
        call_id = block["call_id"]
        if call_id in answered or call_id in waiting:
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
    if waiting:
        reason = FrozenDict(kind="awaiting-approval", call_ids=tuple(waiting))
    else:
        reason = FrozenDict(kind="interrupted")
    add(TURN_END, FrozenDict(turn=turn, reason=reason))
    return out
