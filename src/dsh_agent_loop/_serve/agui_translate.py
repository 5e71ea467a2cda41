"""A session's log as the AG-UI events of one run: sans-I/O translation for ``POST /agui``.

See docs/design.md#ag-ui. A run streams one turn of its session, the turn it *claims*: for a run
that sent a message, the turn that claimed that message (``Follow`` finds it, folding the
session's events from seq 0); for a run that resumed interrupts, the *continuation*: the first
turn to start once every call the run decided has its ``tool/approval`` logged after the point
the decisions were checked against (``Continuation``). Events before the claim are folded for
what the run needs to know (the calls waiting, the names and arguments of calls without a result)
and say nothing. The claimed turn's events become, in order:

- ``RUN_STARTED`` first; ``step/start``/``step/end`` → ``STEP_STARTED``/``STEP_FINISHED``;
- each ``assistant/message`` block in order: reasoning → ``REASONING_START``, the reasoning
  message's start, content and end, ``REASONING_END``; text → ``TEXT_MESSAGE_START`` (assistant),
  content, end; tool call → ``TOOL_CALL_START``, ``TOOL_CALL_ARGS`` (the raw arguments),
  ``TOOL_CALL_END``; empty text and reasoning blocks say nothing (an empty content delta is a
  conformance warning);
- ``tool/result`` → ``TOOL_CALL_RESULT`` (a result whose call was made in an earlier run, as an
  approved or denied call's in a continuation, is announced first, so no result names an unknown
  call);
- the turn's ``turn/end``, last: ``completed``/``max-tokens`` → ``RUN_FINISHED`` success;
  ``awaiting-approval`` → ``RUN_FINISHED`` with an interrupt per waiting call (interrupt id = call
  id); ``aborted`` (or the message removed before a turn claimed it) → ``RUN_FINISHED``
  cancelled; ``error`` → ``RUN_ERROR`` with the turn's error code; ``blocked``/``interrupted`` →
  ``RUN_ERROR`` ``TURN_BLOCKED``/``TURN_INTERRUPTED``. Steps still open are finished before it.

Ids are stable, so a replay says the same thing: a block's message is ``{session}:{seq}:{index}``
(its reasoning span adds ``:span``), a tool result's ``{session}:{seq}``, a tool call's
``parentMessageId`` the message's last text block (else ``{session}:{seq}``). Token usage counts
the claimed turn's model calls only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol, final

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from .._fleet.follow import Follow
from .._session.projections import ApprovalState
from ..events import (
    ASSISTANT_MESSAGE,
    REQUEST_CONTEXT,
    STEP_END,
    STEP_START,
    TOOL_APPROVAL,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Event,
)

__all__ = ["Continuation", "RunTranslator", "agui_message_id", "translate_run"]

#: Calls remembered (without a result yet) for their arguments and names; oldest dropped first.
MAX_OPEN_CALLS: Final = 10_000
#: Why the run ended in error, for the turn ends that carry no error of their own.
_END_ERRORS: Final = {
    "blocked": ("TURN_BLOCKED", "agent/pre-step rejected its step"),
    "interrupted": ("TURN_INTERRUPTED", "its worker stopped; crash repair closed it"),
}


class Claim(Protocol):
    """Which turn a run streams, found by folding the session's events in order."""

    @property
    def turn(self) -> int | None:
        """The claimed turn's number, once its ``turn/start`` was folded."""

    @property
    def removed(self) -> bool:
        """No turn will claim it (a sent message was removed from the inbox)."""

    def fold(self, event: Event) -> None:
        """Fold the session's next event."""


@final
class Continuation:
    """The continuation turn of decisions on ``call_ids`` checked against the log to ``after_seq``.

    Only events after ``after_seq`` count: the calls were waiting there, so each one's decision
    (``tool/approval``, whoever made it) comes later, and the first ``turn/start`` once all are
    decided is their continuation (the agent starts no other turn while calls wait). Bounding by
    seq keeps an earlier decision on a call id used again (a restarted scripted model) out.
    """

    def __init__(self, call_ids: Iterable[str], after_seq: int) -> None:
        self.after_seq = after_seq
        self.undecided = set(call_ids)
        self.turn: int | None = None
        self.removed = False

    def fold(self, event: Event) -> None:
        """Fold the session's next event."""
        if self.turn is not None or event.seq is None or event.seq <= self.after_seq:
            return
        if event.type == TOOL_APPROVAL:
            self.undecided.discard(str(event.data["call_id"]))
        elif event.type == TURN_START and not self.undecided:
            self.turn = int(event.data["turn"])


def agui_message_id(run_id: str) -> str:
    """The id of the message a run sends: the same for every POST of one ``runId``."""
    return f"agui-{run_id}"


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@final
class RunTranslator:
    """A run's AG-UI events from its session's log events, fed in order from seq 0.

    ``claim`` is the id of the message the run sent, or the ``Continuation`` it resumed.
    ``start()`` gives ``RUN_STARTED``; ``feed(event)`` folds the next log event and gives the
    AG-UI events it makes (none until the claimed turn starts); ``done`` once the run's terminal
    event was given. Sans-I/O (module docstring).
    """

    def __init__(self, thread_id: str, run_id: str, claim: str | Continuation) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.claim: Claim = Follow(claim) if isinstance(claim, str) else claim
        self.done = False
        """The terminal event (``RUN_FINISHED`` or ``RUN_ERROR``) was given."""
        self._backlog: list[Event] = []
        """The open turn's events, until it is claimed."""
        self._approvals = ApprovalState()
        """The session's calls waiting for a decision."""
        self._calls: dict[str, tuple[str, str]] = {}
        """Tool calls of the session without a result when a turn ended: id → name, arguments."""
        self._answered: list[str] = []
        self._route: tuple[str | None, str | None] = (None, None)
        """(provider, model) of the latest ``request/context``."""
        self._usage: dict[tuple[str | None, str | None], list[int]] = {}
        self._steps: list[str] = []
        self._announced: set[str] = set()
        """Tool call ids this run started."""

    def start(self, now: float | None = None, parent_run_id: str | None = None) -> list[BaseEvent]:
        """``RUN_STARTED`` (stamped ``now``, epoch seconds, when given)."""
        return [
            RunStartedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                parent_run_id=parent_run_id,
                protocol_version=PROTOCOL_VERSION,
                timestamp=None if now is None else _ms(now),
            )
        ]

    def feed(self, event: Event) -> list[BaseEvent]:
        """Fold the session's next log event; the AG-UI events it makes."""
        if self.done:
            return []
        self._track(event)
        claimed_before = self.claim.turn is not None
        if not claimed_before and event.type == TURN_START:
            self._backlog = []  # a continuation is claimed by its turn/start itself
        self.claim.fold(event)
        if self.claim.turn is None:
            if self.claim.removed:
                return [self._finish(RunFinishedCancelledOutcome(), event.time)]
            self._backlog.append(event)
            return []
        if claimed_before:
            return self._turn_event(event)
        backlog, self._backlog = self._backlog, []
        return [out for each in (*backlog, event) for out in self._turn_event(each)]

    def waiting(self) -> tuple[str, ...]:
        """The calls waiting for a decision in the events fed so far, in model order."""
        return tuple(str(e.data["call_id"]) for e in self._approvals.pending())

    def refuse_behind_approvals(self, now: float | None = None) -> list[BaseEvent]:
        """Finish with the waiting calls' interrupts when a message would wait behind them.

        Only before the run's turn started; ``[]`` when nothing waits (send the message).
        """
        if self.claim.turn is not None:
            return []
        return self.interrupt(self.waiting(), now)

    def interrupt(self, call_ids: Iterable[str], now: float | None = None) -> list[BaseEvent]:
        """End the run with an interrupt per call of ``call_ids`` (``[]`` for none)."""
        outcome = self._interrupts(tuple(call_ids))
        if self.done or not isinstance(outcome, RunFinishedInterruptOutcome):
            return []
        return [*self._close_steps(now), self._finish(outcome, now)]

    def fail(self, code: str, message: str, now: float | None = None) -> list[BaseEvent]:
        """End the run with ``RUN_ERROR`` (the endpoint could not follow the turn)."""
        if self.done:
            return []
        self.done = True
        return [*self._close_steps(now), self._error(code, message, now)]

    # --- the session's state outside the turn ------------------------------------------------

    def _track(self, event: Event) -> None:
        kind, data = event.type, event.data
        if kind in self._approvals.types:
            self._approvals.fold(event)
        if kind == REQUEST_CONTEXT:
            self._route = (data.get("provider"), data.get("model"))
        elif kind == TOOL_CALL:
            self._calls[str(data["call_id"])] = (str(data["name"]), str(data["arguments"] or ""))
            if len(self._calls) > MAX_OPEN_CALLS:
                del self._calls[next(iter(self._calls))]
        elif kind == TOOL_RESULT:
            self._answered.append(str(data["message"]["call_id"]))
        elif kind == TURN_END:
            for call_id in self._answered:
                self._calls.pop(call_id, None)
            self._answered = []

    # --- the claiming turn -------------------------------------------------------------------

    def _turn_event(self, event: Event) -> list[BaseEvent]:
        kind, data, ms = event.type, event.data, _ms(event.time)
        if kind == STEP_START:
            name = f"step-{data['step']}"
            self._steps.append(name)
            return [StepStartedEvent(step_name=name, timestamp=ms)]
        if kind == STEP_END:
            name = f"step-{data['step']}"
            if name not in self._steps:
                return []
            self._steps.remove(name)
            return [StepFinishedEvent(step_name=name, timestamp=ms)]
        if kind == ASSISTANT_MESSAGE:
            self._count(data.get("usage"))
            return self._assistant(event)
        if kind == TOOL_RESULT:
            return self._result(event)
        if kind == TURN_END and data["turn"] == self.claim.turn:
            return self._end(data, event.time)
        return []

    def _assistant(self, event: Event) -> list[BaseEvent]:
        base, ms = f"{self.thread_id}:{event.seq}", _ms(event.time)
        parent = base
        out: list[BaseEvent] = []
        for index, block in enumerate(event.data["message"]["content"]):
            kind, text, mid = block.get("type"), block.get("text") or "", f"{base}:{index}"
            if kind == "text" and text:
                out += [
                    TextMessageStartEvent(message_id=mid, role="assistant", timestamp=ms),
                    TextMessageContentEvent(message_id=mid, delta=text, timestamp=ms),
                    TextMessageEndEvent(message_id=mid, timestamp=ms),
                ]
                parent = mid
            elif kind == "reasoning" and text:
                span = f"{mid}:span"
                out += [
                    ReasoningStartEvent(message_id=span, timestamp=ms),
                    ReasoningMessageStartEvent(message_id=mid, timestamp=ms),
                    ReasoningMessageContentEvent(message_id=mid, delta=text, timestamp=ms),
                    ReasoningMessageEndEvent(message_id=mid, timestamp=ms),
                    ReasoningEndEvent(message_id=span, timestamp=ms),
                ]
            elif kind == "tool-call":
                name, arguments = str(block["name"]), str(block.get("arguments") or "")
                out += self._call(str(block["call_id"]), name, arguments, parent, ms)
        return out

    def _call(
        self, call_id: str, name: str, arguments: str, parent: str | None, ms: int
    ) -> list[BaseEvent]:
        self._announced.add(call_id)
        out: list[BaseEvent] = [
            ToolCallStartEvent(
                tool_call_id=call_id, tool_call_name=name, parent_message_id=parent, timestamp=ms
            )
        ]
        if arguments:
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments, timestamp=ms))
        out.append(ToolCallEndEvent(tool_call_id=call_id, timestamp=ms))
        return out

    def _result(self, event: Event) -> list[BaseEvent]:
        message, ms = event.data["message"], _ms(event.time)
        call_id = str(message["call_id"])
        out: list[BaseEvent] = []
        if call_id not in self._announced:  # made in an earlier run (an approved call)
            name, arguments = self._calls.get(call_id, (str(message.get("name") or "tool"), ""))
            out += self._call(call_id, name, arguments, None, ms)
        text = "\n".join(
            str(block.get("text") or "")
            for block in message.get("content") or ()
            if block.get("type") == "tool-result"
        )
        out.append(
            ToolCallResultEvent(
                message_id=f"{self.thread_id}:{event.seq}",
                tool_call_id=call_id,
                content=text,
                role="tool",
                timestamp=ms,
            )
        )
        return out

    def _end(self, data: Mapping[str, Any], seconds: float) -> list[BaseEvent]:
        reason, turn = data["reason"], data["turn"]
        kind = reason.get("kind")
        closing = self._close_steps(seconds)
        if kind in ("completed", "max-tokens"):
            return [*closing, self._finish(RunFinishedSuccessOutcome(), seconds)]
        if kind == "awaiting-approval":
            outcome = self._interrupts(tuple(reason.get("call_ids") or ()))
            return [*closing, self._finish(outcome, seconds)]
        if kind == "aborted":
            return [*closing, self._finish(RunFinishedCancelledOutcome(), seconds)]
        self.done = True
        if kind == "error":
            error = reason.get("error") or {}
            code = str(error.get("code") or "TURN_FAILED")
            message = str(error.get("message") or f"turn {turn} failed")
            return [*closing, self._error(code, message, seconds)]
        code, why = _END_ERRORS.get(str(kind), ("TURN_ENDED", f"it ended {kind!r}"))
        return [*closing, self._error(code, f"turn {turn} did not complete: {why}", seconds)]

    def _close_steps(self, seconds: float | None) -> list[BaseEvent]:
        ms = None if seconds is None else _ms(seconds)
        closing: list[BaseEvent] = [
            StepFinishedEvent(step_name=name, timestamp=ms) for name in reversed(self._steps)
        ]
        self._steps = []
        return closing

    def _interrupts(
        self, call_ids: tuple[str, ...]
    ) -> RunFinishedInterruptOutcome | RunFinishedSuccessOutcome:
        interrupts = []
        for call_id in call_ids:
            name, arguments = self._calls.get(call_id, ("a tool", ""))
            interrupts.append(
                Interrupt(
                    id=call_id,
                    reason="tool_approval",
                    tool_call_id=call_id,
                    message=f"{name}({arguments[:500]}) waits for approval: approve or deny it",
                )
            )
        if not interrupts:  # nothing named: the protocol wants at least one
            return RunFinishedSuccessOutcome()
        return RunFinishedInterruptOutcome(interrupts=interrupts)

    def _count(self, usage: Mapping[str, Any] | None) -> None:
        if not usage:
            return
        counts = self._usage.setdefault(self._route, [0, 0])
        counts[0] += int(usage.get("input_tokens") or 0)
        counts[1] += int(usage.get("output_tokens") or 0)

    def _usages(self) -> list[TokenUsage] | None:
        if not self._usage:
            return None
        return [
            TokenUsage(
                provider=provider,
                model=model,
                input_tokens=inp,
                output_tokens=out,
                total_tokens=inp + out,
            )
            for (provider, model), (inp, out) in self._usage.items()
        ]

    def _finish(
        self,
        outcome: RunFinishedSuccessOutcome
        | RunFinishedInterruptOutcome
        | RunFinishedCancelledOutcome,
        seconds: float | None,
    ) -> BaseEvent:
        self.done = True
        return RunFinishedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            outcome=outcome,
            usage=self._usages(),
            timestamp=None if seconds is None else _ms(seconds),
        )

    def _error(self, code: str, message: str, seconds: float | None) -> BaseEvent:
        return RunErrorEvent(
            message=message,
            code=code,
            usage=self._usages(),
            timestamp=None if seconds is None else _ms(seconds),
        )


def translate_run(
    events: Iterable[Event], *, thread_id: str, run_id: str, claim: str | Continuation
) -> list[BaseEvent]:
    """The AG-UI events of a run, from its session's log (seq 0 on).

    ``claim``: the id of the message the run sent, or the ``Continuation`` it resumed. Ends with
    the run's terminal event once the log holds the claimed turn's ``turn/end``.
    """
    translator = RunTranslator(thread_id, run_id, claim)
    out = translator.start()
    for event in events:
        out += translator.feed(event)
    return out
