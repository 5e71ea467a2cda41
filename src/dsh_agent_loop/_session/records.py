"""Builders for the event payloads the turn machine writes, and the runtime's record cache.

Payloads are built frozen, once, from already-frozen parts (the per-step ones with
``from_shape(SHAPE, (values...))``: a tuple and one C call on a shape made once, where
``FrozenDict(k=v)`` runs a Python-level constructor). The small ones that repeat across agents
(``{turn}``, ``{turn, step}``, the ``stream`` and ``usage`` fields of an ``assistant/message``)
are shared through a ``RecordCache``: the agents of one runtime are at the same turns and steps,
and each such record would otherwise be one small dict per session. So are whole payloads that
alike agents write once per turn or request change (``turn/end``, ``request/header``,
``request/context``, ``system/message``, an ``agent/inbox/spliced`` that inserts nothing): a
session hands them to ``RecordCache.payload``, which returns the first equal one (the same
JSON). The cache belongs to the runtime that lends it to its agents (never a module global),
and it is bounded.
"""

from __future__ import annotations

from typing import Any, Final, Protocol, final

import msgspec

from .._frozen import FrozenDict, from_shape, frozen, shape
from ..events import INBOX_SPLICED, REQUEST_CONTEXT, REQUEST_HEADER, SYSTEM_MESSAGE, TURN_END

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
    "permission_allowed_data",
    "response_data",
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
#: Distinct ``usage`` records kept.
USAGE_RECORDS_MAX: Final = 4096
#: Distinct payloads of ``SHARED_PAYLOAD_TYPES`` kept (the table starts over when full).
PAYLOAD_RECORDS_MAX: Final = 4096

#: Event types whose payloads the agents of one runtime often write alike, whole: a session
#: appends them through ``RecordCache.payload`` (once per turn or per request change, not per
#: step), so equal ones are one object. ``agent/inbox/spliced`` only when it inserts nothing.
SHARED_PAYLOAD_TYPES: Final = frozenset(
    {TURN_END, REQUEST_HEADER, REQUEST_CONTEXT, SYSTEM_MESSAGE, INBOX_SPLICED}
)

# The exact JSON of a payload: ``1``, ``1.0`` and ``true`` are equal in Python, not in a log.
_encode: Final = msgspec.json.Encoder().encode

# The shapes of the per-step payloads, built once (``from_shape`` then takes a values tuple).
_USAGE = shape(("input_tokens", "output_tokens"))
_TURN = shape(("turn",))
_STEP = shape(("turn", "step"))
_ASSISTANT = shape(("role", "content"))
_MESSAGE = shape(("turn", "step", "message", "stream"))
_MESSAGE_USAGE = shape(("turn", "step", "message", "stream", "usage"))
_TOOL_CALL = shape(("turn", "step", "call_id", "name", "arguments"))
_TOOL_RESULT_BLOCK = shape(("type", "call_id", "name", "text", "is_error"))
_TOOL_MESSAGE = shape(("role", "call_id", "name", "content"))
_TOOL_RESULT = shape(("turn", "step", "message"))


class UsageCounts(Protocol):
    """What ``RecordCache.usage_record`` reads of a model's token usage (``llm.base.Usage``)."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cache_read_tokens(self) -> int | None: ...
    @property
    def reasoning_tokens(self) -> int | None: ...
    def to_data(self) -> dict[str, int]:
        """The JSON form: ``{input_tokens, output_tokens, cache_read_tokens?, ...}``."""
        ...


@final
class RecordCache:
    """Shared frozen payloads of one runtime (each table bounded).

    Positions, ``stream`` and ``usage`` records, and whole payloads of ``SHARED_PAYLOAD_TYPES``.
    """

    __slots__ = ("_payloads", "_positions", "_streams", "_usage")

    def __init__(self) -> None:
        self._positions: dict[tuple[int, int], FrozenDict] = {}
        self._streams: dict[tuple[int, str, str | None], FrozenDict] = {}
        self._usage: dict[tuple[int | None, ...], FrozenDict] = {}
        self._payloads: dict[bytes, FrozenDict] = {}

    def __len__(self) -> int:
        """Records held."""
        return len(self._positions) + len(self._streams) + len(self._usage) + len(self._payloads)

    def payload(self, event_type: str, data: FrozenDict) -> FrozenDict:
        """``data``, or the equal payload an agent of this runtime wrote first (same JSON).

        Only for ``SHARED_PAYLOAD_TYPES``; other payloads come back as they are. Equal means
        the same JSON text, key order and number types included, so what is stored is what
        the caller built. A payload whose text holds ``null`` is not shared: the encoder also
        writes NaN and the infinities so, which the log writes otherwise.
        """
        if event_type not in SHARED_PAYLOAD_TYPES or (
            event_type == INBOX_SPLICED and data.get("inserted")
        ):
            return data
        key = _encode(data)
        if b"null" in key:
            return data
        found = self._payloads.get(key)
        if found is None:
            if len(self._payloads) >= PAYLOAD_RECORDS_MAX:
                self._payloads.clear()
            found = self._payloads[key] = data
        return found

    def usage_record(self, usage: UsageCounts) -> FrozenDict:
        """The ``usage`` field of an ``assistant/message`` (``usage.to_data()``), shared.

        Agents of one runtime running the same script report the same counts step by step.
        """
        key = (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.reasoning_tokens,
        )
        record = self._usage.get(key)
        if record is None:
            if key[2] is None and key[3] is None:
                record = from_shape(_USAGE, key[:2])
            else:
                record = frozen(usage.to_data())
            if len(self._usage) < USAGE_RECORDS_MAX:
                self._usage[key] = record
        return record

    def step_data(self, turn: int, step: int) -> FrozenDict:
        """``{turn, step}``, the data of ``step/start`` and ``step/end``."""
        if turn > SHARED_POSITIONS or step > SHARED_POSITIONS:
            return from_shape(_STEP, (turn, step))
        data = self._positions.get((turn, step))
        if data is None:
            data = self._positions[turn, step] = from_shape(_STEP, (turn, step))
        return data

    def turn_data(self, turn: int) -> FrozenDict:
        """``{turn}``, the data of ``turn/start``."""
        if turn > SHARED_POSITIONS:
            return from_shape(_TURN, (turn,))
        data = self._positions.get((turn, 0))
        if data is None:
            data = self._positions[turn, 0] = from_shape(_TURN, (turn,))
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
    turn: int,
    step: int,
    content: tuple[FrozenDict, ...],
    stream: FrozenDict,
    usage: Any = None,
    response: FrozenDict | None = None,
) -> FrozenDict:
    """``assistant/message`` data: the message, its ``stream`` record and the optional parts.

    ``usage`` when known, and ``response`` (``{model?, id?}``, see ``response_data``) when the
    provider reported it; the scripted model reports neither key of ``response``.
    """
    message = from_shape(_ASSISTANT, ("assistant", content))
    if response is not None:
        data: dict[str, Any] = {"turn": turn, "step": step, "message": message, "stream": stream}
        if usage is not None:
            data["usage"] = usage
        data["response"] = response
        return frozen(data)
    if usage is not None:
        return from_shape(_MESSAGE_USAGE, (turn, step, message, stream, usage))
    return from_shape(_MESSAGE, (turn, step, message, stream))


def response_data(model: str | None, response_id: str | None) -> FrozenDict | None:
    """The ``response`` field of an ``assistant/message``: ``{model?, id?}``.

    The model that answered and the provider's id of the response, as the provider reported
    them; None when it reported neither (the field is then left out).
    """
    if model is None:
        return None if response_id is None else FrozenDict(id=response_id)
    if response_id is None:
        return FrozenDict(model=model)
    return FrozenDict(model=model, id=response_id)


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
    keys, values = block._k, block._v  # (read in place: the hot path)
    i = keys.get("arguments")
    arguments = "" if i is None else values[i]
    return from_shape(
        _TOOL_CALL, (turn, step, values[keys["call_id"]], values[keys["name"]], arguments)
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
    keys, values = block._k, block._v  # (read in place: the hot path)
    call_id, name = values[keys["call_id"]], values[keys["name"]]
    result = from_shape(_TOOL_RESULT_BLOCK, ("tool-result", call_id, name, text, error is not None))
    message = from_shape(_TOOL_MESSAGE, ("tool", call_id, name, (result,)))
    if error is None and meta is None:
        return from_shape(_TOOL_RESULT, (turn, step, message))
    data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
    if error is not None:
        data["error"] = frozen({"name": error[0], "code": error[1]})
    if meta is not None:
        data["meta"] = meta
    return frozen(data)


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


def permission_allowed_data(rule: str, call_id: str | None = None) -> FrozenDict:
    """``permissions/allowed`` data: ``{rule, call_id?}`` (the call whose approval granted it)."""
    if call_id is None:
        return FrozenDict(rule=rule)
    return FrozenDict(rule=rule, call_id=call_id)
