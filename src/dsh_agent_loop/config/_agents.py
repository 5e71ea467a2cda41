"""Agent declarations: the plugin's ``config`` block, its ``agents[]`` and their turn budgets.

The block keeps the TypeScript package's camelCase keys (docs/design.md#file-shape). ``TurnBudget``,
``Limits``, ``Permissions`` and
``Sandbox`` are the public records agents and the runtime are created with; they live below both
(``limits``, ``permissions``, ``sandbox``), and the config reads them with the rules below
attached, so a record loaded from a file and one given in code are the same class.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, final

import attrs

from .._limits import Limits, TurnBudget
from .._permissions import Permissions
from .._sandbox import Sandbox
from ._compaction import CompactionConfig
from ._fleet import FleetConfig
from ._rules import (
    Fault,
    KeyPath,
    NonEmptyStr,
    PermissionRule,
    PositiveInt,
    PositiveNumber,
    to_tuple,
)
from ._tracing import OtelConfig

__all__ = [
    "LIMITS_RULES",
    "PERMISSIONS_RULES",
    "PLUGIN_NAME",
    "SANDBOX_RULES",
    "TURN_BUDGET_RULES",
    "AgentEntry",
    "Limits",
    "LoopConfig",
    "Permissions",
    "Sandbox",
    "SettingsLayer",
    "SubagentEntry",
    "TurnBudget",
    "agent_faults",
    "resolve_path",
    "subagent_faults",
]

#: The ``name`` of this library's entry in the config file's ``plugins:`` list.
PLUGIN_NAME: Final = "@deepseek-ai/dsh-agent-loop"

#: The single-value rules of ``TurnBudget``'s fields when read from a config.
TURN_BUDGET_RULES: Final[Mapping[str, Any]] = {
    "max_steps": PositiveInt | None,
    "max_tool_calls": PositiveInt | None,
    "max_total_tokens": PositiveInt | None,
    "max_seconds": PositiveNumber | None,
}

#: The single-value rules of ``Limits``' fields when read from a config (``limits:``).
LIMITS_RULES: Final[Mapping[str, Any]] = {
    "max_tool_result_bytes": PositiveInt,
    "max_tool_calls_per_reply": PositiveInt,
    "max_delegation_depth": PositiveInt,
    "max_subagents": PositiveInt,
    "mcp_call_timeout": PositiveNumber,
    "mcp_max_tools": PositiveInt,
    "mcp_max_message_bytes": PositiveInt,
}

#: The rules of ``Permissions``' lists when read from a config (``permissions:``): each item
#: parses as a rule, so a fault names its key path (``permissions.allow[0]``).
PERMISSIONS_RULES: Final[Mapping[str, Any]] = {
    "allow": tuple[PermissionRule, ...],
    "ask": tuple[PermissionRule, ...],
    "deny": tuple[PermissionRule, ...],
}

#: The single-value rules of ``Sandbox``'s fields when read from a config (``sandbox:``).
SANDBOX_RULES: Final[Mapping[str, Any]] = {"max_timeout_s": PositiveNumber}


@final
@attrs.frozen
class AgentEntry:
    """One declared agent (``agents[]`` in the plugin config block)."""

    id: NonEmptyStr
    """Stable label; unique among declared agents."""
    provider: NonEmptyStr | None = None
    model: NonEmptyStr | None = None
    reasoning_effort: NonEmptyStr | None = None
    max_tokens: PositiveInt | None = None
    """Per-request output-token cap."""
    cwd: NonEmptyStr | None = None
    """Working directory of the agent's tools (as written; relative to the process cwd)."""
    session_id: NonEmptyStr | None = None
    """Resume-or-create this session."""
    resume_session_id: NonEmptyStr | None = None
    """Resume this session, which must exist."""
    persona: str | None = None
    persona_file: NonEmptyStr | None = None
    """Persona text file; made absolute at load (relative to the config file's directory)."""
    tools: tuple[NonEmptyStr, ...] | None = None
    """Tool names (built-ins only when named) and ``package.module:attr`` references, whose
    tools only this agent sees; None = every runtime tool."""
    turn_budget: TurnBudget | None = None
    require_approval: tuple[NonEmptyStr, ...] = attrs.field(default=(), converter=to_tuple)
    """Names of tools whose every call waits for a person's decision (``requireApproval``)."""
    compaction: CompactionConfig | None = None
    """This agent's compaction policy (``docs/context.md``)."""
    permissions: Permissions | None = None
    """This agent's permission policy, over the runtime's (``docs/security.md``)."""
    sandbox: Sandbox | None = None
    """This agent's sandbox for ``run_command``, over the runtime's (``docs/security.md``)."""


@final
@attrs.frozen
class SubagentEntry:
    """One declared sub-agent (``subagents[]``): a ``delegate`` tool every agent may call.

    The keys of an ``agents[]`` entry that describe an agent (its ``id`` names the children,
    ``<parent id>.<id>``), plus the tool's ``tool`` name and ``description``.
    """

    id: NonEmptyStr
    provider: NonEmptyStr | None = None
    model: NonEmptyStr | None = None
    reasoning_effort: NonEmptyStr | None = None
    max_tokens: PositiveInt | None = None
    cwd: NonEmptyStr | None = None
    persona: str | None = None
    persona_file: NonEmptyStr | None = None
    tools: tuple[NonEmptyStr, ...] | None = None
    turn_budget: TurnBudget | None = None
    require_approval: tuple[NonEmptyStr, ...] = attrs.field(default=(), converter=to_tuple)
    compaction: CompactionConfig | None = None
    """The children's compaction policy (``docs/context.md``)."""
    permissions: Permissions | None = None
    """The children's permission policy (None: their parent's)."""
    sandbox: Sandbox | None = None
    """The children's sandbox (None: their parent's)."""
    tool: NonEmptyStr = "delegate"
    """The tool name the model sees."""
    description: NonEmptyStr | None = None
    """What the model reads about the tool (default: ``delegate.DEFAULT_DESCRIPTION``)."""

    def agent_entry(self) -> AgentEntry:
        """The children's options as an ``agents[]`` entry."""
        fields = attrs.asdict(self, recurse=False)
        del fields["tool"], fields["description"]
        return AgentEntry(**fields)


@final
@attrs.frozen
class LoopConfig:
    """The plugin's ``config`` block."""

    max_parallel_tool_calls: PositiveInt | None = None
    persona: str | None = None
    """Runtime persona."""
    turn_budget: TurnBudget | None = None
    """Default budget of agents that set none."""
    tools: tuple[NonEmptyStr, ...] = attrs.field(default=(), converter=to_tuple)
    """Runtime tools: built-in names and ``package.module:attr`` references (``config.tools``)."""
    agents: tuple[AgentEntry, ...] = attrs.field(default=(), converter=to_tuple)
    subagents: tuple[SubagentEntry, ...] = attrs.field(default=(), converter=to_tuple)
    """Sub-agents, each a ``delegate`` tool of every agent (``docs/subagents.md``)."""
    otel: OtelConfig | None = None
    """``otel: true`` or ``otel: {captureContent: true}``: trace to the global tracer provider."""
    compaction: CompactionConfig | None = None
    """Every agent's compaction policy unless its entry sets one (``docs/context.md``)."""
    limits: Limits | None = None
    """Bounds on what models and tool servers send (``docs/limits.md``); None: the defaults."""
    permissions: Permissions | None = None
    """Every agent's permission policy unless its entry sets one (``docs/security.md``)."""
    sandbox: Sandbox | None = None
    """``run_command``'s sandbox: a mode (``workspace-write``, ``read-only``, ``off``) or
    ``{mode, network, env, maxTimeoutS}`` (``docs/security.md``)."""
    fleet: FleetConfig | None = None
    """``fleet: {workerId, maxAgents, idleUnloadSeconds, ...}``: run as a fleet worker
    (``docs/fleet.md``)."""


@final
@attrs.frozen
class SettingsLayer:
    """One settings layer (the user layer, a settings file): the plugin block minus agents."""

    max_parallel_tool_calls: PositiveInt | None = None
    persona: str | None = None
    turn_budget: TurnBudget | None = None


def resolve_path(base_dir: str, path: str) -> str:
    """``path`` (``~`` expanded) relative to ``base_dir``, normalised."""
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))


def _key(entry: Mapping[Any, Any], camel: str) -> str:
    """How ``camel`` is written in ``entry``: camelCase, or its snake_case spelling."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return snake if snake in entry and camel not in entry else camel


def _get(entry: Mapping[Any, Any], camel: str) -> Any:
    """The value of a camelCase key in a raw entry, in whichever spelling it is written."""
    return entry.get(_key(entry, camel))


def agent_faults(
    agents: Sequence[Any], path: KeyPath, known: frozenset[str], base_dir: str
) -> Iterator[Fault]:
    """Rules across the fields of ``agents[]`` and their context, on the raw tree."""
    first_index: dict[str, int] = {}
    for index, agent in enumerate(agents):
        if not isinstance(agent, Mapping):
            continue
        at = (*path, index)
        agent_id = agent.get("id")
        if isinstance(agent_id, str):
            if agent_id in first_index:
                first = first_index[agent_id]
                yield (*at, "id"), f"duplicate agent id {agent_id!r} (also agents[{first}])"
            first_index.setdefault(agent_id, index)
        if _get(agent, "sessionId") is not None and _get(agent, "resumeSessionId") is not None:
            yield (*at, _key(agent, "resumeSessionId")), "cannot be combined with sessionId"
        persona_file = _get(agent, "personaFile")
        if agent.get("persona") is not None and persona_file is not None:
            yield (*at, _key(agent, "personaFile")), "cannot be combined with persona"
        elif isinstance(persona_file, str) and persona_file.strip():
            resolved = resolve_path(base_dir, persona_file)
            if not os.path.isfile(resolved):
                yield (*at, _key(agent, "personaFile")), f"file not found: {resolved}"
        provider = agent.get("provider")
        if isinstance(provider, str) and provider.strip() and provider not in known:
            names = ", ".join(sorted(known)) if known else "none configured"
            yield (*at, "provider"), f"unknown provider {provider!r} (known: {names})"


def subagent_faults(entries: Sequence[Any], path: KeyPath) -> Iterator[Fault]:
    """Two sub-agents may not declare the same tool name (raw tree, tolerating bad shapes)."""
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("tool", "delegate")
        if not isinstance(name, str):
            continue
        if name in first:
            also = f"also subagents[{first[name]}]; give each sub-agent its own `tool`"
            yield (*path, index, "tool"), f"tool name {name!r} is declared twice ({also})"
        first.setdefault(name, index)
