"""``Agent``: the public face of one live agent — the verbs and properties users call.

A thin façade (``docs/embedding.md``, "The Agent API"): identity (``id``, ``session_id``,
``options``), the read-only ``session``, ``status``, messaging (``send``, ``followup``,
``steer``, ``inject``, ``inbox``), ``cancel``, ``wait_idle``, ``subscribe``, ``run`` and
``run_stream``, approvals, context (``context_usage``, ``compact``, ``replace_history``),
``statistics``, durability (``flush``), the sub-agent tree (``parent``, ``children``) and
``closed``. Each verb hands over to the agent's actor (``_agent/_actor.py``: the wakes, the
driver, commits and deliveries) or to the turn-machine module that implements it, given the
actor as its context. The façade holds nothing but its actor — one small object per agent — and
is nobody's context: hook payloads carry it, the machinery never receives it.

``actor_of`` gives the actor of a façade to the runtime's own lifecycle code and to tests
(``dsh_agent_loop.testing.actor_of``); it is no part of the user's API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, final

from .._session.log import SessionView
from .._session.projections import NEXT_STEP, NEXT_TURN
from . import approvals, calls, context
from ._actor import AgentActor, Status
from .compaction import compact_now

if TYPE_CHECKING:
    from trio_util import AsyncValue

    from .._session.log import Session
    from ..events import Event
    from .compaction import Compacted
    from .context import ContextUsage
    from .inbox import Inbox, MessageInput, Target
    from .options import AgentOptions
    from .results import ApprovalRequest, TurnResult
    from .services import Services
    from .statistics import AgentStatistics
    from .subscription import Subscription

__all__ = ["Agent", "actor_of"]


@final
class Agent:
    """One live agent, as its users see it (made by ``rt.agents.create``/``resume``/``fork``).

    Every name here is described in ``docs/embedding.md``; the machinery is the actor's.
    """

    __slots__ = ("_actor",)

    def __init__(
        self,
        *,
        options: AgentOptions,
        session: Session,
        services: Services,
        parent: Agent | None = None,
    ) -> None:
        self._actor: AgentActor[Agent] = AgentActor(
            self,
            options=options,
            session=session,
            services=services,
            parent=None if parent is None else parent._actor,
        )

    def __repr__(self) -> str:
        actor = self._actor
        return f"<Agent {actor.id!r} session={actor.session_id!r} {actor.status_now}>"

    # -- identity ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The agent id (``AgentOptions.id``)."""
        return self._actor.id

    @property
    def session_id(self) -> str:
        """The id of the agent's session."""
        return self._actor.session_id

    @property
    def options(self) -> AgentOptions:
        """The options the agent runs with (given, or remembered by its log on a resume)."""
        return self._actor.options

    @property
    def session(self) -> SessionView:
        """The agent's session, read-only: ``id``, ``header``, ``events``, ``derive_messages``."""
        return SessionView(self._actor.log)

    @property
    def status(self) -> AsyncValue[Status]:
        """``"idle"`` or ``"running"`` as a ``trio_util.AsyncValue`` (made on first use)."""
        return self._actor.status

    @property
    def closed(self) -> bool:
        """True once disposal has begun (the agent takes no more messages)."""
        return self._actor.closed

    # -- the tree ----------------------------------------------------------------------------
    @property
    def parent(self) -> Agent | None:
        """The agent that created this one as a sub-agent (None for a top-level agent)."""
        parent = self._actor.parent
        return None if parent is None else parent.facade

    @property
    def children(self) -> tuple[Agent, ...]:
        """Live sub-agents, in creation order: a cancel of this agent's turn reaches them."""
        return tuple(child.facade for child in self._actor.children)

    # -- messaging ---------------------------------------------------------------------------
    @property
    def inbox(self) -> Inbox:
        """The pending messages: ``pending``, ``next_turn``, ``next_step``, ``edit``, ``remove``."""
        return self._actor.inbox

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
        return self._actor.send(message, target, wake, message_id=message_id)

    def followup(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue a prompt for the next turn and wake the driver (see ``send``)."""
        return self._actor.send(message, NEXT_TURN, True, message_id=message_id)

    def steer(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue guidance for the next step and wake the driver (see ``send``)."""
        return self._actor.send(message, NEXT_STEP, True, message_id=message_id)

    def inject(self, message: MessageInput, *, message_id: str | None = None) -> str:
        """Queue context for the next step without waking the driver (see ``send``)."""
        return self._actor.send(message, NEXT_STEP, False, message_id=message_id)

    def cancel(
        self, cause: str = "user", keep_inbox: bool = False, *, message: str | None = None
    ) -> None:
        """Abort the running turn (the first cause wins); clear the inbox unless ``keep_inbox``.

        A cancel reaches only what exists when it is made: the turn running (or the continuation
        of decided approvals already due, which then runs aborted) and the inbox as it is now.
        Work queued afterwards is untouched and runs once the aborted turn has ended.
        """
        self._actor.cancel(cause, keep_inbox, message=message)

    async def wait_idle(self) -> None:
        """Wait until the driver is parked: no open turn and no unprocessed wake."""
        await self._actor.wait_idle()

    def subscribe(
        self, types: Iterable[str] | None = None, max_buffer: float = 1024
    ) -> AbstractAsyncContextManager[Subscription]:
        """Receive this agent's committed events and notifications (``seq=None``).

        A subscriber that falls ``max_buffer`` behind gets what was buffered, then
        ``SubscriberOverflowError`` (``_agent/subscription.py``).
        """
        return self._actor.subscribe(types, max_buffer)

    # -- calls: a message as an awaitable turn (_agent/calls.py) -----------------------------
    async def run(
        self,
        message: MessageInput,
        *,
        output_type: Any = None,
        output_retries: int = 2,
        message_id: str | None = None,
        wait_for_approvals: bool = False,
    ) -> TurnResult:
        """Queue ``message`` next-turn and return the result of the turn that claims it.

        Raises:
            ApprovalPendingError: tool calls wait for a decision, so the message would wait
                behind them; nothing was queued (``wait_for_approvals=True`` queues it anyway).
            AgentClosedError: the agent is disposed (or was, before the message ran).
            TurnFailedError: the turn ended ``error``.
            TurnBlockedError: the turn ended ``blocked``.
            TurnAbortedError: the turn was aborted by another cause than this caller's cancel.
        """
        return await calls.run(
            self._actor,
            message,
            output_type=output_type,
            output_retries=output_retries,
            message_id=message_id,
            wait_for_approvals=wait_for_approvals,
        )

    def run_stream(
        self,
        message: MessageInput,
        *,
        output_type: Any = None,
        output_retries: int = 2,
        message_id: str | None = None,
        wait_for_approvals: bool = False,
    ) -> AbstractAsyncContextManager[calls.RunStream]:
        """Queue ``message`` next-turn and stream the turn that claims it (``RunStream``).

        Leaving the block before the turn ended cancels it as a cancelled ``run()`` would.
        Entering raises ``ApprovalPendingError`` as ``run()`` does.
        """
        return calls.run_stream(
            self._actor,
            message,
            output_type=output_type,
            output_retries=output_retries,
            message_id=message_id,
            wait_for_approvals=wait_for_approvals,
        )

    # -- approvals (_agent/approvals.py) ------------------------------------------------------
    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """Tool calls waiting for ``approve`` or ``deny``, in model order."""
        return approvals.pending(self._actor)

    def approve(self, call_id: str, *, always: bool = False) -> str | None:
        """Approve a pending call; ``always`` also allows calls like it (the rule recorded)."""
        return self._actor.approve(call_id, always=always)

    def deny(self, call_id: str, message: str | None = None) -> None:
        """Deny a pending call: it gets a ``DENIED`` result carrying ``message``."""
        self._actor.deny(call_id, message)

    async def resolve_approvals(self, decisions: Mapping[str, bool | str]) -> TurnResult:
        """Decide pending calls (True approves, a string denies); the continuation's result."""
        return await approvals.resolve(self._actor, decisions)

    # -- context (_agent/context.py, _agent/compaction.py) -------------------------------------
    def context_usage(self) -> ContextUsage:
        """The next request's estimated input tokens against the route's context window."""
        return context.context_usage(self._actor)

    async def compact(self, instructions: str | None = None) -> Compacted | None:
        """Compact the older history now (between turns); None when nothing is old enough."""
        return await compact_now(self._actor, instructions)

    def replace_history(self, start_seq: int, end_seq: int, message: MessageInput) -> Event:
        """Replace surface events ``start_seq..end_seq`` by one message (``docs/context.md``)."""
        return context.replace_history(self._actor, start_seq, end_seq, message)

    # -- durability and counters -------------------------------------------------------------
    def flush(self) -> Awaitable[None]:
        """Wait until everything appended to the session is durable: ``await agent.flush()``."""
        return self._actor.flush()

    def statistics(self) -> AgentStatistics:
        """A snapshot of this agent's counters."""
        return self._actor.statistics()


def actor_of(agent: Agent) -> AgentActor[Agent]:
    """The actor behind ``agent`` (the runtime's lifecycle and tests; not a user API)."""
    return agent._actor
