"""``TurnResult``: what one turn did, read back from its events in the log.

See docs/design.md#awaitable-turns.

The log is the truth: a result is built only from the turn's stored events, ``turn/start``
through ``turn/end``, never from live state, so the same turn read again (or after a resume)
gives the same result. ``text`` is only the text blocks of the turn's last ``assistant/message``
(reasoning is its own field: a reasoning model's first block is never the answer). Usage is
summed over the turn's model calls; a failed attempt (``assistant/attempt``) counts as a request
but carries no token counts. Sans-I/O.

A call that waits for a person is an ``ApprovalRequest`` (``_agent/approvals.py`` makes them); a
turn that did not end well is a ``TurnError`` carrying its ``TurnResult`` (``run()`` raises it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, final

import attrs

from .._errors import AgentLoopError
from .._frozen import FrozenDict, freeze
from ..events import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    SURFACE_TYPES,
    SYSTEM_MESSAGE,
    TOOL_CALL,
    TOOL_RESULT,
    Event,
)
from ..llm import Usage

__all__ = [
    "ApprovalRequest",
    "ToolCallRecord",
    "TurnAbortedError",
    "TurnBlockedError",
    "TurnError",
    "TurnFailedError",
    "TurnResult",
    "build_result",
    "turn_error",
]


@final
@attrs.frozen
class ApprovalRequest:
    """A tool call waiting for ``agent.approve(call_id)`` or ``agent.deny(call_id)``."""

    call_id: str
    name: str
    arguments: Mapping[str, Any]
    """The parsed arguments the call will run with once approved."""
    turn: int
    """The turn that asked (it ended ``awaiting-approval``)."""
    step: int


@final
@attrs.frozen
class ToolCallRecord:
    """One tool call of a turn and its result, as logged."""

    call_id: str
    name: str
    arguments: Mapping[str, Any] | str
    """The decoded JSON object, or the raw text when it is not one (the model sent bad JSON)."""
    content: str | None
    """The result text the model read (None: the turn ended before a result was logged)."""
    error: str | None
    """The result's error code (``TOOL_ERROR``, ``DENIED``, ...), or None for a success."""


@final
@attrs.frozen
class TurnResult:
    """The outcome of one turn, built from its events after its ``turn/end`` was stored."""

    turn: int
    message_id: str | None
    """The id of the message this turn was run for (None: read back without one)."""
    reason: FrozenDict
    """The ``turn/end`` reason: ``{kind: completed}``, ``{kind: max-tokens}``, ..."""
    text: str
    """The text blocks of the turn's last assistant message, joined (never its reasoning)."""
    reasoning: str
    """The reasoning blocks of that message, joined."""
    output: Any
    """The structured output (``run(output_type=...)``), or None."""
    messages: tuple[FrozenDict, ...]
    """The model-facing messages this turn added, in log order."""
    tool_calls: tuple[ToolCallRecord, ...]
    """Every tool call of the turn, in model order."""
    usage: Usage
    """Token counts summed over the turn's model calls; ``requests`` counts the calls."""
    pending_approvals: tuple[ApprovalRequest, ...] = ()
    """Tool calls waiting for a decision (a turn that ended ``awaiting-approval``)."""

    @property
    def kind(self) -> str:
        """The ``turn/end`` reason's kind."""
        return str(self.reason["kind"])


class TurnError(AgentLoopError):
    """A turn awaited through ``Agent.run`` did not end well; ``result`` is its ``TurnResult``."""

    code = "TURN_ERROR"

    def __init__(
        self, message: str, *, result: TurnResult | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.result = result
        """The turn's ``TurnResult``, built from the log like a successful one (None only when
        no turn ran: the queued message was removed before a turn claimed it)."""


class TurnFailedError(TurnError):
    """The turn ended ``error``; ``code`` is the turn's error code (``HTTP_5XX``, ...)."""

    code = "TURN_FAILED"


class TurnBlockedError(TurnError):
    """The turn ended ``blocked`` (an ``agent/pre-step`` listener rejected it)."""

    code = "TURN_BLOCKED"


class TurnAbortedError(TurnError):
    """The turn ended ``aborted`` by another cause than the caller's own cancellation."""

    code = "TURN_ABORTED"


def _blocks(message: Mapping[str, Any], kind: str) -> str:
    return "".join(b.get("text", "") for b in message.get("content", ()) if b.get("type") == kind)


def _arguments(raw: str) -> Mapping[str, Any] | str:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return raw
    return freeze(value) if isinstance(value, dict) else raw


def _add(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else a + b


def _usage(events: Sequence[Event]) -> Usage:
    requests = input_tokens = output_tokens = 0
    cache_read: int | None = None
    reasoning: int | None = None
    for event in events:
        if event.type == ASSISTANT_ATTEMPT:
            requests += 1
        elif event.type == ASSISTANT_MESSAGE:
            requests += 1
            used = event.data.get("usage")
            if used is not None:
                input_tokens += used.get("input_tokens", 0)
                output_tokens += used.get("output_tokens", 0)
                cache_read = _add(cache_read, used.get("cache_read_tokens"))
                reasoning = _add(reasoning, used.get("reasoning_tokens"))
    return Usage(input_tokens, output_tokens, cache_read, reasoning, requests)


def _tool_calls(events: Sequence[Event]) -> tuple[ToolCallRecord, ...]:
    results = {e.data["message"]["call_id"]: e.data for e in events if e.type == TOOL_RESULT}
    records = []
    for event in events:
        if event.type != TOOL_CALL:
            continue
        data = event.data
        result = results.get(data["call_id"])
        content = error = None
        if result is not None:
            content = _blocks(result["message"], "tool-result")
            if "error" in result:
                error = str(result["error"]["code"])
        records.append(
            ToolCallRecord(
                data["call_id"], data["name"], _arguments(data["arguments"]), content, error
            )
        )
    return tuple(records)


def _visible(event: Event) -> bool:
    message = event.data.get("message")
    return message is not None and not (event.type == SYSTEM_MESSAGE and not message["content"])


def build_result(
    events: Sequence[Event],
    *,
    message_id: str | None = None,
    output: Any = None,
    pending_approvals: Sequence[ApprovalRequest] = (),
) -> TurnResult:
    """Build the result of one turn from its events, ``turn/start`` through ``turn/end``."""
    start, end = events[0], events[-1]
    answers = [e for e in events if e.type == ASSISTANT_MESSAGE]
    last = answers[-1].data["message"] if answers else FrozenDict()
    return TurnResult(
        turn=int(start.data["turn"]),
        message_id=message_id,
        reason=end.data["reason"],
        text=_blocks(last, "text"),
        reasoning=_blocks(last, "reasoning"),
        output=output,
        messages=tuple(
            e.data["message"] for e in events if e.type in SURFACE_TYPES and _visible(e)
        ),
        tool_calls=_tool_calls(events),
        usage=_usage(events),
        pending_approvals=tuple(pending_approvals),
    )


def turn_error(result: TurnResult) -> TurnError | None:
    """The error ``run()`` raises for ``result`` (None when the turn ended well)."""
    reason = result.reason
    kind = reason["kind"]
    if kind == "error":
        error = reason.get("error") or {}
        message = f"turn {result.turn} failed: {error.get('message', '')}"
        return TurnFailedError(message, result=result, code=error.get("code", "TURN_FAILED"))
    if kind == "blocked":
        return TurnBlockedError(f"turn {result.turn} was blocked", result=result)
    if kind == "aborted":
        detail = f" ({reason['message']})" if reason.get("message") else ""
        message = f"turn {result.turn} was aborted: {reason.get('cause')}{detail}"
        return TurnAbortedError(message, result=result)
    return None
