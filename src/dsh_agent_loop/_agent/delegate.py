"""The built-in ``delegate`` tool: hand a task to a sub-agent and return its answer.

``delegate_tool(rt, options)`` makes a tool the model calls with ``{task, child?}``. The agent
running the call (named by the call's ``ToolContext``) is the parent: its sub-agent
``<parent id>.<child>`` (``child`` defaults to the options' id) is created on first use with
``parent_agent`` set — its header names the parent's session — and reused while it lives, so a
child keeps the conversation of the tasks it was given before. The task runs as one awaited turn
of the child (``await child.run(task)``) and the tool's result is the child's answer text. A
child turn that ends badly is a ``TOOL_ERROR`` result naming the child's error code
(``TURN_FAILED``'s own code such as ``HTTP_5XX``, ``TURN_ABORTED``, ``AGENT_CLOSED``, ...),
which the parent's model reads like any tool failure. A child the runtime's bounds refuse
(``Limits.max_delegation_depth``, ``Limits.max_subagents``; ``_agent/subagents.py``) is a
``LIMIT_EXCEEDED`` result saying which bound was reached: the model can answer without it. A
child turn that ends waiting for a person's approval (``docs/security.md``) is a result saying
so, naming the calls (``meta.awaiting_approval``): the person decides them on the child (the CLI's
``chat`` asks, naming the child), and the child's answer comes with its continuation.

Cancellation needs nothing here: cancelling the parent's turn aborts the child's turn with cause
``parent`` (``_agent/subagents.py``), ``run()`` waits until the child's ``turn/end`` is stored,
and the ``Cancelled`` leaves the handler, so the parent's call is settled as cancelled like any
other tool call. Calls naming the same child are serialised (``concurrency_key``); different
children of one parent run in parallel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from .._errors import AgentLoopError, InvalidOptionError, LimitExceededError
from .._frozen import FrozenDict
from .._tools.base import Tool, ToolContext, ToolResult
from .options import AgentOptions
from .results import TurnError

if TYPE_CHECKING:
    from .lifecycle import Agents, Setup

__all__ = ["DEFAULT_DESCRIPTION", "delegate_tool"]

#: What the model reads about the tool unless ``description`` says otherwise.
DEFAULT_DESCRIPTION: Final = (
    "Delegate a self-contained task to a sub-agent and get its answer back. The sub-agent sees"
    " nothing of this conversation: put everything it needs in `task`. Calls naming the same"
    " `child` go to the same sub-agent, which remembers the tasks it was given before; a new"
    " name starts a fresh one (leave it out for the default sub-agent)."
)
_PARAMETERS: Final = FrozenDict(
    type="object",
    properties=FrozenDict(
        task=FrozenDict(type="string", minLength=1, description="The task, complete in itself."),
        child=FrozenDict(
            type="string",
            pattern="^[A-Za-z0-9_-]{1,64}$",
            description="Which sub-agent: the same name reuses it (letters, digits, - and _).",
        ),
    ),
    required=("task",),
    additionalProperties=False,
)


class _Runtime(Protocol):
    """What the tool needs of a runtime: its agent registry."""

    @property
    def agents(self) -> Agents: ...


def delegate_tool(
    rt: _Runtime,
    options_or_name: AgentOptions | str,
    *,
    name: str = "delegate",
    description: str | None = None,
    setup: Setup | None = None,
) -> Tool:
    """A tool that runs a task on a sub-agent of the calling agent and returns its answer.

    Args:
        rt: The runtime whose agents call the tool (``open_runtime``'s).
        options_or_name: The sub-agents' options (their ``id`` is the default child name and is
            prefixed with the parent's id), or the id of a sub-agent declared in the config's
            ``subagents:`` (``rt.subagents``).
        name: The tool name the model sees.
        description: What the model reads about the tool (default ``DEFAULT_DESCRIPTION``).
        setup: Run for each child created, like ``rt.agents.create``'s (scoped tools, hooks).

    Raises:
        InvalidOptionError: a name no declared sub-agent has, or invalid options.
    """
    template, setup = _template(rt, options_or_name, setup)
    template.validate()

    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        child_name = str(arguments.get("child") or template.id)
        return await _delegate(rt.agents, template, setup, context, child_name, arguments["task"])

    def same_child(arguments: Mapping[str, Any]) -> str:
        return str(arguments.get("child") or template.id)

    return Tool(
        name=name,
        description=description or DEFAULT_DESCRIPTION,
        parameters=_PARAMETERS,
        handler=handler,
        concurrency_key=same_child,
    )


def _template(
    rt: _Runtime, options_or_name: AgentOptions | str, setup: Setup | None
) -> tuple[AgentOptions, Setup | None]:
    if isinstance(options_or_name, AgentOptions):
        return options_or_name, setup
    declared: Mapping[str, tuple[AgentOptions, Setup | None]] = getattr(rt, "subagents", {})
    found = declared.get(options_or_name)
    if found is None:
        known = ", ".join(sorted(declared)) or "none declared"
        raise InvalidOptionError(
            f"no sub-agent {options_or_name!r} is declared in the config's subagents ({known})"
        )
    options, declared_setup = found
    return options, setup or declared_setup


async def _delegate(
    agents: Agents,
    template: AgentOptions,
    setup: Setup | None,
    context: ToolContext,
    child_name: str,
    task: str,
) -> ToolResult:
    parent = agents.get(context.agent_id)
    if parent is None or parent.session_id != context.session_id:
        return _failure(context.agent_id, "AGENT_CLOSED", "the calling agent is not live")
    child_id = f"{parent.id}.{child_name}"
    try:
        # the live child with this id, created as a sub-agent of the parent if absent
        child = agents.get(child_id)
        if child is None:
            options = attrs.evolve(template, id=child_id)
            child = (await agents.create(options=options, setup=setup, parent_agent=parent)).agent
        elif child.parent is not parent:
            raise InvalidOptionError(
                f"agent {child.id!r} is live and not a sub-agent of {parent.id!r}"
            )
        result = await child.run(task)
    except LimitExceededError as exc:
        return ToolResult(
            f"Error: sub-agent {child_id!r} was not created: {exc}",
            error=exc.code,
            meta={"child_id": child_id, "code": exc.code},
        )
    except TurnError as exc:
        return _failure(child_id, exc.code, str(exc))
    except AgentLoopError as exc:  # create refused, or the child was disposed meanwhile
        return _failure(child_id, exc.code, str(exc))
    meta: dict[str, Any] = {
        "child_id": child.id,
        "session_id": child.session_id,
        "turn": result.turn,
    }
    waiting = result.pending_approvals
    if result.reason.get("kind") == "awaiting-approval" and waiting:
        # The person decides the child's calls (``chat`` asks, naming the child); the model
        # learns that the answer is not there yet instead of reading an empty one.
        meta["awaiting_approval"] = [r.call_id for r in waiting]
        calls = ", ".join(f"{r.name} ({r.call_id})" for r in waiting)
        text = f"{result.text}\n\n" if result.text else ""
        return ToolResult(
            f"{text}[sub-agent {child.id!r} is waiting for a person to approve: {calls}; "
            "its answer is not available yet]",
            meta=meta,
        )
    return ToolResult(result.text, meta=meta)


def _failure(child_id: str, code: str, message: str) -> ToolResult:
    return ToolResult(
        f"Error: sub-agent {child_id!r} failed with {code}: {message}",
        error="TOOL_ERROR",
        meta={"child_id": child_id, "code": code},
    )
