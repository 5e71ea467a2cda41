"""Sub-agents: a parent's cancel reaches its children's turns, and the prefix a fork inherits.

A child is an agent created with ``parent_agent`` (or by a view from ``with_initiator``): its
session header names the parent's session (``parent_session_id``), and while both are live the
parent lists it in ``Agent.children`` (``_agent/lifecycle.py`` links and unlinks them).

Cancel propagation rule: whenever the parent's running turn is cancelled — ``agent.cancel``, a
cancelled ``run()`` caller (``abort_turn``), a turn budget, a disposal — each live child's running
turn is aborted with cause ``parent`` (``turn/end {aborted, cause: parent}``,
docs/design.md#sub-agents), and so on
down the tree, synchronously, before the parent's turn has even wound down. A deadline
(``maxSeconds``) cancels the parent's scope without a call: a ``run()`` of the child made from
inside the parent's cancelled turn (the ``delegate`` tool's) then aborts the child's turn with
cause ``parent`` too (``abort_cause``), and any other child's running turn is aborted when the
parent's turn has ended. Aborting a child's turn is ``abort_turn``: the messages queued behind it
stay and run next, as after any aborted turn; a child that is idle is left alone.

Forks (``Agents.fork``): the new session inherits the source's events with ``seq < at_seq``. A
cut inside an open turn is closed after the seed exactly as crash repair closes a turn
(``_session/repair.py``: results for the unanswered calls, ``step/end``, ``turn/end
{interrupted}``), so every fork is a well-formed log that a resume replays as it is.

Bounds (``Limits``, ``docs/subagents.md``): a model that delegates to itself, or asks for many
children at once, must not create agents without end. A sub-agent's depth is the number of
parents above it (a top-level agent's child is at depth 1) and may not pass
``max_delegation_depth``; live sub-agents of a runtime may not pass ``max_subagents``.
``SubagentCount`` counts a sub-agent from its creation's first step, before anything awaits,
so creations in flight count too: parallel ones cannot all pass a check that none of them has
entered yet. Past either bound the creation raises ``LimitExceededError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, final

from .._errors import InvalidOptionError, LimitExceededError
from .._frozen import FrozenDict
from .._session.repair import repair_events

if TYPE_CHECKING:
    from .._limits import Limits
    from ..events import Event
    from ._turn_context import TurnContext

__all__ = [
    "FORKED_FROM",
    "PARENT_SESSION_ID",
    "SubagentCount",
    "abort_cause",
    "cancel_children",
    "fork_closers",
    "fork_prefix",
    "fork_record",
    "links",
]

#: The header key of a fork: ``{session_id, at_seq}`` of the session and cut it was made from.
FORKED_FROM: Final = "forked_from"
#: The header key naming the session of the agent that created this one.
PARENT_SESSION_ID: Final = "parent_session_id"


@final
class SubagentCount:
    """Sub-agents of one runtime that are live or being created, bounded by ``Limits``."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0
        """Places taken: one per sub-agent from ``claim`` until its ``release``."""

    def claim(self, parent: TurnContext, limits: Limits) -> None:
        """Take a place for a new sub-agent of ``parent`` (synchronous: nothing can interleave).

        Raises:
            LimitExceededError: the child would be deeper than ``limits.max_delegation_depth``,
                or ``limits.max_subagents`` sub-agents are live or being created.
        """
        depth = 1  # the child's: one more than its parent's
        ancestor = parent.parent
        while ancestor is not None:
            depth += 1
            ancestor = ancestor.parent
        if depth > limits.max_delegation_depth:
            raise LimitExceededError(
                f"delegation depth limit {limits.max_delegation_depth} reached: agent"
                f" {parent.id!r} is at depth {depth - 1} and may create no sub-agent"
            )
        if self.held >= limits.max_subagents:
            raise LimitExceededError(
                f"live sub-agents limit {limits.max_subagents} reached: no sub-agent can be"
                " created until one is disposed"
            )
        self.held += 1

    def release(self) -> None:
        """Give back the place of a sub-agent that left the registry or was never entered."""
        self.held -= 1


def cancel_children(parent: TurnContext) -> None:
    """Abort each live child's running turn with cause ``parent`` (recursively, via its own)."""
    for child in tuple(parent.children):
        turn = child.running_turn
        if turn is not None:
            child.abort_turn(turn.number, "parent")


def abort_cause(agent: TurnContext, cause: str) -> str:
    """The cause an aborted turn of ``agent`` records: ``parent`` when its parent's turn is.

    A ``run()`` caller that gives up aborts its turn with cause ``user``; when that caller is
    cancelled because it runs inside its parent's cancelled turn (the ``delegate`` tool, its
    parent's deadline passed), the child's turn was in fact ended by the parent.
    """
    parent = agent.parent
    if cause != "user" or parent is None:
        return cause
    turn = parent.running_turn
    if turn is None or turn.scope is None or not turn.scope.cancel_called:
        return cause  # the parent's turn is not being cancelled (by any cause, a deadline too)
    return "parent" if parent.in_driver_tree() else cause


def fork_prefix(events: Sequence[Event], at_seq: int | None) -> list[Event]:
    """The events a fork of ``events`` cut at ``at_seq`` inherits (every one when None).

    Raises:
        InvalidOptionError: ``at_seq`` is not between 1 and the number of events.
    """
    if at_seq is None:
        if not events:
            raise InvalidOptionError("cannot fork a session with no stored events")
        return list(events)
    if isinstance(at_seq, bool) or not isinstance(at_seq, int):
        raise InvalidOptionError(f"at_seq must be an integer, got {type(at_seq).__name__}")
    if not 1 <= at_seq <= len(events):
        raise InvalidOptionError(
            f"at_seq must be between 1 and {len(events)} (the stored events), got {at_seq}"
        )
    return list(events[:at_seq])


def fork_closers(inherited: Sequence[Event], time: float) -> list[Event]:
    """What closes a turn the cut left open (none when the prefix ends between turns)."""
    return repair_events(inherited, time)


def fork_record(source_id: str, inherited: Sequence[Event]) -> FrozenDict:
    """The ``forked_from`` header value: the source session and the cut (its ``at_seq``)."""
    return FrozenDict(session_id=source_id, at_seq=len(inherited))


def links(header: Any) -> tuple[str | None, str | None]:
    """``(parent_session_id, forked_from session id)`` of a session header (None when absent)."""
    parent = header.get(PARENT_SESSION_ID)
    forked = header.get(FORKED_FROM)
    source = forked.get("session_id") if hasattr(forked, "get") else None
    return (
        parent if isinstance(parent, str) else None,
        source if isinstance(source, str) else None,
    )
