"""What the turn machine sees of its agent, of the running turn, and of a turn's step.

The turn machine (``turn``, ``attempt``, ``tool_calls``, ``step_inputs``, ``compaction``,
``context``, ``output``, ``approvals``, ``subagents``, ``calls``, ...) is handed the agent's
actor (``_agent/_actor.py``) typed as ``TurnContext``: a ``Protocol`` the actor satisfies, so no
object is made per agent for it. The machine never imports the public ``Agent``
(``_agent/agent.py``) nor the actor's module, not even for types: it depends downward only, and
the public façade is nobody's context (``docs/architecture.md``). A module that needs a little
more of the actor than this (``calls``, ``approvals``) extends the protocol where it is used.

Hook payloads and public return values carry ``TurnContext.facade``, the public ``Agent``: users
see only the façade. Everything here is read, except the few fields the machine itself keeps on
its agent (marked so below).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import trio

    from .._frozen import FrozenDict
    from .._hooks import HookChain
    from .._sandbox import Workspace
    from .._session.log import Session
    from ._permissions import Gate
    from ._tokens import ContextTracker
    from .inbox import Inbox
    from .options import AgentOptions, CompactionPolicy
    from .output import OutputRegistry
    from .prompt import PromptAssembly
    from .series import RequestSeries
    from .services import AgentScope, Services

__all__ = ["RunningTurn", "StepState", "TurnContext"]


class RunningTurn(Protocol):
    """What the agent's context shows of its turn in progress."""

    @property
    def number(self) -> int:
        """The turn number."""
        ...

    @property
    def in_pre_step(self) -> bool:
        """An ``agent/pre-step`` listener is running (``replace_history`` is allowed)."""
        ...

    @property
    def scope(self) -> trio.CancelScope | None:
        """The turn's cancel scope; None once its ``turn/end`` is appended."""
        ...


class StepState(Protocol):
    """What a model call (``Attempt``) and compaction see of the turn whose step they serve."""

    @property
    def number(self) -> int:
        """The turn number."""
        ...

    @property
    def step(self) -> int:
        """The step in progress."""
        ...

    @property
    def rendered(self) -> str:
        """The rendered system prompt of the step's assembly."""
        ...

    @property
    def schemas(self) -> tuple[FrozenDict, ...]:
        """The tool schemas the step offers."""
        ...

    @property
    def pending_users(self) -> tuple[FrozenDict, ...]:
        """User messages the step will admit."""
        ...

    tokens: int
    """Tokens the turn's model calls reported (the attempt adds its own)."""
    max_tokens: bool
    """The step's model call stopped at the output-token cap (set by the attempt)."""
    truncated: bool
    """The cap cut a tool call (set by the attempt)."""

    def admit_users(self) -> None:
        """Append the step's pending user messages (once)."""
        ...


class TurnContext(Protocol):
    """The agent as its turn machine sees it (the actor satisfies this)."""

    # -- what the machine keeps on its agent (written by it) -------------------------------
    store_failure: BaseException | None
    """The store failure that stops the agent (set by the turn that meets it)."""
    continuation_cancel: str | None
    """The cause of a ``cancel()`` that found a continuation due (``_agent/approvals.py``)."""
    context: ContextTracker | None
    """Token accounting of the history (``_agent/context.py``); made on first use."""
    outputs: OutputRegistry | None
    """Structured-output registrations (``_agent/output.py``); made on first use."""
    permission_gate: Gate | None
    """The judge of the agent's calls (``_agent/_judge.py``); made on first use."""

    # -- read ---------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The agent id."""
        ...

    @property
    def facade(self) -> object:
        """The public ``Agent``: what hook payloads and public return values carry."""
        ...

    @property
    def options(self) -> AgentOptions:
        """The agent's options."""
        ...

    @property
    def log(self) -> Session:
        """The agent's (writable) session."""
        ...

    @property
    def services(self) -> Services:
        """What the runtime lends its agents."""
        ...

    @property
    def hooks(self) -> HookChain:
        """The runtime's hooks, then the agent's scoped ones."""
        ...

    @property
    def scope(self) -> AgentScope:
        """The agent's scoped tools, hooks and persona."""
        ...

    @property
    def inbox(self) -> Inbox:
        """The agent's pending messages."""
        ...

    @property
    def series(self) -> RequestSeries:
        """This instance's requests: prompt reconciliation and request records."""
        ...

    @property
    def parent(self) -> TurnContext | None:
        """The agent that created this one as a sub-agent, while it is live."""
        ...

    @property
    def children(self) -> tuple[TurnContext, ...]:
        """Live sub-agents: a cancel of this agent's turn reaches them."""
        ...

    @property
    def compaction(self) -> CompactionPolicy | None:
        """The compaction policy in force: the agent's own, else the runtime's."""
        ...

    @property
    def workspace(self) -> Workspace:
        """What the agent's built-in tools keep to."""
        ...

    @property
    def running_turn(self) -> RunningTurn | None:
        """The turn in progress, if any."""
        ...

    @property
    def closed(self) -> bool:
        """True once disposal has begun."""
        ...

    def default_assembly(self) -> PromptAssembly:
        """The default prompt assembly (rebuilt only when its inputs change)."""
        ...

    # -- act ----------------------------------------------------------------------------------
    def flush(self) -> Awaitable[None]:
        """Wait until everything appended to the session is durable."""
        ...

    def notify(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Publish notification ``event_type`` (``seq=None``) if anyone listens."""
        ...

    def listening(self, event_type: str) -> bool:
        """True when someone would receive notification ``event_type``."""
        ...

    def cancel(
        self, cause: str = "user", keep_inbox: bool = False, *, message: str | None = None
    ) -> None:
        """Abort the running turn (the first cause wins); clear the inbox unless kept."""
        ...

    def abort_turn(self, number: int, cause: str = "user") -> None:
        """Abort turn ``number`` if it is running; what is queued behind it stays."""
        ...

    def in_driver_tree(self) -> bool:
        """True when the calling task is the agent's driver or runs under it."""
        ...
