"""What a step starts from: prompt assembly, runtime context, pre-step, user messages.

Each input is a waterfall hook whose default is computed here; when nobody listens the default
is computed directly, without a coroutine. The default prompt assembly is rebuilt only when
something it depends on changed (``AssemblyCache``), so the same assembly, and with it the same
tool schemas, is reused step after step (docs/design.md#step-inputs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

from .._errors import InvalidOptionError
from .._frozen import FrozenDict
from ..events import HOOK_ASSEMBLE, HOOK_PRE_STEP, HOOK_RUNTIME_CONTEXT
from .inbox import user_message
from .prompt import PromptAssembly, PromptSection
from .request import PreStepDecision

if TYPE_CHECKING:
    from .._tools.base import Tool
    from ._turn_context import TurnContext

__all__ = [
    "NO_RUNTIME_CONTEXT",
    "AssemblyCache",
    "assemble",
    "check_tools",
    "collect_context",
    "default_context",
    "normalise_users",
    "pre_step",
    "visible_tools",
]

NO_RUNTIME_CONTEXT: Final = "no runtime context"
#: Distinct default assemblies a runtime shares among its agents.
SHARED_ASSEMBLIES: Final = 256


@final
class AssemblyCache:
    """The default ``PromptAssembly`` of one agent and the inputs it was built from."""

    __slots__ = ("_assembly", "_key")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._assembly: PromptAssembly | None = None

    def get(self, agent: TurnContext) -> PromptAssembly:
        """The default assembly: runtime and agent persona sections, every visible tool."""
        services = agent.services
        runtime_persona = services.persona()
        runtime = services.tools()
        scoped = agent.scope.tools
        persona = agent.scope.persona
        names = agent.options.tools  # which runtime tools this agent sees: part of the key
        key = (runtime_persona, persona, names, tuple(runtime.values()), tuple(scoped.values()))
        if self._assembly is not None and self._key == key:
            return self._assembly
        shared = services.assemblies.get(key)
        if shared is not None:  # agents alike share one key and one (frozen) assembly
            self._key, self._assembly = shared
            return shared[1]
        sections = []
        if runtime_persona:
            sections.append(PromptSection("persona", runtime_persona))
        if persona:
            sections.append(PromptSection("persona", persona))
        assembly = PromptAssembly(sections, list(visible_tools(agent).values()))
        self._key, self._assembly = key, assembly
        if len(services.assemblies) < SHARED_ASSEMBLIES:
            services.assemblies[key] = (key, assembly)
        return assembly


def visible_tools(agent: TurnContext) -> dict[str, Tool]:
    """Runtime tools the options allow, plus the agent's scoped tools."""
    runtime = agent.services.tools()
    names = agent.options.tools
    if names is None:
        tools = dict(runtime)
    else:
        tools = {}
        for name in names:
            found = runtime.get(name) or agent.services.builtin(name)
            if found is not None:
                tools[name] = found
    tools.update(agent.scope.tools)
    return tools


def check_tools(agent: TurnContext) -> None:
    """Check that every name in ``agent.options.tools`` is a runtime or built-in tool.

    Raises:
        InvalidOptionError: a name that is neither (the agent's creation is refused).
    """
    names = agent.options.tools
    if names is None:
        return
    runtime = agent.services.tools()
    unknown = [n for n in names if n not in runtime and agent.services.builtin(n) is None]
    if unknown:
        raise InvalidOptionError(f"unknown tool name(s) in options.tools: {', '.join(unknown)}")


async def assemble(agent: TurnContext, turn: int, step: int) -> PromptAssembly:
    """Run ``system-prompt/assemble`` around the default assembly."""
    if not agent.hooks.has("waterfall", HOOK_ASSEMBLE):
        return agent.default_assembly()

    async def default(payload: Any) -> PromptAssembly:
        return agent.default_assembly()

    payload = {"agent": agent.facade, "turn": turn, "step": step}
    result = await agent.hooks.waterfall(HOOK_ASSEMBLE, payload, default)
    if not isinstance(result, PromptAssembly):
        raise TypeError(
            f"{HOOK_ASSEMBLE} must return a PromptAssembly, got {type(result).__name__}"
        )
    return result


def _cwd_text(agent: TurnContext) -> str:
    """The default runtime context: the agent's working directory, if it has one."""
    cwd = agent.options.cwd
    return f"cwd: {cwd}" if cwd else ""


def default_context(agent: TurnContext) -> FrozenDict | None:
    """The default runtime-context message (None when unchanged)."""
    return _context_message(agent, _cwd_text(agent))


async def collect_context(agent: TurnContext, turn: int, step: int) -> FrozenDict | None:
    """Run ``runtime-context/collect``; the runtime-context message, or None when unchanged."""
    if not agent.hooks.has("waterfall", HOOK_RUNTIME_CONTEXT):
        return default_context(agent)

    async def default(payload: Any) -> str:
        return _cwd_text(agent)

    text = await agent.hooks.waterfall(
        HOOK_RUNTIME_CONTEXT, {"agent": agent.facade, "turn": turn, "step": step}, default
    )
    return _context_message(agent, "" if text is None else str(text))


def _context_message(agent: TurnContext, text: str) -> FrozenDict | None:
    """The runtime-context user message for ``text``, or None when it is unchanged."""
    last = agent.log.state.runtime_context
    if not text:
        if last is None or last == NO_RUNTIME_CONTEXT:
            return None
        text = NO_RUNTIME_CONTEXT
    elif text == last:
        return None
    return user_message(f"m-{agent.log.inbox.max_id + 1}", text, source="runtime-context")


async def pre_step(
    agent: TurnContext, turn: int, step: int, messages: tuple[Any, ...]
) -> PreStepDecision:
    """Run ``agent/pre-step``; its default enters the step with ``messages``."""

    async def default(payload: Any) -> PreStepDecision:
        return PreStepDecision.enter(payload["messages"])

    payload = {"agent": agent.facade, "messages": messages, "turn": turn, "step": step}
    decision = await agent.hooks.waterfall(HOOK_PRE_STEP, payload, default)
    if not isinstance(decision, PreStepDecision):
        raise TypeError(
            f"{HOOK_PRE_STEP} must return a PreStepDecision, got {type(decision).__name__}"
        )
    return decision


def normalise_users(agent: TurnContext, messages: Sequence[Any]) -> tuple[FrozenDict, ...]:
    """Inbox messages as they are, anything else as a new ``user`` message with a fresh id."""
    if not messages:
        return ()
    out: list[FrozenDict] = []
    next_id = agent.log.inbox.max_id + 1
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user" and "id" in message:
            out.append(
                message
                if isinstance(message, FrozenDict)
                else user_message(message["id"], message["content"], message.get("source"))
            )
        else:
            out.append(user_message(f"m-{next_id}", message))
            next_id += 1
    return tuple(out)
