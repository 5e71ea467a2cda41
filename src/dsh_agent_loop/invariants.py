"""``invariants.check(events)``: is a session log well formed? Rebuilds every request from the log.

It reports, as ``Violation`` records (an empty list means well formed):

- ``seq``: seqs not dense from 0;
- ``unknown-type``: a type that is neither durable nor marked ignorable;
- ``surface-op``: a ``surface_op`` on a non-surface type, a replace naming events not on the
  surface, or a replace by a non-system message that shadows node 0 (the head system message;
  compaction never does);
- ``turn``: a turn started while another is open, a ``turn/end`` without a turn, a turn without an
  end (except the last, open one);
- ``step``: a step started while one is open or outside a turn, a ``step/end`` without a step, a
  turn ended with a step open;
- ``tool-call`` / ``tool-result``: a model tool call without exactly one ``tool/call`` and one
  ``tool/result`` in its turn (a trailing open turn may still have calls in flight), a result whose
  ``source_event_seqs`` does not cite a ``tool/call`` of the same id, a duplicate result;
- ``approval``: a ``tool/approval-requested`` for a call without its ``tool/call``, a
  ``tool/approval`` that decides no pending call (or decides one twice). A call deferred for
  approval may go without a result while its turn ended ``awaiting-approval`` and until the next
  turn (its continuation), which must give it one;
- ``permission``: a ``permissions/allowed`` whose ``rule`` is not a rule that parses
  (``_permission_rules.py``);
- ``compaction``: a ``context/compaction`` record whose ``summary_seq`` is not the compaction
  summary (a ``user/message`` with ``source: compaction``) replacing its ``start_seq..end_seq``;
- ``request``: at a request point (each ``assistant/message`` / ``assistant/attempt``) the derived
  history is not a valid provider request — an assistant tool call not answered by tool results
  before the next user or assistant message, or a tool message without a preceding call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from types import MappingProxyType
from typing import Final, final

import attrs

from ._permission_rules import rule_problem
from ._session.history import SurfaceProjection
from .events import (
    DURABLE_TYPES,
    SURFACE_TYPES,
    SYSTEM_MESSAGE,
    Event,
)

__all__ = ["Violation", "check", "check_messages"]


@final
@attrs.frozen
class Violation:
    """One problem found in a log."""

    kind: str
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"seq {self.seq}: " if self.seq is not None else ""
        return f"{self.kind}: {where}{self.message}"


def check_messages(messages: Sequence[object]) -> list[str]:
    """Problems that would make ``messages`` an invalid provider request."""
    scan = _RequestScan()
    scan.extend(messages, 0)
    return list(scan.problems)


class _RequestScan:
    """``check_messages`` as a left fold, so a growing history is checked once per message.

    Derived history is append-only between surface replacements: the problems of a prefix never
    change, so a request point only scans the messages added since the last one (and reports
    the prefix's problems again, as a from-scratch check of the whole history would).
    """

    __slots__ = ("checked", "generation", "outstanding", "problems")

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        self.checked = 0
        """Messages folded so far."""
        self.outstanding: dict[str, int] = {}  # call_id -> index of its assistant message
        self.problems: list[str] = []

    def extend(self, messages: Sequence[object], start: int) -> None:
        """Fold ``messages[start:]`` (``start`` is the number already folded)."""
        problems, outstanding = self.problems, self.outstanding
        for i, message in enumerate(islice(messages, start, None), start):
            role = message["role"]  # type: ignore[index]
            if role == "tool":
                call_id = message["call_id"]  # type: ignore[index]
                if call_id not in outstanding:
                    problems.append(
                        f"message {i}: tool result {call_id!r} follows no open tool call"
                    )
                outstanding.pop(call_id, None)
                continue
            if role in ("user", "assistant") and outstanding:
                ids = ", ".join(sorted(outstanding))
                problems.append(f"message {i}: {role} message before the results of {ids}")
                outstanding.clear()
            if role == "assistant":
                for block in message["content"]:  # type: ignore[index]
                    if block["type"] == "tool-call":
                        outstanding[block["call_id"]] = i
        self.checked = len(messages)


class _Checker:
    def __init__(self) -> None:
        self.out: list[Violation] = []
        self.surface = SurfaceProjection()
        self.turn: int | None = None
        self.turn_seq: int | None = None
        self.step_open = False
        self.expected: dict[str, int] = {}  # call_id -> seq of its assistant message
        self.calls: dict[str, int] = {}  # call_id -> seq of its tool/call
        self.results: set[str] = set()
        self.requested: set[str] = set()  # calls deferred for approval in this turn
        self.carried: dict[str, int] = {}  # pending calls -> seq of their tool/call
        self.decided: set[str] = set()
        self.requests = _RequestScan()
        self.summaries: dict[int, tuple[object, object]] = {}  # summary seq -> replaced range

    def add(self, kind: str, seq: int | None, message: str) -> None:
        self.out.append(Violation(kind, seq, message))

    def event(self, i: int, event: Event) -> None:
        seq, t = event.seq, event.type
        if seq != i:
            self.add("seq", seq, f"expected seq {i}")
        try:
            handler, surface = _KINDS[t]
        except KeyError:  # every durable type is in the table: this one is not durable
            if not event.ignorable:
                self.add("unknown-type", seq, f"unknown event type {t!r}")
            return
        op = event.surface_op
        if op is not None and not surface:
            self.add("surface-op", seq, f"surface_op on {t}")
        handler(self, event)
        if surface:
            if op is not None and op != "append" and t != SYSTEM_MESSAGE:
                self._node_0(event)
            try:
                self.surface.fold(event)
            except ValueError as exc:
                self.add("surface-op", seq, str(exc))

    def _node_0(self, event: Event) -> None:
        """A replacement by a user/assistant/tool message must leave node 0 on the surface."""
        nodes = self.surface.system_nodes
        if not nodes:
            return
        try:
            i, j = self.surface.check_replace(event.surface_op)
        except ValueError:
            return  # reported by the fold
        head = next(k for k, e in enumerate(self.surface.entries) if e is nodes[0])
        if i <= head <= j:
            self.add("surface-op", event.seq, "a replacement shadows node 0")

    def _other(self, event: Event) -> None:
        pass

    def _turn_start(self, event: Event) -> None:
        if self.turn is not None:
            self.add(
                "turn",
                event.seq,
                f"turn {event.data.get('turn')} started while turn {self.turn} is open",
            )
            self._close_turn(event.seq)
        self.turn, self.turn_seq = event.data.get("turn"), event.seq

    def _turn_end(self, event: Event) -> None:
        if self.turn is None:
            self.add("turn", event.seq, "turn/end without an open turn")
            return
        if self.step_open:
            self.add("step", event.seq, "turn ended with a step open")
            self.step_open = False
        reason = event.data.get("reason") or {}
        awaiting = reason.get("call_ids", ()) if reason.get("kind") == "awaiting-approval" else ()
        self._close_turn(event.seq, awaiting)

    def _close_turn(self, seq: int | None, awaiting: Sequence[str] = ()) -> None:
        for call_id in self.carried:
            self.add("tool-call", seq, f"deferred tool call {call_id!r} has no tool/result")
        self.carried = {}
        self.decided.clear()
        for call_id, at in self.expected.items():
            if call_id not in self.calls:
                self.add("tool-call", at, f"tool call {call_id!r} has no tool/call")
            if call_id in self.results:
                continue
            if call_id in awaiting and call_id in self.requested and call_id in self.calls:
                self.carried[call_id] = self.calls[call_id]  # pending: its continuation answers
            else:
                self.add("tool-call", at, f"tool call {call_id!r} has no tool/result")
        self.expected.clear()
        self.calls.clear()
        self.results.clear()
        self.requested.clear()
        self.turn = None

    def _step_start(self, event: Event) -> None:
        if self.turn is None:
            self.add("step", event.seq, "step/start outside a turn")
        if self.step_open:
            self.add("step", event.seq, "step/start while a step is open")
        self.step_open = True

    def _step_end(self, event: Event) -> None:
        if not self.step_open:
            self.add("step", event.seq, "step/end without an open step")
        self.step_open = False

    def _assistant_message(self, event: Event) -> None:
        self._request_point(event)
        expected = self.expected
        for block in event.data["message"]["content"]:
            if block["type"] == "tool-call":
                call_id = block["call_id"]
                if call_id in expected:
                    self.add("tool-call", event.seq, f"tool call id {call_id!r} reused in a turn")
                expected[call_id] = event.seq  # type: ignore[assignment]

    def _assistant_attempt(self, event: Event) -> None:
        self._request_point(event)

    def _request_point(self, event: Event) -> None:
        messages = self.surface.messages()
        scan = self.requests
        if scan.generation != self.surface.generation or scan.checked > len(messages):
            scan = self.requests = _RequestScan(self.surface.generation)  # history was replaced
        scan.extend(messages, scan.checked)
        for problem in scan.problems:
            self.add("request", event.seq, problem)

    def _tool_call(self, event: Event) -> None:
        call_id = event.data.get("call_id")
        if call_id not in self.expected:
            self.add(
                "tool-call",
                event.seq,
                f"tool/call {call_id!r} matches no model tool call in this turn",
            )
        if call_id in self.calls:
            self.add("tool-call", event.seq, f"second tool/call for {call_id!r}")
        self.calls[str(call_id)] = int(event.seq or 0)

    def _tool_approval_requested(self, event: Event) -> None:
        call_id = event.data.get("call_id")
        if call_id not in self.calls:
            self.add("approval", event.seq, f"approval requested for {call_id!r} before its call")
        self.requested.add(str(call_id))

    def _tool_approval(self, event: Event) -> None:
        call_id = str(event.data.get("call_id"))
        if call_id not in self.carried or call_id in self.decided:
            self.add("approval", event.seq, f"tool/approval {call_id!r} decides no pending call")
        self.decided.add(call_id)

    def _permissions_allowed(self, event: Event) -> None:
        problem = rule_problem(event.data.get("rule"))
        if problem is not None:
            self.add("permission", event.seq, problem)

    def _user_message(self, event: Event) -> None:
        op = event.surface_op
        message = event.data.get("message")
        compaction = isinstance(message, Mapping) and message.get("source") == "compaction"
        if compaction and isinstance(op, Mapping):
            self.summaries[int(event.seq or 0)] = (op.get("start_seq"), op.get("end_seq"))

    def _context_compaction(self, event: Event) -> None:
        data = event.data
        at = data.get("summary_seq")
        if at is None:
            return  # a summary call that failed: nothing was replaced
        if self.summaries.get(at) != (data.get("start_seq"), data.get("end_seq")):
            self.add(
                "compaction",
                event.seq,
                f"context/compaction names no compaction summary at seq {at} replacing "
                f"{data.get('start_seq')}..{data.get('end_seq')}",
            )

    def _tool_result(self, event: Event) -> None:
        call_id = event.data["message"].get("call_id")
        cites = event.source_event_seqs or ()
        if call_id in self.carried:  # a deferred call answered by its continuation
            if self.carried.pop(call_id) not in cites:
                self.add(
                    "tool-result", event.seq, f"tool/result {call_id!r} does not cite its call"
                )
            self.results.add(call_id)
            return
        if call_id not in self.calls or self.calls[call_id] not in cites:
            self.add(
                "tool-result", event.seq, f"tool/result {call_id!r} does not cite its tool/call"
            )
        if call_id in self.results:
            self.add("tool-result", event.seq, f"second tool/result for {call_id!r}")
        self.results.add(call_id)

    def finish(self, open_turn_allowed: bool = True) -> list[Violation]:
        if self.turn is not None and not open_turn_allowed:
            self.add("turn", self.turn_seq, f"turn {self.turn} has no turn/end")
        return self.out


def _kind(event_type: str) -> tuple[Callable[[_Checker, Event], None], bool]:
    name = "_" + event_type.replace("/", "_").replace("-", "_")
    return getattr(_Checker, name, _Checker._other), event_type in SURFACE_TYPES


#: Per durable event type: its ``_Checker`` handler and whether it is a surface type. Built at
#: import and read-only: no state is kept between checks, and a type that is not durable is
#: never added (a log full of made-up types cannot grow it).
_KINDS: Final[Mapping[str, tuple[Callable[[_Checker, Event], None], bool]]] = MappingProxyType(
    {event_type: _kind(event_type) for event_type in DURABLE_TYPES}
)


def check(events: Sequence[Event], *, allow_open_turn: bool = True) -> list[Violation]:
    """Check a session log; returns the violations (empty when well formed).

    Args:
        events: The log, in seq order.
        allow_open_turn: Whether the last turn may still be open (a live session).
    """
    checker = _Checker()
    for i, event in enumerate(events):
        checker.event(i, event)
    return checker.finish(allow_open_turn)
