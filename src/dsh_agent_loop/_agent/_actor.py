"""``AgentActor``: the machinery behind one public ``Agent`` — its wakes, driver and deliveries.

Each agent is one task with its own nursery (``Agents`` starts it; ``_agent/lifecycle.py``): the
task runs the agent's session writer inline, and the nursery holds the driver and, under it,
the tool workers. The driver is started in that nursery when work arrives and ends when the
agent is idle again, so an idle agent costs one parked task. It runs turns while there is work,
one ``Turn`` object each (``_agent/turn.py``; a model call is an ``Attempt``, the request caches
live on the agent's ``RequestSeries``). The public ``Agent`` (``_agent/agent.py``) is a thin
façade over this actor; the turn machine sees the actor as its ``TurnContext``
(``_agent/_turn_context.py``), and hook payloads carry the façade (``facade``). Wakes are
level-triggered flags, not queued items: ``followup``/``steer`` set the flag and start the
driver if it is not running; ``cancel`` drops a wake that has not been picked up. Status
becomes ``running`` synchronously when a wake is made, and ``idle`` only after the turn's
``turn/end`` is durable, so ``wait_idle()`` returning means the turn is stored.

Cancellation travels by the running turn's cancel scope, which the ``Turn`` owns; the first
cause wins, and it reaches the running turns of the agent's live sub-agents (``children``;
cause ``parent``, ``_agent/subagents.py``). A wake that arrives while a cancelled turn winds
down is latched and replayed once idle (disposal never latches), and a message steered during
the wind-down goes to ``next-turn``.

Disposal is final: from the moment it starts, ``send`` and its shorthands raise
``AgentClosedError`` (one flag checked, nothing appended). The driver remembers its task so that
a teardown asked for from inside the agent's own task tree (one of its tools or hooks) can be
told apart from one it may wait for (``in_driver_tree``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, final

import trio
from trio_util import AsyncValue

from .._errors import AgentClosedError, StoreError
from .._frozen import FrozenDict
from .._hooks import HookChain
from .._sandbox import Workspace
from .._session.log import Session
from .._session.projections import NEXT_STEP, NEXT_TURN
from .._wakeup import Latch
from ..events import AGENT_ERROR, AGENT_STATUS, SESSION_EVENT, SESSION_FLUSH, Event, make_event
from . import approvals, subagents
from .inbox import Inbox, MessageInput, Target
from .series import RequestSeries
from .services import NO_HOOKS, AgentScope, Services
from .statistics import AgentStatistics
from .step_inputs import AssemblyCache
from .subscription import Subscriber, Subscription
from .turn import Turn

if TYPE_CHECKING:
    from .._session.writer import SessionWriter
    from ._permissions import Gate
    from ._tokens import ContextTracker
    from .calls import Calls
    from .options import AgentOptions, CompactionPolicy
    from .output import OutputRegistry
    from .prompt import PromptAssembly
    from .results import ApprovalRequest

__all__ = ["AgentActor", "Status"]

Status = Literal["idle", "running"]
#: The type of the public façade an actor serves (``_agent/agent.py``'s ``Agent``).
FacadeT = TypeVar("FacadeT")


class _Disposable(Protocol):
    def dispose(self) -> Awaitable[None]: ...


#: The ``_stopped`` latch of an agent that stopped before anyone waited (shared, already set).
_STOPPED = Latch()
_STOPPED.set()


async def _durable() -> None:
    """Nothing to wait for: a session without a writer keeps nothing pending for a store."""


@final
class AgentActor(Generic[FacadeT]):
    """One agent's machinery: identity, inbox, session, status, subscribers and the driver.

    It holds no step state: a turn's state lives on its ``Turn``, a model call's on its
    ``Attempt``, the request caches on the ``RequestSeries``. It satisfies ``TurnContext``.
    """

    __slots__ = (
        "_cancel_wakes",
        "_disposing",
        "_driver_task",
        "_driving",
        "_idle_waiters",
        "_nursery",
        "_on_store_stop",
        "_status",
        "_status_value",
        "_stopped",
        "_subscribers",
        "_turn",
        "_turns",
        "_uncounted",
        "_wake_pending",
        "_wakes",
        "_workspace",
        "assembly",
        "calls",
        "children",
        "context",
        "continuation_cancel",
        "facade",
        "hooks",
        "id",
        "inbox",
        "log",
        "on_driver_start",
        "options",
        "outputs",
        "parent",
        "permission_gate",
        "scope",
        "series",
        "services",
        "store_failure",
        "writer",
    )

    def __init__(
        self,
        facade: FacadeT,
        *,
        options: AgentOptions,
        session: Session,
        services: Services,
        parent: AgentActor[FacadeT] | None = None,
    ) -> None:
        self.facade = facade
        """The public ``Agent`` this actor serves (what hook payloads carry)."""
        self.id: str = options.id
        self.options = options
        self.parent = parent
        self.children: tuple[AgentActor[FacadeT], ...] = ()
        """Live sub-agents (``_agent/subagents.py``): a cancel of this agent's turn reaches them."""
        self.log: Session = session
        """The agent's (writable) session; for the turn machine and lifecycle."""
        self.services: Services = services
        """The runtime services this agent uses."""
        self.hooks = HookChain(services.hooks, NO_HOOKS)
        self.scope = AgentScope(self.hooks, options.persona)
        self.inbox = Inbox(session, self)
        self._status: Status = "idle"
        self._status_value: AsyncValue[Status] | None = None
        self._idle_waiters: trio.lowlevel.ParkingLot | None = None
        self._wake_pending = False
        self._wakes = 0
        """Wakes made so far (a counter: the driver coalesces wakes into one flag)."""
        self._cancel_wakes = 0
        """``_wakes`` when the last ``cancel()`` returned: later wakes are work it never saw."""
        self.continuation_cancel: str | None = None
        """The cause of a ``cancel()`` that found a continuation due (``_agent/approvals.py``)."""
        self._turn: Turn | None = None
        self._disposing = False
        self._driver_task: trio.lowlevel.Task | None = None
        self._driving = False
        self._nursery: trio.Nursery | None = None
        self._on_store_stop: _Disposable | None = None
        self._stopped: Latch | None = None  # made by the first waiter, or _STOPPED
        self._subscribers: list[Subscriber] | tuple[()] = ()  # a list from the first one
        self.writer: SessionWriter | None = None
        self.series = RequestSeries(session)
        """This instance's requests: prompt reconciliation and request records."""
        self.assembly = AssemblyCache()
        """The default prompt assembly, rebuilt only when its inputs change."""
        self.store_failure: BaseException | None = None
        self.calls: Calls | None = None
        """Messages awaited by ``run``/``run_stream`` (``_agent/calls.py``); made on first use."""
        self._turns = 0
        self.outputs: OutputRegistry | None = None
        """Structured-output registrations (``_agent/output.py``); made on first use."""
        self.permission_gate: Gate | None = None  # _agent/_permissions.py (on the first call)
        self.context: ContextTracker | None = None
        """Token accounting of the history (``_agent/context.py``); made on first use."""
        self._workspace: Workspace | None = None
        self._uncounted = session.state.counters()  # the log's counters before this instance
        self.on_driver_start: Callable[[FacadeT, trio.lowlevel.Task], None] | None = None
        """Testing hook: called with the façade and the driver task when the driver starts."""

    # -- identity --------------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        """The id of the agent's session."""
        return self.log.id

    @property
    def status_now(self) -> Status:
        """``"idle"`` or ``"running"``, as a plain value."""
        return self._status

    def __repr__(self) -> str:
        return f"<AgentActor {self.id!r} session={self.session_id!r} {self._status}>"

    @property
    def status(self) -> AsyncValue[Status]:
        """``"idle"`` or ``"running"`` as a ``trio_util.AsyncValue`` (made on first use)."""
        if self._status_value is None:
            self._status_value = AsyncValue(self._status)
        return self._status_value

    @property
    def workspace(self) -> Workspace:
        """What this agent's built-in tools keep to: its sandbox and the protected paths.

        The sandbox is the agent's own (``options.sandbox``), else its parent's, else the
        runtime's; made on first use.
        """
        if self._workspace is None:
            sandbox = self.options.sandbox
            if sandbox is None:
                parent = self.parent
                sandbox = parent.workspace.sandbox if parent else self.services.sandbox
            self._workspace = Workspace(sandbox=sandbox, protected=self.services.protected)
        return self._workspace

    # -- inbox -------------------------------------------------------------------------------
    def send(
        self,
        message: MessageInput,
        target: Target = NEXT_TURN,
        wake: bool = True,
        *,
        message_id: str | None = None,
    ) -> str:
        """Queue ``message`` in ``target`` (and wake the driver); returns the message id.

        Raises:
            AgentClosedError: the agent is disposed or being disposed (nothing was queued).
            ValueError: ``message_id`` is already pending.
        """
        if self._disposing:
            raise AgentClosedError(f"agent {self.id!r} is disposed; it takes no more messages")
        if target == NEXT_STEP and self._turn is not None and self._turn.winding_down:
            target = NEXT_TURN
        new_id = self.inbox.insert(message, target, message_id=message_id)
        if wake:
            self.wake()
        return new_id

    def followup(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue a prompt for the next turn and wake the driver (see ``send``)."""
        return self.send(message, NEXT_TURN, True, message_id=message_id)

    def steer(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue guidance for the next step and wake the driver (see ``send``)."""
        return self.send(message, NEXT_STEP, True, message_id=message_id)

    def inject(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue context for the next step without waking the driver (see ``send``)."""
        return self.send(message, NEXT_STEP, False, message_id=message_id)

    def wake(self) -> None:
        """Make a wake: status ``running`` now, and the driver started if it is not running."""
        if self._disposing:
            return
        self._wakes += 1
        self._wake_pending = True
        self._set_status("running")
        self._start_driver()

    def _start_driver(self) -> None:
        if not self._driving and self._nursery is not None:
            self._driving = True
            self._nursery.start_soon(self._drive)

    def has_work(self) -> bool:
        """True when an inbox list has a message; while calls await approval, when decided."""
        state = self.log.state.approvals
        if state is not None and state.awaiting:
            return state.ready
        return len(self.inbox) > 0

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """Tool calls waiting for ``approve`` or ``deny``, in model order."""
        return approvals.pending(self)

    def approve(self, call_id: str, *, always: bool = False) -> str | None:
        """Approve a pending call; ``always`` also allows calls like it (the rule recorded)."""
        ready, rule = approvals.approve(self, call_id, always)
        if ready:
            self.wake()  # every call is decided: the continuation turn runs
        return rule

    def deny(self, call_id: str, message: str | None = None) -> None:
        """Deny a pending call: it gets a ``DENIED`` result carrying ``message``."""
        if approvals.decide(self, call_id, False, message):
            self.wake()

    def abort_turn(self, number: int, cause: str = "user") -> None:
        """Abort turn ``number`` if it is running; messages queued behind it stay and run next."""
        turn = self._turn
        if turn is not None and turn.number == number:
            turn.cancel(subagents.abort_cause(self, cause), None)
            self._wake_pending = self._wake_pending or self.has_work()
            subagents.cancel_children(self)

    # -- context (_agent/context.py) ----------------------------------------------------------
    @property
    def compaction(self) -> CompactionPolicy | None:
        """The compaction policy in force: the agent's own, else the runtime's."""
        return self.options.compaction or self.services.compaction

    @property
    def running_turn(self) -> Turn | None:
        """The turn in progress, if any."""
        return self._turn

    def default_assembly(self) -> PromptAssembly:
        """The default prompt assembly, rebuilt only when its inputs change."""
        return self.assembly.get(self)

    # -- cancellation ------------------------------------------------------------------------
    def cancel(
        self, cause: str = "user", keep_inbox: bool = False, *, message: str | None = None
    ) -> None:
        """Abort the running turn (the first cause wins); clear the inbox unless ``keep_inbox``.

        A cancel reaches only what exists when it is made: the turn running (or the continuation
        of decided approvals already due, which then runs aborted) and the inbox as it is now.
        Work queued afterwards is untouched and runs once the aborted turn has ended.
        """
        if not keep_inbox:
            self.inbox.clear()
        self._wake_pending = False
        if self._turn is not None:
            self._turn.cancel(cause, message)
            subagents.cancel_children(self)
        elif not self._driving:
            self._set_status("idle")  # the wake it dropped had no driver yet
        if cause != "disposed" and approvals.cancel_pending(self, cause):
            self.wake()  # the continuation settles the calls and ends aborted
        self._cancel_wakes = self._wakes

    async def wait_idle(self) -> None:
        """Wait until the driver is parked: no open turn and no unprocessed wake."""
        while self._status != "idle":
            if self._idle_waiters is None:
                self._idle_waiters = trio.lowlevel.ParkingLot()
            await self._idle_waiters.park()

    # -- notifications -----------------------------------------------------------------------
    def add_subscriber(self, sub: Subscriber) -> None:
        """Deliver this agent's events to ``sub`` from now on."""
        if isinstance(self._subscribers, list):
            self._subscribers.append(sub)
        else:
            self._subscribers = [sub]

    def drop_subscriber(self, sub: Subscriber) -> None:
        """Stop delivering to ``sub`` (no-op when it is not subscribed)."""
        if isinstance(self._subscribers, list) and sub in self._subscribers:
            self._subscribers.remove(sub)

    def listening(self, event_type: str) -> bool:
        """True when someone would receive notification ``event_type``."""
        return bool(self._subscribers) or self.hooks.has("on", event_type)

    def _notify(self, event_type: str, data: Mapping[str, Any]) -> None:
        if not self.listening(event_type):
            return
        payload = dict(data)
        payload.setdefault("agent_id", self.id)
        self.publish(make_event(event_type, None, self.services.clock(), FrozenDict(payload)))

    notify = _notify

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to subscribers and ``on`` observers of its type."""
        for sub in tuple(self._subscribers):  # the agent never blocks on a reader
            if not sub.offer(event):
                self.drop_subscriber(sub)
        self.hooks.emit(event.type, event)

    def on_store_failure(self, failure: StoreError) -> None:
        """Called by the session writer when the store fails; an idle agent stops now.

        See docs/design.md#store-failures.

        A running turn meets the failure at its next flush and reports it there; an idle agent
        (its events committed by the timer) emits ``agent/error`` at once and its driver ends,
        so the agent is disposed and the others go on.
        """
        turn = self._turn
        if (turn is not None and turn.scope is not None) or self.store_failure is not None:
            return
        self.store_failure = failure
        code = "OWNERSHIP_LOST" if failure.code == "OWNERSHIP_LOST" else "STORE_FAILED"
        error = FrozenDict(code=code, message=str(failure))
        self._notify(AGENT_ERROR, {"turn": self.log.state.turn, "step": None, "error": error})
        self._start_driver()  # it sees the failure, ends and has the agent disposed

    def on_commit(self, batch: Sequence[Event]) -> None:
        """Called by the session writer after a commit: publish the committed events."""
        if not self._subscribers and not self.hooks.any("on"):
            return  # nobody listens to anything
        if self.listening(SESSION_FLUSH) and batch:
            self._notify(SESSION_FLUSH, {"session_id": self.session_id, "seq": batch[-1].seq})
        if not self._subscribers and not self.hooks.has("on", SESSION_EVENT):
            return
        for event in batch:
            for sub in tuple(self._subscribers):
                if not sub.offer(event):
                    self.drop_subscriber(sub)
            if self.hooks.has("on", SESSION_EVENT):
                self.hooks.emit(
                    SESSION_EVENT,
                    make_event(
                        SESSION_EVENT,
                        None,
                        event.time,
                        FrozenDict(session_id=self.session_id, agent_id=self.id, event=event),
                    ),
                )

    @asynccontextmanager
    async def subscribe(
        self, types: Iterable[str] | None = None, max_buffer: float = 1024
    ) -> AsyncIterator[Subscription]:
        """Receive this agent's committed events and notifications (``seq=None``).

        A subscriber that falls ``max_buffer`` behind gets what was buffered, then
        ``SubscriberOverflowError`` (``_agent/subscription.py``).
        """
        send, recv = trio.open_memory_channel[Event](max_buffer)
        sub = Subscriber(send, frozenset(types) if types is not None else None, max_buffer)
        self.add_subscriber(sub)
        try:
            async with recv:
                yield Subscription(recv, sub)
        finally:
            if sub in self._subscribers:
                self.drop_subscriber(sub)
            send.close()

    def _set_status(self, status: Status) -> None:
        if self._status != status:
            self._status = status
            if self._status_value is not None:
                self._status_value.value = status
            if status == "idle" and self._idle_waiters is not None:
                self._idle_waiters.unpark_all()
            self._notify(AGENT_STATUS, {"status": status})

    # -- the driver --------------------------------------------------------------------------
    def attach(self, nursery: trio.Nursery, on_store_stop: _Disposable | None = None) -> None:
        """Give the agent its own nursery (its task's), where its driver runs from now on.

        ``on_store_stop.dispose()`` is awaited by the driver that finds the store failed
        (docs/design.md#store-failures):
        it disposes the agent, so that the others go on. Work queued before this starts now.
        """
        self._nursery = nursery
        self._on_store_stop = on_store_stop
        if self._disposing:
            return
        if self._wake_pending or self.store_failure is not None:
            self._start_driver()

    def detach(self) -> None:
        """The agent's nursery is closing: no driver starts any more."""
        self._nursery = None

    async def _drive(self) -> None:
        """The driver: run turns while there is work, then end (the agent is idle)."""
        task = self._driver_task = trio.lowlevel.current_task()
        if self.on_driver_start is not None:
            self.on_driver_start(self.facade, task)
        try:
            while self._wake_pending and not (self._disposing or self.store_failure is not None):
                self._wake_pending = False
                if not self.has_work():
                    continue
                self._turns += 1
                turn = self._turn = Turn(self, self.log.state.turn + 1)
                try:
                    continue_after = await turn.run()
                    if not continue_after:  # aborted by any path, its deadline included
                        subagents.cancel_children(self)
                        if turn.cancel_cause is None:  # its deadline: a cancel made now
                            self._cancel_wakes = self._wakes
                finally:
                    self._turn = None
                    if self.calls is not None:
                        self.calls.released(turn.number)  # a run() may return now
                if self._disposing:
                    continue
                if continue_after or self._wakes != self._cancel_wakes:
                    # work queued after the cancel that aborted this turn was never cancelled
                    self._wake_pending = self._wake_pending or self.has_work()
        finally:
            self._driver_task = None
            self._driving = False
            if self._disposing:
                self._mark_stopped()
            self._set_status("idle")
        if self.store_failure is not None and self._on_store_stop is not None:
            await self._on_store_stop.dispose()  # a store failure stops this agent only

    def _mark_stopped(self) -> None:
        if self._stopped is None:
            self._stopped = _STOPPED
        else:
            self._stopped.set()

    def begin_stop(self, cause: str = "disposed") -> None:
        """Cancel the running turn (keeping the inbox) and tell the driver to end; never waits.

        From here on the agent takes no messages (``AgentClosedError``).
        """
        self.cancel(cause, keep_inbox=True)
        self._disposing = True
        if self.calls is not None:
            self.calls.close()  # calls still queued raise AgentClosedError
        if not self._driving:
            self._set_status("idle")
            self._mark_stopped()

    async def stop(self, cause: str = "disposed") -> None:
        """``begin_stop``, then wait for the driver to end."""
        self.begin_stop(cause)
        if self._stopped is None:
            self._stopped = Latch()
        await self._stopped.wait()

    @property
    def closed(self) -> bool:
        """True once disposal has begun (the agent takes no more messages)."""
        return self._disposing

    def in_driver_tree(self) -> bool:
        """True when the calling task is this agent's driver or runs under it.

        That is the turn itself, its tools and hooks, and any task they started: code that the
        driver waits for, so it must never wait for the driver to stop.
        """
        driver = self._driver_task
        if driver is None:
            return False
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None:
            if task is driver:
                return True
            nursery = task.parent_nursery
            task = nursery.parent_task if nursery is not None else None
        return False

    @property
    def nursery(self) -> trio.Nursery | None:
        """The agent's own nursery (its task's) while attached; where its driver runs."""
        return self._nursery

    @property
    def driving(self) -> bool:
        """True while the driver is running or about to (its task started)."""
        return self._driving

    @property
    def stopped(self) -> bool:
        """True once disposal has begun and the driver has ended for good."""
        return self._stopped is not None and self._stopped.is_set()

    def flush(self) -> Awaitable[None]:
        """Wait until everything appended to the session is durable: ``await agent.flush()``.

        The one durability barrier: every flush of the agent's session goes through here. It
        returns the writer's own awaitable (no coroutine of its own: it runs for every tool call).
        """
        writer = self.writer
        return _durable() if writer is None else writer.flush()

    def statistics(self) -> AgentStatistics:
        """A snapshot of this agent's counters."""
        return AgentStatistics.of(
            turns=self._turns,
            events=len(self.log),
            status=self._status,
            subscribers=len(self._subscribers),
            now=self.log.state.counters(),
            base=self._uncounted,
        )
