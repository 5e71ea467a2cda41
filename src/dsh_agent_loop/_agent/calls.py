"""``Agent.run`` and ``Agent.run_stream``: one message as an awaitable call.

See docs/design.md#awaitable-turns.

A call queues its message ``next-turn`` and waits for the turn that claims it. Which turn that
is, is read from the log as it is appended: the agent's ``Calls`` projection folds
``turn/start``, ``agent/inbox/spliced`` and ``turn/end``. A claim splice (no outcome) that took a
waiting message ties the call to the turn that just started; a canceled splice that removed it
ends the call with no turn; that turn's ``turn/end`` ends it with one. The projection is
registered the first time a call is made, so an agent that never makes one pays nothing. The
caller then waits for the durability barrier (``Agent.flush``) and for the driver to be done with
the turn (``Calls.released``, so an agent with nothing else queued is idle when ``run()``
returns), and builds the result from the stored events (``_agent/results.py``): the log is the
truth.

The caller's cancellation is the turn's. While the message is queued it is removed (a canceled
splice); while its turn runs, that turn alone is aborted (cause ``user``) and the wake is kept, so
the messages queued behind it run next. Either way the caller waits, shielded and bounded
(``CALL_CANCEL_TIMEOUT``), until the ``turn/end`` is stored; only then does ``Cancelled``
propagate, so when ``run()`` is over the log says how its turn ended.

While tool calls of the agent wait for a decision no turn starts (docs/design.md#approvals), so
a message queued then would wait silently, maybe forever: ``run()`` and ``run_stream()`` refuse
it with ``ApprovalPendingError`` naming the calls, before anything is queued, unless the caller
passes ``wait_for_approvals=True``. Calls decided already (their continuation due) hold nothing
up: the message runs after the continuation.

A stream is one more subscriber of the agent, with an unbounded buffer that admits only its own
turn's events and frames (filtered as they are delivered): a slow reader loses nothing, and the
agent never waits for it. An agent with no stream open pays nothing (``subscribe``'s list is
empty).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import trio

from .._errors import AgentClosedError, ApprovalPendingError, StoreError
from .._session.projections import NEXT_TURN
from ..events import ASSISTANT_STREAM, INBOX_SPLICED, TURN_END, TURN_START, Event
from ._turn_context import TurnContext
from .output import OutputRegistry
from .results import ApprovalRequest, TurnAbortedError, TurnResult, build_result, turn_error
from .subscription import Subscriber, Subscription

if TYPE_CHECKING:
    from .._session.log import Session
    from .inbox import MessageInput

__all__ = ["CALL_CANCEL_TIMEOUT", "Caller", "Calls", "RunStream", "run", "run_stream"]

#: Seconds a cancelled ``run()`` waits (shielded) for its turn's ``turn/end`` to be stored.
CALL_CANCEL_TIMEOUT: Final = 10.0


class Caller(TurnContext, Protocol):
    """What a call needs of its agent beyond the turn context (the actor satisfies it)."""

    calls: Calls | None
    """The agent's awaited messages; made on the first call."""

    def followup(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue a prompt for the next turn and wake the driver."""
        ...

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """Tool calls waiting for a decision."""
        ...

    def add_subscriber(self, sub: Subscriber) -> None:
        """Deliver the agent's events to ``sub`` from now on."""
        ...

    def drop_subscriber(self, sub: Subscriber) -> None:
        """Stop delivering to ``sub``."""
        ...


@final
class _Call:
    """One awaited message: where it is (queued, claimed by a turn, ended) and its waiters."""

    __slots__ = (
        "closed",
        "done",
        "end_seq",
        "message_id",
        "released",
        "start_seq",
        "stream",
        "turn",
        "wants_output",
    )

    def __init__(self, message_id: str, wants_output: bool) -> None:
        self.message_id = message_id
        self.wants_output = wants_output
        self.turn: int | None = None
        """The turn that claimed the message (None while queued, or if it never was)."""
        self.start_seq: int | None = None
        self.end_seq: int | None = None
        self.done = trio.Event()
        """Set once the call can go no further: its turn ended, or the message left unclaimed."""
        self.released = trio.Event()
        """Set once the driver is done with the call's turn (or when there is no turn)."""
        self.stream: Subscription | None = None
        self.closed = False
        """The agent was disposed while the message was queued."""

    def accepts(self, event: Event) -> bool:
        """True for an event or notification of this call's turn (a stream's filter)."""
        seq = event.seq
        if seq is None:
            return self.turn is not None and event.data.get("turn") == self.turn
        start = self.start_seq
        end = self.end_seq
        return start is not None and start <= seq and (end is None or seq <= end)

    def end(self) -> None:
        self.done.set()
        if self.turn is None:
            self.released.set()
            if self.stream is not None:
                self.stream.close_sender()  # nothing of a turn will come


@final
class Calls:
    """The calls of one agent, as a session projection (folded on every append)."""

    __slots__ = ("_ended", "_inbox", "_open", "_running", "_start_seq", "_turn", "_waiting")

    types: frozenset[str] | None = frozenset({TURN_START, INBOX_SPLICED, TURN_END})

    def __init__(self, log: Session) -> None:
        self._inbox = log.inbox
        self._waiting: dict[str, _Call] = {}
        self._running: dict[int, _Call] = {}
        self._ended: dict[int, _Call] = {}
        self._turn = log.state.turn
        self._start_seq = -1
        self._open = False
        """A ``turn/start`` was folded and its ``turn/end`` not yet: a claim belongs to it."""

    @staticmethod
    def of(agent: Caller) -> Calls:
        """The agent's registry, made (and registered on its session) on first use."""
        calls = agent.calls
        if calls is None:
            calls = agent.calls = Calls(agent.log)
            agent.log.register_projection(calls, replay=False)
        return calls

    def wait_for(self, message_id: str, wants_output: bool) -> _Call:
        """Follow the pending message ``message_id`` until a turn claims it."""
        call = self._waiting[message_id] = _Call(message_id, wants_output)
        return call

    def forget(self, call: _Call) -> None:
        """Stop following ``call`` (it is ended)."""
        if self._waiting.get(call.message_id) is call:
            del self._waiting[call.message_id]
        call.end()

    def released(self, turn: int) -> None:
        """The driver is done with turn ``turn`` (called by the actor's driver)."""
        call = self._ended.pop(turn, None) or self._running.pop(turn, None)
        if call is not None:
            call.released.set()

    def close(self) -> None:
        """The agent is disposed: calls still queued end without a turn."""
        waiting, self._waiting = self._waiting, {}
        for call in waiting.values():
            call.closed = True
            call.end()

    def fold(self, event: Event) -> None:
        """Fold one ``turn/start``, ``agent/inbox/spliced`` or ``turn/end``."""
        kind = event.type
        if kind == INBOX_SPLICED:
            if self._waiting:
                self._spliced(event)
        elif kind == TURN_START:
            self._turn, self._start_seq = int(event.data["turn"]), int(event.seq or 0)
            self._open = True
        else:
            self._open = False
            if self._running:
                self._ended_turn(event)

    def _ended_turn(self, event: Event) -> None:
        number = int(event.data["turn"])
        call = self._running.pop(number, None)
        if call is not None:
            call.end_seq = event.seq
            self._ended[number] = call
            call.end()

    def _spliced(self, event: Event) -> None:
        data = event.data
        removed = data["removed_count"]
        if not removed or data["target"] != NEXT_TURN:
            return  # awaited messages are queued next-turn
        inbox = self._inbox
        first = next(iter(self._waiting.values()))
        if removed == 1 and not inbox.has_id(first.message_id):
            gone = [first]  # the common case: the oldest awaited message was claimed, O(1)
        else:
            gone = [call for key, call in self._waiting.items() if not inbox.has_id(key)]
        # A removal without outcome claims only inside a turn; outside one (a splice made by
        # hand) the message left the inbox unclaimed: its caller gets TurnAbortedError.
        claimed = "outcome" not in data and self._open
        for call in gone:
            del self._waiting[call.message_id]
            if claimed:
                call.turn, call.start_seq = self._turn, self._start_seq
                self._running[self._turn] = call
            else:
                call.end()  # removed from the inbox: no turn will run it


def _refuse_behind_approvals(agent: Caller) -> None:
    """Raise ``ApprovalPendingError`` when calls of ``agent`` wait for a decision.

    Raises:
        ApprovalPendingError: the message would wait behind them (nothing is queued).
    """
    if agent.closed:
        return  # followup raises AgentClosedError, as for any message
    waiting = agent.pending_approvals()
    if waiting:
        ids = tuple(request.call_id for request in waiting)
        listed = ", ".join(f"{r.call_id} ({r.name})" for r in waiting)
        raise ApprovalPendingError(
            f"agent {agent.id!r} has tool calls waiting for approval: {listed}; decide them"
            " (approve/deny) first, or pass wait_for_approvals=True to queue the message"
            " behind them",
            call_ids=ids,
        )


def _start(
    agent: Caller,
    message: MessageInput,
    output: tuple[Any, int] | None,
    message_id: str | None,
    wait_for_approvals: bool,
) -> _Call:
    """Queue ``message`` and follow it (synchronously: no turn can claim it before that).

    Raises:
        ApprovalPendingError: calls wait for a decision and ``wait_for_approvals`` is False.
    """
    if not wait_for_approvals:
        _refuse_behind_approvals(agent)
    calls = Calls.of(agent)
    if output is not None:
        # registered first, so that a type without a schema raises before anything is queued
        if message_id is None:
            message_id = agent.inbox.new_id()
        if agent.outputs is None:
            agent.outputs = OutputRegistry()
        agent.outputs.expect(message_id, *output)
    message_id = agent.followup(message, message_id=message_id)
    return calls.wait_for(message_id, output is not None)


async def _withdraw(agent: Caller, call: _Call) -> None:
    """The caller gave up: remove its message or abort its turn, then wait for ``turn/end``."""
    if not call.done.is_set():
        if call.turn is None:
            if not agent.closed:
                agent.inbox.remove(call.message_id)  # a canceled splice ends the call
            if agent.calls is not None:
                agent.calls.forget(call)
        else:
            agent.abort_turn(call.turn)
            await call.done.wait()
    if call.turn is not None:
        with suppress(StoreError):
            await agent.flush()
        await call.released.wait()


async def _settle(agent: Caller, call: _Call) -> TurnResult:
    """Wait for the call's ``turn/end`` to be stored; return its result or raise its error."""
    try:
        await call.done.wait()
        if call.turn is not None:
            await agent.flush()
            # The driver finishes the turn (no await left) before the caller goes on: an
            # agent with nothing else queued is idle when run() returns.
            await call.released.wait()
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(CALL_CANCEL_TIMEOUT):
            await _withdraw(agent, call)
        raise
    finally:
        if call.stream is not None and call.done.is_set():
            call.stream.close_sender()  # what the turn committed is buffered by now
    if call.closed:
        raise AgentClosedError(f"agent {agent.id!r} was disposed before it ran the message")
    if call.turn is None:
        raise TurnAbortedError(
            f"message {call.message_id!r} was removed from the inbox before a turn claimed it",
            result=None,
        )
    return _result(agent, call)


def _result(agent: Caller, call: _Call) -> TurnResult:
    assert call.turn is not None
    assert call.start_seq is not None
    assert call.end_seq is not None
    log = agent.log
    events = [log.event(seq) for seq in range(call.start_seq, call.end_seq + 1)]
    outputs = agent.outputs
    output = outputs.take(call.turn) if call.wants_output and outputs is not None else None
    result = build_result(
        events,
        message_id=call.message_id,
        output=output,
        pending_approvals=agent.pending_approvals(),
    )
    error = turn_error(result)
    if error is not None:
        raise error
    return result


async def run(
    agent: Caller,
    message: MessageInput,
    *,
    output_type: Any = None,
    output_retries: int = 2,
    message_id: str | None = None,
    wait_for_approvals: bool = False,
) -> TurnResult:
    """Queue ``message`` next-turn and return the result of the turn that claims it.

    Raises:
        ApprovalPendingError: tool calls wait for a decision (nothing was queued); with
            ``wait_for_approvals`` the message is queued behind them instead.
        AgentClosedError: the agent is disposed (or was, before the message ran).
        TurnFailedError: the turn ended ``error``.
        TurnBlockedError: the turn ended ``blocked``.
        TurnAbortedError: the turn was aborted by another cause than this caller's cancel.
    """
    output = None if output_type is None else (output_type, output_retries)
    call = _start(agent, message, output, message_id, wait_for_approvals)
    return await _settle(agent, call)


@final
class RunStream:
    """One turn's events and stream frames, buffered for one reader, and its result."""

    __slots__ = ("_agent", "_call", "_outcome", "_over", "_recv")

    def __init__(self, agent: Caller, call: _Call, recv: Subscription) -> None:
        self._agent = agent
        self._call = call
        self._recv = recv
        self._over = False
        self._outcome: TurnResult | BaseException | None = None

    @property
    def message_id(self) -> str:
        """The id of the queued message."""
        return self._call.message_id

    def events(self) -> AsyncIterator[Event]:
        """Every event and stream frame of this turn, in order, ending with its ``turn/end``.

        Committed events arrive after their commit, notifications (``seq=None``: stream frames,
        ``agent/error``) as they happen. Each item is handed out once: use one reader.
        """
        return _Items(self, text=False)

    def text_deltas(self) -> AsyncIterator[str]:
        """The text of the turn's streamed ``text-delta`` chunks, as they arrive."""
        return _Items(self, text=True)

    async def next_event(self) -> Event:
        """The turn's next event or frame.

        Raises:
            StopAsyncIteration: the turn's ``turn/end`` was handed out (or it never ran).
        """
        if self._over:
            raise StopAsyncIteration
        try:
            event = await self._recv.receive()
        except trio.EndOfChannel:
            self._over = True
            raise StopAsyncIteration from None
        call = self._call
        if event.type == TURN_END and event.seq == call.end_seq:
            self._over = True
        elif self._agent.store_failure is not None and call.done.is_set():
            self._over = True  # its turn/end will never be committed
        return event

    async def result(self) -> TurnResult:
        """The turn's result once its ``turn/end`` is stored (or its ``TurnError``)."""
        if self._outcome is None:
            try:
                self._outcome = await _settle(self._agent, self._call)
            except trio.Cancelled:
                raise
            except Exception as exc:
                self._outcome = exc
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome


@final
class _Items(AsyncIterator[Any]):
    """Iterates a stream's events, or only its text (a class: nothing to finalize on break)."""

    __slots__ = ("_stream", "_text")

    def __init__(self, stream: RunStream, *, text: bool) -> None:
        self._stream = stream
        self._text = text

    async def __anext__(self) -> Any:
        while True:
            event = await self._stream.next_event()
            if not self._text:
                return event
            if event.type == ASSISTANT_STREAM and event.data["frame"] == "chunk":
                chunk = event.data["chunk"]
                if chunk.type == "text-delta":
                    return chunk.text


@asynccontextmanager
async def run_stream(
    agent: Caller,
    message: MessageInput,
    *,
    output_type: Any = None,
    output_retries: int = 2,
    message_id: str | None = None,
    wait_for_approvals: bool = False,
) -> AsyncIterator[RunStream]:
    """Queue ``message`` next-turn and stream the turn that claims it (see ``RunStream``).

    Leaving the block before the turn ended cancels it as a cancelled ``run()`` would.

    Raises:
        ApprovalPendingError: on entering, as ``run()`` (nothing was queued).
    """
    output = None if output_type is None else (output_type, output_retries)
    call = _start(agent, message, output, message_id, wait_for_approvals)
    send, recv = trio.open_memory_channel[Event](math.inf)
    subscriber = Subscriber(send, None, math.inf, accept=call.accepts)
    stream = call.stream = Subscription(recv, subscriber)
    agent.add_subscriber(subscriber)  # the façade's list: delivery stays in the driver
    try:
        async with recv:
            yield RunStream(agent, call, stream)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CALL_CANCEL_TIMEOUT):
            await _withdraw(agent, call)
        agent.drop_subscriber(subscriber)
        send.close()
