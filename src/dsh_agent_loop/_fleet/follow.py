"""A client's view of one sent message: which turn claimed it, and that turn's result.

See docs/design.md#fleet-clients. ``Follow`` folds a session's events in order, from seq 0 (the
inbox is rebuilt from its splices, as the agent rebuilds it): the message is *queued* once a
splice inserted it, *claimed* when a claim splice (no ``outcome``) removed it inside an open
turn, and *removed* when any other splice took it out (the message was canceled before a turn
ran it). The claiming turn's events, ``turn/start`` through ``turn/end``, make the same
``TurnResult`` that ``agent.run`` returns (``_agent/results.build_result``), with the calls still
waiting for approval when it ended, and the same error (``turn_error``). Structured output is
read back from the turn's first ``final_result`` call that succeeded, structured into the
caller's type with cattrs. All sans-I/O.
"""

from __future__ import annotations

import json
from typing import Any, final

from cattrs.preconf.json import make_converter

from .._agent.approvals import request_of
from .._agent.output import FINAL_RESULT
from .._agent.results import (
    TurnAbortedError,
    TurnFailedError,
    TurnResult,
    build_result,
    turn_error,
)
from .._errors import ApprovalPendingError
from .._session.projections import NEXT_TURN, ApprovalState, InboxProjection
from ..events import INBOX_SPLICED, TOOL_CALL, TOOL_RESULT, TURN_END, TURN_START, Event

__all__ = ["Follow"]

_converter = make_converter()


@final
class Follow:
    """Follows message ``message_id`` through a session's events (see the module docstring)."""

    def __init__(self, message_id: str, output: tuple[Any, bool] | None = None) -> None:
        self.message_id = message_id
        self._output = output
        """(the caller's output type, whether the schema wraps it as ``{"result": ...}``)."""
        self._inbox = InboxProjection()
        self._approvals = ApprovalState()
        self._queued = False
        self._open: int | None = None
        """The open turn's number (``turn/start`` seen, its ``turn/end`` not yet)."""
        self._start_index = 0
        self._events: list[Event] = []
        """The open turn's events, once the message is claimed."""
        self.turn: int | None = None
        """The turn that claimed the message."""
        self.removed = False
        """A splice removed the message before a turn claimed it."""
        self.result: TurnResult | None = None
        """Set once the claiming turn's ``turn/end`` is folded."""

    @property
    def done(self) -> bool:
        """The message can go no further: its turn ended, or it was removed."""
        return self.result is not None or self.removed

    def fold(self, event: Event) -> None:
        """Fold the session's next event."""
        kind = event.type
        if kind == TURN_START:
            self._open = int(event.data["turn"])
            self._events = [event]
            return
        if self._open is not None:
            self._events.append(event)
        if kind in self._approvals.types:
            self._approvals.fold(event)
        if kind == INBOX_SPLICED or kind in InboxProjection.types:
            self._splice(event)
        elif kind == TURN_END:
            if self.turn is not None and self.result is None and self._open == self.turn:
                self.result = self._build(self._events)
            self._open = None

    def _splice(self, event: Event) -> None:
        self._inbox.fold(event)
        if event.type != INBOX_SPLICED or self.turn is not None or self.removed:
            return
        data = event.data
        if not self._queued:
            self._queued = any(m.get("id") == self.message_id for m in data.get("inserted", ()))
            return
        if self._inbox.has_id(self.message_id):
            return
        claimed = "outcome" not in data and data["target"] == NEXT_TURN and self._open is not None
        if claimed:
            self.turn = self._open
        else:
            self.removed = True

    def _build(self, events: list[Event]) -> TurnResult:
        waiting = [request_of(e.data) for e in self._approvals.pending()]
        return build_result(
            events,
            message_id=self.message_id,
            output=self._value(events),
            pending_approvals=waiting,
        )

    def _value(self, events: list[Event]) -> Any:
        if self._output is None:
            return None
        output_type, wrapped = self._output
        failed = {
            e.data["message"]["call_id"]
            for e in events
            if e.type == TOOL_RESULT and "error" in e.data
        }
        for event in events:
            if event.type == TOOL_CALL and event.data["name"] == FINAL_RESULT:
                if event.data["call_id"] in failed:
                    continue
                raw = json.loads(event.data["arguments"] or "{}")
                return _converter.structure(raw["result"] if wrapped else raw, output_type)
        return None

    def refuse_behind_approvals(self, session_id: str) -> None:
        """Raise ``ApprovalPendingError`` when calls folded so far wait for a decision.

        Raises:
            ApprovalPendingError: as ``agent.run`` raises it (nothing is queued).
        """
        waiting = [e.data for e in self._approvals.pending()]
        if waiting:
            listed = ", ".join(f"{d['call_id']} ({d['name']})" for d in waiting)
            raise ApprovalPendingError(
                f"session {session_id!r} has tool calls waiting for approval: {listed}; decide"
                " them (approve/deny) first, or pass wait_for_approvals=True to queue the"
                " message behind them",
                call_ids=tuple(str(d["call_id"]) for d in waiting),
            )

    def outcome(self) -> TurnResult:
        """The result, or the error ``agent.run`` raises for it.

        Raises:
            TurnAbortedError: the message was removed before a turn claimed it, or its turn was
                aborted. TurnFailedError, TurnBlockedError: as ``agent.run``.
        """
        if self.result is None:
            raise TurnAbortedError(
                f"message {self.message_id!r} was removed from the inbox before a turn claimed it",
                result=None,
            )
        error = turn_error(self.result)
        if error is not None:
            raise error
        if self._output is not None and self.result.output is None:
            raise TurnFailedError(
                f"turn {self.result.turn} ended without a valid {FINAL_RESULT} call",
                result=self.result,
                code="NO_STRUCTURED_OUTPUT",
            )
        return self.result
