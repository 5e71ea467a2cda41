"""``Turn``: one turn of one agent, from ``turn/start`` to ``turn/end``.

See docs/design.md#turns-and-steps.

Every fact is appended before the next step is derived from it, and every exit path closes
what it opened, synchronously, before ``turn/end``: a stream in flight becomes an interrupted
``assistant/message`` carrying exactly the delivered prefix (or an ``assistant/attempt`` when
nothing was delivered; see ``Attempt.close``), every model tool call without a result is
settled by its ``ToolBatch``, an open step gets ``step/end``. A turn ends ``aborted`` exactly
when a cancel arrived before its ``turn/end`` was appended: the turn owns its cancel scope, and
the scope is dropped the moment ``turn/end`` is appended. Closing events are appended without
awaiting (``Session.add`` never blocks); only the final flush awaits, shielded and bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

import trio

from .._errors import AgentLoopError, StoreError
from .._frozen import FrozenDict, from_shape, shape
from .._session.projections import NEXT_STEP, NEXT_TURN
from .._session.records import BLOCKED, COMPLETED, MAX_TOKENS
from .._tools.results import escape_surrogates
from ..events import (
    AGENT_ERROR,
    HOOK_PRE_STEP,
    HOOK_TURN_STOPPING,
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
)
from ..llm import Failure
from . import approvals
from .attempt import Attempt
from .compaction import after_overflow
from .prompt import PromptAssembly, render
from .request import PreStepDecision
from .step_inputs import assemble, collect_context, default_context, normalise_users, pre_step
from .tool_calls import ToolBatch

if TYPE_CHECKING:
    from .._tools.base import Tool
    from ._turn_context import TurnContext
    from .options import TurnBudget
    from .output import OutputState

__all__ = ["CLOSE_FLUSH_TIMEOUT", "Turn", "TurnFailed"]

#: Seconds the closing flush of a turn may take after a cancel.
CLOSE_FLUSH_TIMEOUT: Final = 10.0
_ENTER: Final = PreStepDecision.enter(())
_NO_STEP: Final = FrozenDict()
# The shapes of payloads built on every turn (``from_shape``: one C call each).
_TURN_END = shape(("turn", "reason"))
_USER_MESSAGE = shape(("message",))


@final
class TurnFailed(AgentLoopError):
    """Ends the turn ``error`` with ``code``."""


def _primary(exc: BaseException) -> BaseException:
    """The first real failure inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = leaves[0] if leaves else exc.exceptions[0]
    return exc


@final
class Turn:
    """One turn: its cancel scope, its step in progress, and what its closers must settle."""

    __slots__ = (
        "agent",
        "assembly",
        "attempt",
        "awaiting",
        "batch",
        "budget",
        "cancel_cause",
        "cancel_message",
        "carried",
        "continues",
        "in_pre_step",
        "max_tokens",
        "number",
        "output",
        "pending_users",
        "rendered",
        "schemas",
        "scope",
        "step",
        "step_data",
        "step_open",
        "tokens",
        "tool_calls",
        "tools",
        "truncated",
        "users_admitted",
        "winding_down",
    )

    def __init__(self, agent: TurnContext, number: int) -> None:
        self.agent = agent
        self.number = number
        """The turn number (``turn/start`` data)."""
        self.scope: trio.CancelScope | None = trio.CancelScope()
        """Cancels the turn; None once ``turn/end`` is appended (a later cancel is too late)."""
        self.cancel_cause: str | None = None
        self.cancel_message: str | None = None
        self.winding_down = False
        """A cancel arrived: a message steered now goes to ``next-turn``."""
        self.budget: TurnBudget | None = agent.options.turn_budget or agent.services.turn_budget()
        self.step = 0
        self.step_open = False
        self.step_data: FrozenDict = _NO_STEP
        """``{turn, step}``: ``step/start`` and ``step/end`` share it."""
        self.attempt: Attempt | None = None
        """The step's latest model call."""
        self.batch: ToolBatch | None = None
        """The step's tool calls while they run."""
        self.pending_users: tuple[FrozenDict, ...] = ()
        """User messages the step will admit (kept if a hook fails before they are sent)."""
        self.users_admitted = False
        self.max_tokens = False
        self.truncated = False
        self.continues = False
        self.tool_calls = 0
        self.tokens = 0
        self.assembly: PromptAssembly | None = None
        self.tools: dict[str, Tool] = {}
        self.schemas: tuple[FrozenDict, ...] = ()
        self.rendered = ""
        self.output: OutputState | None = None
        """Set when the turn must end with a ``final_result`` call (``_agent/output.py``)."""
        self.awaiting: FrozenDict | None = None
        """The ``turn/end`` reason once a step deferred calls (``_agent/approvals.py``)."""
        self.in_pre_step = False
        """An ``agent/pre-step`` listener is running (``replace_history`` is allowed)."""
        self.carried: ToolBatch | None = None
        """A continuation's decided calls, settled in its first step (``_agent/approvals.py``)."""
        if agent.log.state.approvals is not None:
            self.carried, cause = approvals.prepare(agent, number)
            if cause is not None:
                self.cancel(cause, None)

    def cancel(self, cause: str, message: str | None) -> None:
        """Abort the turn unless its ``turn/end`` is appended; the first cause wins."""
        scope = self.scope
        if scope is None:
            return
        if self.cancel_cause is None:
            self.cancel_cause = cause
            self.cancel_message = message
        self.winding_down = True
        scope.cancel()

    async def run(self) -> bool:
        """Run the turn; False when it ended ``aborted`` (pending work then waits for a wake)."""
        agent = self.agent
        session = agent.log
        scope = self.scope
        assert scope is not None
        budget = self.budget
        if budget is not None and budget.max_seconds is not None:
            scope.deadline = trio.current_time() + budget.max_seconds
        session.add(TURN_START, agent.services.records.turn_data(self.number))
        if self.carried is None:
            claimed = agent.inbox.claim(NEXT_STEP) + agent.inbox.claim(NEXT_TURN, 1)
        elif self.cancel_cause is None:  # a continuation takes no next-turn message
            claimed = agent.inbox.claim(NEXT_STEP)
        else:  # a continuation a cancel aborted: what was queued after that cancel stays queued
            claimed = ()
        if agent.outputs is not None:  # someone asked for structured output (_agent/output.py)
            if self.carried is not None:  # a continuation owes what its turn asked for
                self.output = None if self.cancel_cause else agent.outputs.resume(self.number)
            else:
                self.output = agent.outputs.claim(self.number, claimed, session.inbox)
        ended = False
        reason: Mapping[str, Any] | None = None
        try:
            try:
                with scope:
                    reason = await self._body(claimed)
            except Exception as exc:  # middleware, tools, store: ends the turn, not the loop
                reason = self.error_reason(exc)
            if scope.cancel_called:
                reason = self.aborted_reason()
            self.close_open_work()
            assert reason is not None
            if reason["kind"] == "error" and self.pending_users:
                self.admit_users()  # the session shows what was asked, even if never sent
            session.add(TURN_END, from_shape(_TURN_END, (self.number, reason)))
            ended = True
            outputs = agent.outputs
            if reason is self.awaiting and self.output is not None and outputs is not None:
                outputs.carry(self.output)  # its continuation owes the output
        finally:
            if not ended:  # cancelled from outside the turn scope (runtime shutdown)
                self.close_open_work()
                reason = self.aborted_reason(default_cause="disposed")
                session.add(TURN_END, from_shape(_TURN_END, (self.number, reason)))
            self.scope = None
            await self._final_flush(reason is None or reason["kind"] == "aborted")
        return reason is not None and bool(reason["kind"] != "aborted")

    # -- ending ---------------------------------------------------------------------------
    async def _final_flush(self, cancelled: bool) -> None:
        """Make the turn durable; after a cancel, shielded and bounded (``CLOSE_FLUSH_TIMEOUT``).

        A turn that ended by itself flushes like any other step (no deadline left behind in
        trio's timer heap for every turn of every agent).
        """
        try:
            if cancelled:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_FLUSH_TIMEOUT):
                    await self.agent.flush()
            else:
                await self.agent.flush()
        except StoreError as exc:
            self._store_failed(exc)

    def _store_failed(self, exc: StoreError) -> None:
        agent = self.agent
        if agent.store_failure is not None:
            return  # already reported when the failure ended the turn
        agent.store_failure = exc
        code = "OWNERSHIP_LOST" if exc.code == "OWNERSHIP_LOST" else "STORE_FAILED"
        error = FrozenDict(code=code, message=str(exc))
        agent.notify(AGENT_ERROR, {"turn": self.number, "step": self.step, "error": error})

    def error_reason(self, exc: BaseException) -> FrozenDict:
        """The ``turn/end`` reason for a failure (and its ``agent/error``)."""
        agent = self.agent
        exc = _primary(exc)
        if isinstance(exc, StoreError):
            agent.store_failure = exc
            code = "OWNERSHIP_LOST" if exc.code == "OWNERSHIP_LOST" else "STORE_FAILED"
        elif isinstance(exc, AgentLoopError):
            code = exc.code
        else:
            code = "HOOK_FAILED"
        try:
            message = str(exc)
        except Exception:  # a __str__ that raises (or returns a non-str) still names the type
            message = ""
        message = escape_surrogates(message or type(exc).__name__)
        if not isinstance(exc, AgentLoopError):
            message = f"{type(exc).__name__}: {message}"
        error = FrozenDict(code=code, message=message)
        agent.notify(AGENT_ERROR, {"turn": self.number, "step": self.step, "error": error})
        return FrozenDict(kind="error", error=error)

    def aborted_reason(self, default_cause: str = "user") -> FrozenDict:
        """The ``turn/end`` reason of a cancelled turn: its first cause (or the budget)."""
        cause, message = self.cancel_cause, self.cancel_message
        budget = self.budget
        if cause is None and budget is not None and budget.max_seconds is not None:
            cause, message = "hook", f"turn budget: maxSeconds {budget.max_seconds:g} exceeded"
        data: dict[str, Any] = {"kind": "aborted", "cause": cause or default_cause}
        if message:
            data["message"] = message
        return FrozenDict(data)

    def admit_users(self) -> None:
        """Append the step's pending user messages (once)."""
        if self.users_admitted:
            return
        session = self.agent.log
        for message in self.pending_users:
            session.add(USER_MESSAGE, from_shape(_USER_MESSAGE, (message,)))
        self.users_admitted = True
        self.pending_users = ()

    def close_open_work(self) -> None:
        """Append what keeps the log well formed after a cancel or failure (synchronous)."""
        carried, self.carried = self.carried, None
        if carried is not None:  # an unfinished continuation: every decided call gets a result
            carried.close_remaining()
        attempt, self.attempt = self.attempt, None  # (no reference cycle through an Attempt)
        if attempt is not None:
            calls = attempt.close()
            if calls:
                self.batch = ToolBatch(self.agent, {}, calls, self.number, self.step)
        if self.batch is not None:
            self.batch.close_remaining()
            self.batch = None
        if self.step_open:
            self.agent.log.add(STEP_END, self.step_data)
            self.step_open = False

    # -- steps ----------------------------------------------------------------------------
    async def _body(self, claimed: tuple[FrozenDict, ...]) -> FrozenDict:
        agent = self.agent
        hooks = agent.hooks
        pending = agent.log.inbox.lists
        entering: tuple[Any, ...] = claimed
        while True:
            step = self.step + 1
            self.pending_users = normalise_users(agent, entering)  # kept if a hook below fails
            self.users_admitted = False
            if hooks.any("waterfall"):
                assembly = await assemble(agent, self.number, step)
                context_message = await collect_context(agent, self.number, step)
            else:  # no middleware at all: the defaults, without a coroutine each
                assembly = agent.default_assembly()
                context_message = default_context(agent)
            if self.budget is not None:
                await self._check_step_budget()
            if hooks.has("waterfall", HOOK_PRE_STEP):
                self.in_pre_step = True
                try:
                    decision = await pre_step(agent, self.number, step, entering)
                finally:
                    self.in_pre_step = False
                if decision.kind == "reject":
                    self.pending_users = ()  # consumed: a rejected turn admits nothing
                    return BLOCKED
                users = normalise_users(agent, decision.messages)
            else:
                decision = _ENTER  # no listener: enter with what the inbox gave
                users = self.pending_users
            if step == 1 and not users and self.carried is None:
                self.pending_users = ()
                return COMPLETED
            context = (context_message,) if context_message is not None else ()
            self.pending_users = context + users
            self.users_admitted = False
            await self._run_step(step, assembly, decision)
            if self.truncated:
                raise TurnFailed(
                    "a tool call was cut by the output-token cap", code="TRUNCATED_TOOL_CALL"
                )
            if self.awaiting is not None:
                return self.awaiting  # calls wait for a decision (_agent/approvals.py)
            if self.output is not None and self.output.done:
                return COMPLETED  # a valid final_result: no further request
            if not self.continues and not pending[NEXT_STEP]:
                await hooks.serial(HOOK_TURN_STOPPING, {"agent": agent.facade, "turn": self.number})
                if not pending[NEXT_STEP]:
                    return MAX_TOKENS if self.max_tokens else COMPLETED
            entering = agent.inbox.claim(NEXT_STEP) if pending[NEXT_STEP] else ()

    async def _run_step(
        self, step: int, assembly: PromptAssembly, decision: PreStepDecision
    ) -> None:
        agent = self.agent
        session = agent.log
        self.step_data = agent.services.records.step_data(self.number, step)
        session.add(STEP_START, self.step_data)
        self.step, self.step_open = step, True
        self.continues = False
        if assembly is not self.assembly:
            self._assemble(assembly)
        if self.carried is not None:  # a continuation: settle the decided calls first
            await self._settle_carried()
        # Attempts until one yields an ``assistant/message``: inline, not a method, so that one
        # coroutine frame less stays alive through every model stream (with thousands of agents
        # mid-stream, what lives across a stream's pauses is what the collector promotes).
        number = 0
        overflowed = False
        while True:
            number += 1
            attempt = self.attempt = Attempt(self, agent, number)
            outcome = await attempt.run(decision)
            if not isinstance(outcome, Failure):
                message = outcome
                break
            policy = self.agent.compaction
            if outcome.code == "CONTEXT_OVERFLOW" and policy is not None and not overflowed:
                overflowed = True  # compact and retry once, without the retry policy's delay
                if await after_overflow(agent, self, policy):
                    continue
            retry = await attempt.offer_failure(outcome)
            if retry is None:
                raise TurnFailed(outcome.message, code=outcome.code)
            await trio.sleep(max(0.0, retry.delay))
        calls = [b for b in message["content"] if b["type"] == "tool-call"]
        if self.truncated:
            self.batch = ToolBatch(agent, self.tools, calls, self.number, step)
            self.batch.close_remaining()
            self.batch = None
        elif calls:
            batch = self.batch = ToolBatch(agent, self.tools, calls, self.number, step)
            if self.budget is not None:
                await self._check_tool_budget(len(calls))
            await batch.run()
            # A handler's cleanup may have replaced its Cancelled with another exception (a
            # TOOL_ERROR result now): a cancelled turn still stops here, before another request.
            await trio.lowlevel.checkpoint_if_cancelled()
            self.tool_calls += len(calls)
            self.batch = None
            self.continues = not batch.concludes_turn
            if batch.deferred:
                self.awaiting = approvals.awaiting_reason(batch.deferred)
        self._end_step(calls)

    async def _settle_carried(self) -> None:
        """Settle a continuation's decided calls: this turn's calls, counted by its budget."""
        carried = self.carried
        assert carried is not None
        if self.budget is not None:
            await self._check_tool_budget(len(carried))
        self.tool_calls += len(carried)
        await carried.run_decided(self.tools)
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled continuation asks no model
        self.carried = None

    def _end_step(self, calls: list[FrozenDict]) -> None:
        """Append the step's ``step/end``; a structured-output turn then checks its calls."""
        self.agent.log.add(STEP_END, self.step_data)
        self.step_open = False
        if self.output is not None and not self.truncated:
            self.output.after_step(self.agent.inbox, calls)

    def _assemble(self, assembly: PromptAssembly) -> None:
        """Take a new prompt assembly: its tools, their schemas, the rendered prompt."""
        self.assembly = assembly
        self.tools = {t.name: t for t in assembly.tools}
        self.schemas = tuple(t.schema for t in assembly.tools)
        self.rendered = render(assembly)
        if self.output is not None:
            self.tools, self.schemas = self.output.offer(self.tools, self.schemas)

    # -- budget ---------------------------------------------------------------------------
    async def _check_step_budget(self) -> None:
        budget = self.budget
        assert budget is not None
        message = None
        if budget.max_steps is not None and self.step >= budget.max_steps:
            message = f"turn budget: maxSteps {budget.max_steps} reached"
        elif budget.max_total_tokens is not None and self.tokens >= budget.max_total_tokens:
            message = (
                f"turn budget: maxTotalTokens {budget.max_total_tokens} reached ({self.tokens})"
            )
        if message is not None:
            self.agent.cancel(cause="hook", keep_inbox=True, message=message)
            await trio.lowlevel.checkpoint()

    async def _check_tool_budget(self, calls: int) -> None:
        budget = self.budget
        assert budget is not None
        if budget.max_tool_calls is not None and self.tool_calls + calls > budget.max_tool_calls:
            self.agent.cancel(
                cause="hook",
                keep_inbox=True,
                message=f"turn budget: maxToolCalls {budget.max_tool_calls} exceeded",
            )
            await trio.lowlevel.checkpoint()
