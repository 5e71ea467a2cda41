"""The event vocabulary: the ``Event`` record, every event type name, and its JSON form.

Durable types are what a session log may hold; a reader refuses any other type unless the
event is marked ``ignorable``. Notifications are ``Event``s with ``seq=None`` that are
published live and never stored. Every type name is defined here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

from msgspec import Struct, StructMeta

from ._frozen import FrozenDict, freeze, json_default

__all__ = [
    "DURABLE_TYPES",
    "SURFACE_TYPES",
    "Event",
    "event_from_dict",
    "event_from_json",
    "event_to_dict",
    "event_to_json",
]

# --- durable event types (docs/design.md#durable-types) -------------------------------------
TURN_START: Final = "turn/start"
TURN_END: Final = "turn/end"
STEP_START: Final = "step/start"
STEP_END: Final = "step/end"
SYSTEM_MESSAGE: Final = "system/message"
USER_MESSAGE: Final = "user/message"
ASSISTANT_MESSAGE: Final = "assistant/message"
ASSISTANT_ATTEMPT: Final = "assistant/attempt"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
TOOL_APPROVAL_REQUESTED: Final = "tool/approval-requested"
TOOL_APPROVAL: Final = "tool/approval"
REQUEST_HEADER: Final = "request/header"
REQUEST_CONTEXT: Final = "request/context"
INBOX_SPLICED: Final = "agent/inbox/spliced"
SESSION_END_SEED: Final = "session/end-seed"
PERMISSIONS_ALLOWED: Final = "permissions/allowed"
CONTEXT_COMPACTION: Final = "context/compaction"

DURABLE_TYPES: Final = frozenset(
    {
        TURN_START,
        TURN_END,
        STEP_START,
        STEP_END,
        SYSTEM_MESSAGE,
        USER_MESSAGE,
        ASSISTANT_MESSAGE,
        ASSISTANT_ATTEMPT,
        TOOL_CALL,
        TOOL_RESULT,
        TOOL_APPROVAL_REQUESTED,
        TOOL_APPROVAL,
        REQUEST_HEADER,
        REQUEST_CONTEXT,
        INBOX_SPLICED,
        SESSION_END_SEED,
        PERMISSIONS_ALLOWED,
        CONTEXT_COMPACTION,
    }
)
#: Types that may carry a ``surface_op`` (they are the model-facing surface).
SURFACE_TYPES: Final = frozenset({SYSTEM_MESSAGE, USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})

# --- live notifications (never stored) ------------------------------------------------------
SESSION_CREATED: Final = "session/created"
SESSION_EVENT: Final = "session/event"
SESSION_FLUSH: Final = "session/flush"
SESSION_DISPOSED: Final = "session/disposed"
AGENT_CREATED: Final = "agent/created"
AGENT_DISPOSED: Final = "agent/disposed"
AGENT_SESSION_START: Final = "agent/session-start"
AGENT_STATUS: Final = "agent/status"
AGENT_ERROR: Final = "agent/error"
INBOX_INSERTED: Final = "agent/inbox/inserted"
INBOX_CLAIMED: Final = "agent/inbox/claimed"
INBOX_DISCARDED: Final = "agent/inbox/discarded"
ASSISTANT_STREAM: Final = "agent/assistant-stream"
ATTEMPT_START: Final = "agent/attempt-start"
CONTEXT_COMPACTED: Final = "context/compacted"
CONFIG_START_FAILED: Final = "agent-loop/config-start-failed"

# --- hook names -----------------------------------------------------------------------------
HOOK_PRE_STEP: Final = "agent/pre-step"
HOOK_REQUEST: Final = "agent/request"
HOOK_REQUEST_ERROR: Final = "agent/request-error"
HOOK_TURN_STOPPING: Final = "agent/turn-stopping"
HOOK_ASSEMBLE: Final = "system-prompt/assemble"
HOOK_RUNTIME_CONTEXT: Final = "runtime-context/collect"
HOOK_TOOLS_PRE_EXECUTE: Final = "tools/pre-execute"
HOOK_TOOLS_EXECUTE: Final = "tools/execute"
HOOK_TOOLS_POST_EXECUTE: Final = "tools/post-execute"
HOOK_TOOLS_RESULT: Final = "tools/result"


def _freeze_data(value: Mapping[str, Any]) -> FrozenDict:
    frozen = freeze(value)
    if type(frozen) is not FrozenDict:
        raise TypeError("event data must be a mapping")
    return frozen


def _freeze_surface_op(value: Any) -> Any:
    if value is None or value == "append":
        return value
    return freeze(value)


def _freeze_seqs(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


class _EventMeta(StructMeta):
    """``Event(...)`` freezes its parts (``data``, ``surface_op``, ``source_event_seqs``)."""

    def __call__(
        cls,
        type: str,
        seq: int | None,
        time: float,
        data: Mapping[str, Any],
        ignorable: bool = False,
        surface_op: Any = None,
        source_event_seqs: Iterable[int] | None = None,
    ) -> Any:
        return _new_event(
            type,
            seq,
            time,
            _freeze_data(data),
            ignorable,
            _freeze_surface_op(surface_op),
            _freeze_seqs(source_event_seqs),
        )


@final
class Event(Struct, frozen=True, gc=False, metaclass=_EventMeta):
    """One fact in a session log, or (with ``seq=None``) a live notification.

    Immutable and not tracked by the garbage collector (a ``msgspec.Struct`` declared
    ``gc=False``): it holds only frozen JSON, which cannot form a reference cycle, and a
    process holds millions of events. Compared field by field; hashable.
    """

    type: str
    """The event type, for example ``"turn/start"``."""
    seq: int | None
    """Position in the session log, dense from 0; ``None`` before append and for notifications."""
    time: float
    """When it was appended, from the runtime's clock."""
    data: FrozenDict
    """The payload: a deep-frozen, JSON-compatible mapping."""
    ignorable: bool = False
    """Readers that do not know ``type`` may skip this event instead of refusing the log."""
    surface_op: Any = None
    """``None``, ``"append"`` or ``{"op": "replace", "start_seq", "end_seq"}``."""
    source_event_seqs: tuple[int, ...] | None = None
    """Seqs of the events this one cites (a ``tool/result`` cites its ``tool/call``)."""

    if TYPE_CHECKING:  # what ``_EventMeta.__call__`` accepts (it freezes the parts)

        def __init__(
            self,
            type: str,
            seq: int | None,
            time: float,
            data: Mapping[str, Any],
            ignorable: bool = False,
            surface_op: Any = None,
            source_event_seqs: Iterable[int] | None = None,
        ) -> None: ...

    def with_seq(self, seq: int, time: float | None = None) -> Event:
        """Return a copy at ``seq`` (and ``time`` when given), skipping re-validation."""
        return _new_event(
            self.type,
            seq,
            self.time if time is None else time,
            self.data,
            self.ignorable,
            self.surface_op,
            self.source_event_seqs,
        )


EVENT_FIELDS: Final = Event.__struct_fields__
"""The field names of ``Event``, in order."""

_new_event: Final[Callable[..., Event]] = StructMeta.__call__.__get__(Event)
"""Builds an ``Event`` from frozen parts in field order, in one C call (no converters)."""


def make_event(
    type: str,
    seq: int | None,
    time: float,
    data: FrozenDict,
    surface_op: Any = None,
    source_event_seqs: tuple[int, ...] | None = None,
    ignorable: bool = False,
) -> Event:
    """Build an ``Event`` from already-frozen parts without re-freezing (the hot path)."""
    return _new_event(type, seq, time, data, ignorable, surface_op, source_event_seqs)


def event_to_dict(e: Event) -> dict[str, Any]:
    """The JSON object of ``e`` (what the converter unstructures an ``Event`` to)."""
    out: dict[str, Any] = {"type": e.type, "seq": e.seq, "time": e.time, "data": e.data}
    if e.ignorable:
        out["ignorable"] = True
    if e.surface_op is not None:
        out["surface_op"] = e.surface_op
    if e.source_event_seqs is not None:
        out["source_event_seqs"] = list(e.source_event_seqs)
    return out


def event_from_dict(obj: Any) -> Event:
    """The ``Event`` of a JSON object (what the converter structures an ``Event`` from).

    Raises:
        TypeError: ``obj`` is not a mapping.
        KeyError: it has no ``type``.
    """
    if not isinstance(obj, Mapping):
        raise TypeError("an event must be a JSON object")
    return Event(
        type=str(obj["type"]),
        seq=obj.get("seq"),
        time=float(obj.get("time", 0.0)),
        data=obj.get("data", {}),
        ignorable=bool(obj.get("ignorable", False)),
        surface_op=obj.get("surface_op"),
        source_event_seqs=obj.get("source_event_seqs"),
    )


def event_to_json(event: Event) -> str:
    """Serialise ``event`` as one line of compact JSON (the stores' and export format)."""
    return json.dumps(
        event_to_dict(event), ensure_ascii=False, separators=(",", ":"), default=json_default
    )


def event_from_json(text: str | bytes) -> Event:
    """Parse one event from its JSON form.

    Raises:
        ValueError: the text is not a JSON event.
    """
    try:
        return event_from_dict(json.loads(text))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a JSON event: {exc}") from exc
