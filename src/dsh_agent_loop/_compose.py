"""Turning a loaded config and ``open_runtime``'s arguments into the runtime's parts.

The config package holds plain records; this module is where they become live objects: agent
options from agent entries, adapters from provider sections, tools from tool references, the
store from its URL, and the runtime-wide policies (an explicit argument wins over the config's).
It also names the paths no tool may write (``docs/security.md``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import final

import attrs

from .agent.driver import Agent, AgentScope
from .agent.lifecycle import Setup
from .agent.options import AgentOptions, CompactionPolicy
from .config import AgentEntry, RuntimeConfig
from .config.compaction import CompactionConfig
from .config.tools import agent_tools, runtime_tools
from .limits import DEFAULT_LIMITS, Limits
from .llm.base import ModelAdapter
from .llm.providers import AnthropicProvider, OpenAIProvider
from .permissions import Permissions
from .sandbox import DEFAULT_SANDBOX, Sandbox
from .session.store import SessionStore
from .stores.jsonl import JsonlStore
from .stores.memory import MemoryStore
from .stores.sqlite import SqliteStore
from .tools.base import Tool

__all__ = [
    "Policies",
    "adapters_from_arguments",
    "builtin_tool",
    "options_from_entry",
    "protected_paths",
    "providers_from_config",
    "store_from_config",
    "tools_from_config",
]


@final
@attrs.frozen
class Policies:
    """The runtime-wide policies: an explicit argument wins over the config's."""

    compaction: CompactionPolicy | None = None
    limits: Limits = DEFAULT_LIMITS
    permissions: Permissions | None = None
    sandbox: Sandbox = DEFAULT_SANDBOX

    @classmethod
    def of(
        cls,
        config: RuntimeConfig,
        compaction: CompactionPolicy | None,
        limits: Limits | None,
        permissions: Permissions | None,
        sandbox: Sandbox | None,
    ) -> Policies:
        plugin = config.plugin
        return cls(
            compaction=compaction or compaction_policy(plugin.compaction),
            limits=limits or plugin.limits or DEFAULT_LIMITS,
            permissions=permissions or plugin.permissions,
            sandbox=sandbox or plugin.sandbox or DEFAULT_SANDBOX,
        )


def protected_paths(config: RuntimeConfig, store: SessionStore) -> tuple[str, ...]:
    """What no tool may write (``docs/security.md``).

    The loaded config file, the CLI's settings directory and the store's files.
    """
    paths: list[str] = []
    if config.source != "<config>" and os.path.isfile(config.source):
        paths.append(os.path.realpath(config.source))
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    paths.append(os.path.realpath(os.path.join(xdg, "dsh-agent")))
    if isinstance(store, SqliteStore):
        base = os.path.realpath(store.path)
        paths.extend(base + suffix for suffix in ("", "-wal", "-shm", "-journal", "-owners"))
    elif isinstance(store, JsonlStore):
        paths.append(os.path.realpath(store.directory))
    return tuple(paths)


def builtin_tool(name: str) -> Tool | None:
    try:
        from .tools.builtin import BUILTIN_TOOLS
    except ImportError:  # pragma: no cover - the module ships with the package
        return None
    return BUILTIN_TOOLS.get(name)


def options_from_entry(entry: AgentEntry) -> tuple[AgentOptions, Setup | None]:
    """A declared agent's options, and the setup that adds its referenced tools (scoped)."""
    persona = entry.persona
    if persona is None and entry.persona_file is not None:
        with open(entry.persona_file, encoding="utf-8") as f:
            persona = f.read()
    listed = agent_tools(entry)
    names: tuple[str, ...] | None = None if entry.tools is None else listed.names

    async def add_tools(scope: AgentScope, agent: Agent) -> None:
        for tool in listed.tools:
            scope.add_tool(tool)

    options = AgentOptions(
        id=entry.id,
        provider=entry.provider,
        model=entry.model,
        reasoning_effort=entry.reasoning_effort,
        max_tokens=entry.max_tokens,
        cwd=entry.cwd,
        persona=persona,
        tools=names,  # type: ignore[arg-type]  # attrs plugin: optional(tuple) stays generic
        turn_budget=entry.turn_budget,
        require_approval=entry.require_approval,
        compaction=compaction_policy(entry.compaction),
        permissions=entry.permissions,
        sandbox=entry.sandbox,
    )
    return options, add_tools if listed.tools else None


def compaction_policy(entry: CompactionConfig | None) -> CompactionPolicy | None:
    return None if entry is None else entry.policy()


def providers_from_config(config: RuntimeConfig) -> dict[str, ModelAdapter]:
    """The adapters of the config's providers, built from their validated records."""
    from .llm.providers import adapter_from_config

    return {name: adapter_from_config(name, entry) for name, entry in config.providers.items()}


def tools_from_config(config: RuntimeConfig, explicit: Mapping[str, Tool]) -> dict[str, Tool]:
    """The runtime tools: the config's (``tools`` of the plugin block), then ``tools=``."""
    listed = runtime_tools(config.plugin, known=explicit)
    return {**{t.name: t for t in listed}, **explicit}


def adapters_from_arguments(
    providers: Mapping[str, ModelAdapter | OpenAIProvider | AnthropicProvider],
) -> dict[str, ModelAdapter]:
    """``open_runtime(providers=...)``: adapters as given, provider objects built."""
    return {
        name: p.adapter(name) if isinstance(p, OpenAIProvider | AnthropicProvider) else p
        for name, p in providers.items()
    }


def store_from_config(config: RuntimeConfig) -> SessionStore:
    if config.store is None:
        return MemoryStore()
    from .stores.url import store_from_url

    return store_from_url(config.store)
