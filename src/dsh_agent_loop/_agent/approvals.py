"""Durable tool approval: calls that wait for a person's decision, across restarts.

See docs/design.md#approvals.

A call whose tool ``requires_approval`` is deferred by its ``ToolBatch``: its ``tool/call`` and a
``tool/approval-requested`` are stored (flushed), the other calls of the step run as usual, and
the turn ends ``{kind: awaiting-approval, call_ids}``. From then on the calls are *pending*:
``ApprovalState`` (``_session/projections.py``) rebuilds them from the log, so a resumed agent
has them too, crash repair leaves them alone and ``invariants.check`` accepts them.

The rule that keeps every request valid: no message may come between a tool call and its
result. So while any call is pending the driver starts no turn (``has_work`` is False and
next-turn work waits in the inbox). Each decision is a durable ``tool/approval``; once every
pending call is decided, the driver starts the *continuation*: a turn that claims next-step
messages only, and whose first step settles the decided calls in model order (denied ones get a
``DENIED`` result carrying the message, approved ones run after the decisions are flushed) before
it asks the model. ``cancel()`` denies every pending call ("cancelled", with its cause), and a
continuation whose decisions came from a cancel ends ``aborted`` without asking the model.
Disposal decides nothing: the calls stay pending for the next resume.

"Always" (``approve(call_id, always=True)``) approves the call and first records, durably, an
allow rule for calls like it (``permissions/allowed {rule, call_id}``): the exact command of a
``run_command``, the exact path of a file tool, the tool itself for any other
(``_permission_rules.exact_rule``). ``LoopState.granted`` rebuilds the rules from the log, so a
resumed agent keeps them; ``_agent/_permissions.py`` evaluates them after the policy's deny and
ask rules. The event is marked ``ignorable``: an older reader skips it and simply asks again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from .._errors import AgentClosedError
from .._frozen import FrozenDict
from .._permission_rules import absolute_cwd, exact_rule
from .._session.projections import AWAITING_APPROVAL
from .._session.records import approval_data, permission_allowed_data
from ..events import (
    PERMISSIONS_ALLOWED,
    TOOL_APPROVAL,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Event,
    make_event,
)
from ._turn_context import TurnContext
from .results import ApprovalRequest, TurnResult, build_result, turn_error
from .tool_calls import ToolBatch

if TYPE_CHECKING:
    from .subscription import Subscription

__all__ = [
    "CANCELLED_MESSAGE",
    "Deciding",
    "approve",
    "awaiting_reason",
    "cancel_pending",
    "decide",
    "pending",
    "prepare",
    "ready",
    "request_of",
    "resolve",
]

#: The message of the denials ``cancel()`` makes.
CANCELLED_MESSAGE: Final = "cancelled"


def pending(agent: TurnContext) -> tuple[ApprovalRequest, ...]:
    """The calls of ``agent`` still waiting for a decision, in model order."""
    state = agent.log.state.approvals
    if state is None:
        return ()
    return tuple(request_of(e.data) for e in state.pending())


def request_of(data: Mapping[str, Any]) -> ApprovalRequest:
    """The ``ApprovalRequest`` a pending ``tool/approval-requested`` event's data describes."""
    return ApprovalRequest(
        call_id=data["call_id"],
        name=data["name"],
        arguments=data["arguments"],
        turn=data["turn"],
        step=data["step"],
    )


def ready(agent: TurnContext) -> bool:
    """True when decided calls wait for their continuation turn (a resume must wake)."""
    state = agent.log.state.approvals
    return state is not None and state.ready


def decide(
    agent: TurnContext,
    call_id: str,
    approved: bool,
    message: str | None = None,
    cause: str | None = None,
) -> bool:
    """Append the durable ``tool/approval`` of one pending call; True when all are decided.

    Raises:
        AgentClosedError: the agent is disposed (its calls stay pending for the next resume).
        ValueError: ``call_id`` names no pending call.
    """
    _request(agent, call_id)
    if message is not None and not isinstance(message, str):
        raise TypeError("a denial message must be a string")
    agent.log.add(TOOL_APPROVAL, approval_data(call_id, approved, message, cause))
    state = agent.log.state.approvals
    assert state is not None
    return state.ready


def _request(agent: TurnContext, call_id: str) -> Event:
    """The ``tool/approval-requested`` of pending call ``call_id``.

    Raises:
        AgentClosedError: the agent is disposed. ValueError: no such pending call.
    """
    if agent.closed:
        raise AgentClosedError(f"agent {agent.id!r} is disposed; resume it to decide its calls")
    state = agent.log.state.approvals
    found = (
        None
        if state is None
        else next((e for e in state.pending() if e.data["call_id"] == call_id), None)
    )
    if found is None:
        raise ValueError(f"no pending approval for tool call {call_id!r}")
    return found


def approve(agent: TurnContext, call_id: str, always: bool) -> tuple[bool, str | None]:
    """Approve a pending call; with ``always``, first record an allow rule for calls like it.

    Returns whether every pending call is decided now, and the rule recorded (None without
    ``always``, or for a call no allow rule can match: a path outside the cwd). A rule granted
    already is not recorded twice.

    Raises:
        AgentClosedError: the agent is disposed. ValueError: ``call_id`` names no pending call.
    """
    rule: str | None = None
    if always:
        data = _request(agent, call_id).data
        rule = exact_rule(data["name"], data["arguments"], absolute_cwd(agent.options.cwd))
        if rule is not None and rule not in agent.log.state.granted:
            grant = permission_allowed_data(rule, call_id)
            agent.log.append(make_event(PERMISSIONS_ALLOWED, None, 0.0, grant, ignorable=True))
    return decide(agent, call_id, True), rule


def cancel_pending(agent: TurnContext, cause: str) -> bool:
    """``cancel()``: deny every pending call, or abort the continuation already due.

    Returns True when a continuation is now due (it runs aborted with ``cause``). A continuation
    whose calls were all decided before the cancel is due already: it is marked to run aborted,
    so its approved calls never run (each gets ``ABORTED_BEFORE_DISPATCH``).
    """
    state = agent.log.state.approvals
    if state is None or not state.awaiting or agent.closed:
        return False
    undecided = state.pending()
    if not undecided:  # every call was decided: the continuation is due, and runs aborted
        agent.continuation_cancel = agent.continuation_cancel or cause
    for event in undecided:
        agent.log.add(
            TOOL_APPROVAL, approval_data(event.data["call_id"], False, CANCELLED_MESSAGE, cause)
        )
    return state.ready


def awaiting_reason(call_ids: tuple[str, ...]) -> FrozenDict:
    """The ``turn/end`` reason of a turn that deferred ``call_ids``."""
    return FrozenDict(kind=AWAITING_APPROVAL, call_ids=call_ids)


def prepare(agent: TurnContext, number: int) -> tuple[ToolBatch | None, str | None]:
    """A continuation turn's decided calls (None: it is no continuation), and its cancel cause.

    Called before ``turn/start`` (which clears the approval state): the batch holds what the
    continuation needs (``Turn.carried``). A cause (a decision made by ``cancel()``) cancels the
    turn before it starts.
    """
    state = agent.log.state.approvals
    if state is None or not state.ready:
        return None, None
    events = list(state.requested.values())
    blocks = [FrozenDict(call_id=e.data["call_id"], name=e.data["name"]) for e in events]
    batch = ToolBatch(agent, {}, blocks, number, 1)
    cause: str | None = None
    for index, event in enumerate(events):
        decision = state.decisions[event.data["call_id"]]
        denial: str | None = None
        if decision["decision"] != "approve":
            message = decision.get("message")
            denial = f"Error: tool call denied: {message}" if message else "Error: tool call denied"
            cause = cause or decision.get("cause")
        batch.preset(index, _call_seq(agent, event.seq), event.data["arguments"], denial)
    cause = cause or agent.continuation_cancel
    agent.continuation_cancel = None
    return batch, cause


def _call_seq(agent: TurnContext, request_seq: int | None) -> int:
    """The seq of the ``tool/call`` a request follows (the batch appends them together)."""
    assert request_seq is not None
    call_id = agent.log.event(request_seq).data["call_id"]
    for seq in range(request_seq - 1, -1, -1):
        event = agent.log.event(seq)
        if event.type == TOOL_CALL and event.data["call_id"] == call_id:
            return seq
    raise AssertionError(f"tool/approval-requested at seq {request_seq} follows no tool/call")


class Deciding(TurnContext, Protocol):
    """What ``resolve`` needs beyond the turn context: the agent's deciding and waiting verbs."""

    def approve(self, call_id: str, *, always: bool = False) -> str | None:
        """Approve a pending call (and wake the continuation once all are decided)."""
        ...

    def deny(self, call_id: str, message: str | None = None) -> None:
        """Deny a pending call."""
        ...

    async def wait_idle(self) -> None:
        """Wait until the driver is parked."""
        ...

    def subscribe(
        self, types: Iterable[str] | None = None, max_buffer: float = 1024
    ) -> AbstractAsyncContextManager[Subscription]:
        """Receive the agent's committed events and notifications."""
        ...


async def resolve(agent: Deciding, decisions: Mapping[str, bool | str]) -> TurnResult:
    """Decide pending calls (``True`` approves, a string denies with it as the message).

    Returns the ``TurnResult`` of the continuation turn once its ``turn/end`` is stored (work
    queued behind it may still run). A cancelled caller leaves the decisions made: they are
    durable, and the continuation runs anyway.

    Raises:
        ValueError: a call id names no pending call, or a decision is neither True nor a string
            (nothing is decided then), or calls would still be pending after these decisions.
        TurnError: the continuation ended ``error``, ``blocked`` or ``aborted``.
    """
    waiting = {r.call_id for r in pending(agent)}
    for call_id, decision in decisions.items():
        if call_id not in waiting:
            raise ValueError(f"no pending approval for tool call {call_id!r}")
        if decision is not True and not isinstance(decision, str):
            raise ValueError(f"decide {call_id!r} with True or a denial message, not {decision!r}")
    if waiting - set(decisions):
        left = ", ".join(sorted(waiting - set(decisions)))
        raise ValueError(f"calls still pending after these decisions: {left}")
    number = agent.log.state.turn + 1  # no turn is open while calls are pending
    async with agent.subscribe(types=(TURN_END,)) as ends, trio.open_nursery() as nursery:

        async def until_idle() -> None:
            await agent.wait_idle()  # the continuation never ran (the agent was disposed)
            nursery.cancel_scope.cancel()

        nursery.start_soon(until_idle)
        for call_id, decision in decisions.items():
            if decision is True:
                agent.approve(call_id)
            else:
                agent.deny(call_id, str(decision))
        async for end in ends:  # committed: the continuation's turn/end is durable
            if end.data["turn"] == number:
                break
        nursery.cancel_scope.cancel()
    return _continuation_result(agent, number)


def _continuation_result(agent: TurnContext, number: int) -> TurnResult:
    """The ``TurnResult`` of continuation ``number`` (raising its ``TurnError``)."""
    events = _turn_events(agent, number)
    # The settled calls' tool/call events are in the turn that deferred them: the result lists
    # them as this turn's calls (build_result reads calls from tool/call events).
    own = {e.data["call_id"] for e in events if e.type == TOOL_CALL}
    earlier = [
        agent.log.event(e.source_event_seqs[0])
        for e in events
        if e.type == TOOL_RESULT and e.source_event_seqs and e.data["message"]["call_id"] not in own
    ]
    events = [events[0], *earlier, *events[1:]]
    output = None if agent.outputs is None else agent.outputs.take(number)
    result = build_result(events, output=output, pending_approvals=pending(agent))
    error = turn_error(result)
    if error is not None:
        raise error
    return result


def _turn_events(agent: TurnContext, number: int) -> list[Any]:
    """The events of turn ``number``, ``turn/start`` through ``turn/end``."""
    events = agent.log.events
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == TURN_START and events[i].data["turn"] == number:
            for j in range(i, len(events)):
                if events[j].type == TURN_END:
                    return events[i : j + 1]
            break
    raise AgentClosedError(f"agent {agent.id!r} stopped before its turn {number} ended")
