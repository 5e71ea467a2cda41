"""Builders for the event payloads the turn machine writes, and the runtime's record cache.

Payloads are built frozen, once, from already-frozen parts. The small ones that repeat across
agents (``{turn}``, ``{turn, step}``, the ``stream`` field of an ``assistant/message``) are
shared through a ``RecordCache``: the agents of one runtime are at the same turns and steps,
and each such record would otherwise be one small dict per session. The cache belongs to the
runtime that lends it to its agents (never a module global), and it is bounded.
"""

from __future__ import annotations

from typing import Any, Final, final

from .._frozen import FrozenDict

__all__ = [
    "BLOCKED",
    "COMPLETED",
    "MAX_TOKENS",
    "RecordCache",
    "abandoned_attempt_data",
    "approval_data",
    "approval_requested_data",
    "assistant_message_data",
    "attempt_failure_data",
    "interrupted_message_data",
    "tool_call_data",
    "tool_result_data",
]

# turn/end reasons without details are shared (frozen): one copy for every session.
COMPLETED: Final = FrozenDict(kind="completed")
MAX_TOKENS: Final = FrozenDict(kind="max-tokens")
BLOCKED: Final = FrozenDict(kind="blocked")

#: Turn and step numbers up to this share their position records.
SHARED_POSITIONS: Final = 64
#: Distinct ``stream`` records kept.
STREAM_RECORDS_MAX: Final = 256


@final
class RecordCache:
    """Shared frozen payloads of one runtime: positions and ``stream`` records (bounded)."""

    __slots__ = ("_positions", "_streams")

    def __init__(self) -> None:
        self._positions: dict[tuple[int, int], FrozenDict] = {}
        self._streams: dict[tuple[int, str, str | None], FrozenDict] = {}

    def __len__(self) -> int:
        """Records held."""
        return len(self._positions) + len(self._streams)

    def step_data(self, turn: int, step: int) -> FrozenDict:
        """``{turn, step}``, the data of ``step/start`` and ``step/end``."""
        if turn > SHARED_POSITIONS or step > SHARED_POSITIONS:
            return FrozenDict(turn=turn, step=step)
        data = self._positions.get((turn, step))
        if data is None:
            data = self._positions[turn, step] = FrozenDict(turn=turn, step=step)
        return data

    def turn_data(self, turn: int) -> FrozenDict:
        """``{turn}``, the data of ``turn/start``."""
        if turn > SHARED_POSITIONS:
            return FrozenDict(turn=turn)
        data = self._positions.get((turn, 0))
        if data is None:
            data = self._positions[turn, 0] = FrozenDict(turn=turn)
        return data

    def stream_record(self, attempt: int, finish: str, stop_reason: str | None) -> FrozenDict:
        """The ``stream`` field of an ``assistant/message``: ``{attempt, finish, stop_reason?}``."""
        key = (attempt, finish, stop_reason)
        record = self._streams.get(key)
        if record is None:
            data: dict[str, Any] = {"attempt": attempt, "finish": finish}
            if stop_reason is not None:
                data["stop_reason"] = stop_reason
            record = FrozenDict(data)
            if len(self._streams) < STREAM_RECORDS_MAX:
                self._streams[key] = record
        return record


def assistant_message_data(
    turn: int, step: int, content: tuple[FrozenDict, ...], stream: FrozenDict, usage: Any = None
) -> FrozenDict:
    """``assistant/message`` data: the message, its ``stream`` record and ``usage`` if known."""
    message = FrozenDict(role="assistant", content=content)
    if usage is not None:
        return FrozenDict(turn=turn, step=step, message=message, stream=stream, usage=usage)
    return FrozenDict(turn=turn, step=step, message=message, stream=stream)


def interrupted_message_data(
    turn: int, step: int, attempt: int, content: tuple[FrozenDict, ...]
) -> FrozenDict:
    """The interrupted ``assistant/message`` of a cancelled stream: the delivered prefix."""
    return FrozenDict(
        turn=turn,
        step=step,
        message=FrozenDict(role="assistant", content=content),
        stream=FrozenDict(attempt=attempt, finish="aborted"),
        interrupted=True,
    )


def attempt_failure_data(turn: int, step: int, attempt: int, failure: FrozenDict) -> FrozenDict:
    """``assistant/attempt`` data of an attempt that obtained no stream (or delivered nothing)."""
    return FrozenDict(turn=turn, step=step, stream=FrozenDict(attempt=attempt), failure=failure)


def abandoned_attempt_data(
    turn: int, step: int, attempt: int, text: str, reasoning: str, failure: FrozenDict
) -> FrozenDict:
    """``assistant/attempt`` data of a failed stream: what it delivered, and why it failed."""
    stream: dict[str, Any] = {"attempt": attempt}
    if text:
        stream["text"] = text
    if reasoning:
        stream["reasoning"] = reasoning
    return FrozenDict(turn=turn, step=step, stream=FrozenDict(stream), failure=failure)


def tool_call_data(turn: int, step: int, block: FrozenDict) -> FrozenDict:
    """``tool/call`` data for a model tool-call block."""
    return FrozenDict(
        turn=turn,
        step=step,
        call_id=block["call_id"],
        name=block["name"],
        arguments=block.get("arguments", ""),
    )


def tool_result_data(
    turn: int,
    step: int,
    block: FrozenDict,
    text: str,
    *,
    error: tuple[str, str] | None = None,
    meta: Any = None,
) -> FrozenDict:
    """``tool/result`` data: the model-facing tool message, plus ``error: {name, code}``."""
    call_id, name = block["call_id"], block["name"]
    result = FrozenDict(
        type="tool-result", call_id=call_id, name=name, text=text, is_error=error is not None
    )
    message = FrozenDict(role="tool", call_id=call_id, name=name, content=(result,))
    data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
    if error is not None:
        data["error"] = FrozenDict(name=error[0], code=error[1])
    if meta is not None:
        data["meta"] = meta
    return FrozenDict(data)


def approval_requested_data(
    turn: int, step: int, call_id: str, name: str, arguments: FrozenDict
) -> FrozenDict:
    """``tool/approval-requested`` data: the deferred call and its parsed arguments."""
    return FrozenDict(turn=turn, step=step, call_id=call_id, name=name, arguments=arguments)


def approval_data(
    call_id: str, approved: bool, message: str | None = None, cause: str | None = None
) -> FrozenDict:
    """``tool/approval`` data: ``{call_id, decision: approve|deny, message?, cause?}``.

    ``cause`` marks a denial made by ``cancel()``: the continuation then ends ``aborted``.
    """
    data: dict[str, Any] = {"call_id": call_id, "decision": "approve" if approved else "deny"}
    if message is not None:
        data["message"] = message
    if cause is not None:
        data["cause"] = cause
    return FrozenDict(data)
