"""What a runtime lends its agents (``Services``) and what ``setup`` receives (``AgentScope``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._hooks import HookBus, HookChain, HookScope
from .._limits import DEFAULT_LIMITS, Limits
from .._permissions import Permissions
from .._sandbox import DEFAULT_SANDBOX, Sandbox
from .._session.records import RecordCache
from .._tools.base import register
from .options import CompactionPolicy, TurnBudget

if TYPE_CHECKING:
    from .._tools.base import Tool
    from ..llm import ModelRouter
    from ._permissions import CompiledPolicy, Gate
    from .prompt import PromptAssembly

__all__ = ["NO_HOOKS", "AgentScope", "Services"]

#: The inner bus of an agent that registered no scoped hook (read-only in practice: registering
#: through ``AgentScope.hooks`` first gives the agent a bus of its own).
NO_HOOKS: Final = HookBus()


@final
@attrs.define(eq=False)
class Services:
    """What a runtime lends its agents (passed explicitly; no globals)."""

    router: ModelRouter
    hooks: HookBus
    tools: Callable[[], Mapping[str, Tool]]
    """Runtime tools by name, read at each step."""
    builtin: Callable[[str], Tool | None]
    """Looks up a built-in tool by name."""
    max_parallel_tool_calls: Callable[[], int]
    """Read at each tool batch (live settings)."""
    persona: Callable[[], str | None]
    turn_budget: Callable[[], TurnBudget | None]
    clock: Callable[[], float]
    rng: random.Random
    records: RecordCache = attrs.Factory(RecordCache)
    """Frozen payloads shared by this runtime's agents (one cache per runtime)."""
    compaction: CompactionPolicy | None = None
    """The runtime's compaction policy (``open_runtime(compaction=...)``)."""
    assemblies: dict[tuple[Any, ...], tuple[tuple[Any, ...], PromptAssembly]] = attrs.Factory(dict)
    """Default prompt assemblies shared by alike agents (``AssemblyCache``; bounded)."""
    limits: Limits = DEFAULT_LIMITS
    """Bounds on what models and tool servers send (``docs/limits.md``)."""
    permissions: Permissions | None = None
    """The runtime's permission policy (None: none configured; ``docs/security.md``)."""
    sandbox: Sandbox = DEFAULT_SANDBOX
    """The runtime's sandbox for ``run_command`` (``docs/security.md``)."""
    protected: tuple[str, ...] = ()
    """Absolute paths no tool may write: the loaded config file, the CLI's settings
    directory, the store's files."""
    permission_policies: dict[tuple[Permissions | None, tuple[str, ...]], CompiledPolicy] = (
        attrs.Factory(dict)
    )
    """Compiled permission policies by (policy, granted rules) (``_agent/_permissions.py``;
    bounded)."""
    permission_gates: dict[tuple[CompiledPolicy, frozenset[str], str | None], Gate] = attrs.Factory(
        dict
    )
    """Gates shared by alike agents: by (compiled policy, ``require_approval``, cwd)
    (``_agent/_judge.py``; bounded)."""


@final
class AgentScope:
    """What ``setup(scope, agent)`` receives: scoped hooks, tools and persona for one agent."""

    __slots__ = (
        "_chain",
        "_closed",
        "_hooks",
        "persona",
        "tools",
    )

    def __init__(self, chain: HookChain, persona: str | None) -> None:
        self._chain = chain
        self._hooks: HookScope | None = None
        self._closed = False
        self.persona: str | None = persona
        """The agent persona (a ``persona`` prompt section); settable."""
        self.tools: dict[str, Tool] = {}
        """Scoped tools, visible only to this agent."""

    @property
    def hooks(self) -> HookScope:
        """Hook registrations that vanish with the agent (its bus is made on first use)."""
        if self._hooks is None:
            bus = HookBus()
            self._chain.add_inner(bus)
            self._hooks = HookScope(bus)
            if self._closed:
                self._hooks.close()
        return self._hooks

    def add_tool(self, tool: Tool) -> Callable[[], None]:
        """Make ``tool`` visible to this agent; returns a disposer."""
        return register(self.tools, tool)

    def close(self) -> None:
        """Drop scoped registrations."""
        self._closed = True
        if self._hooks is not None:
            self._hooks.close()
        self.tools.clear()
