"""Turning a loaded config and ``open_runtime``'s arguments into the runtime's parts.

The config package holds plain records and imports none of the packages it describes; this
module is where those records become live objects: agent options from agent entries (with their
compaction policy), adapters from provider records, tools from tool names and references, MCP
server specs from ``mcpServers`` entries, the store from its URL, and the runtime-wide policies
(an explicit argument wins over the config's). ``load_config`` is the config's loader handed the
tool catalog, so a tool reference is imported, and its faults reported at their key paths, when
the config loads. It also names the paths no tool may write (``docs/security.md``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Final, final

import attrs
import httpx

from ._agent.lifecycle import Setup
from ._agent.options import AgentOptions, CompactionPolicy
from ._agent.services import AgentScope
from ._limits import DEFAULT_LIMITS, Limits
from ._permissions import Permissions
from ._sandbox import DEFAULT_SANDBOX, Sandbox
from ._session.store import SessionStore
from ._tools.base import Tool
from ._tools.builtin import BUILTIN_TOOLS
from ._tools.loader import load_tool_ref
from .config import (
    AgentEntry,
    AnthropicProviderConfig,
    CompactionConfig,
    LoopConfig,
    McpServerConfig,
    OpenAIProviderConfig,
    ProviderConfig,
    RuntimeConfig,
    ScriptedProviderConfig,
    StreamLimitsConfig,
    is_tool_ref,
)
from .config import load_config as load_records
from .fleet import FleetOptions
from .llm import AnthropicAdapter, ModelAdapter, OpenAIAdapter, Reply, ScriptedModel, StreamLimits
from .mcp import McpServer
from .stores import JsonlStore, MemoryStore, store_from_url
from .stores.sqlite import SqliteStore

__all__ = [
    "TOOL_CATALOG",
    "Policies",
    "ToolList",
    "adapter_from_config",
    "agent_tools",
    "builtin_tool",
    "compaction_policy",
    "fleet_options_from_config",
    "load_config",
    "mcp_server_from_config",
    "mcp_servers_from_config",
    "options_from_entry",
    "protected_paths",
    "providers_from_config",
    "runtime_tools",
    "store_from_config",
    "tools_from_config",
]


# --- tools ----------------------------------------------------------------------------------


@final
@attrs.frozen
class _Catalog:
    """The tools a config's ``tools`` lists may name (``config.tools.ToolCatalog``)."""

    builtin: tuple[str, ...] = tuple(BUILTIN_TOOLS)

    def names(self, ref: str) -> tuple[str, ...]:
        """The names of the tools ``ref`` names (``ToolRefError`` is a ``ValueError``)."""
        return tuple(t.name for t in load_tool_ref(ref))


#: What ``load_config`` checks ``tools`` lists with: the built-ins and the reference loader.
TOOL_CATALOG: Final = _Catalog()


def load_config(
    source: RuntimeConfig | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    known_providers: Iterable[str] = (),
    known_tools: Iterable[str] = (),
    base_dir: str | os.PathLike[str] | None = None,
) -> RuntimeConfig:
    """Load and validate a config: the whole file shape, tool references included.

    See docs/design.md#file-shape.

    Nothing is opened or started here; every fault is reported at once. This is
    ``dsh_agent_loop.config.load_config`` with the tools checked: every ``package.module:attr``
    reference is imported and must name tools, every tool name must name a built-in or a
    runtime tool, and no tool is given twice.

    Args:
        source: a YAML file path; a mapping of the same shape (labelled ``<config>``); a
            ``RuntimeConfig`` (validated again and returned as is); None for an empty config.
        known_providers: provider names defined outside the config (``open_runtime``'s
            explicit ``providers=``), which agents may name too.
        known_tools: names of runtime tools given outside the config (``open_runtime``'s
            ``tools=``, the CLI's ``--tool``), which ``tools`` lists may name too.
        base_dir: directory ``personaFile`` is relative to; default the config file's
            directory, or the working directory for a mapping.

    Returns:
        The validated config; ``personaFile`` paths are absolute.

    Raises:
        ConfigError: one line, ``FILE: key.path: message`` joined by ``; ``.
    """
    return load_records(
        source,
        known_providers=known_providers,
        known_tools=known_tools,
        base_dir=base_dir,
        tool_catalog=TOOL_CATALOG,
    )


def builtin_tool(name: str) -> Tool | None:
    """The built-in tool called ``name``, or None."""
    return BUILTIN_TOOLS.get(name)


@final
@attrs.frozen
class ToolList:
    """One validated ``tools`` list, resolved."""

    names: tuple[str, ...]
    """The plain tool names, in order."""
    tools: tuple[Tool, ...]
    """The tools the references named, in order."""


def _split(entries: Iterable[str]) -> ToolList:
    names: list[str] = []
    tools: list[Tool] = []
    for item in entries:
        if is_tool_ref(item):
            tools.extend(load_tool_ref(item))
        else:
            names.append(item)
    return ToolList(tuple(names), tuple(tools))


def runtime_tools(plugin: LoopConfig, known: Iterable[str] = ()) -> tuple[Tool, ...]:
    """The runtime tools of a validated plugin block's ``tools``: references and built-ins.

    Names in ``known`` (tools given to ``open_runtime``) are left to the caller.

    Raises:
        ToolRefError: a reference no longer loads (it did when the config was validated).
    """
    known = frozenset(known)
    listed = _split(plugin.tools)
    builtins = tuple(BUILTIN_TOOLS[n] for n in listed.names if n not in known)
    return (*builtins, *listed.tools)


def agent_tools(entry: AgentEntry) -> ToolList:
    """A validated agent entry's ``tools``: its names (options) and its referenced tools.

    Raises:
        ToolRefError: a reference no longer loads (it did when the config was validated).
    """
    return _split(entry.tools or ())


def tools_from_config(config: RuntimeConfig, explicit: Mapping[str, Tool]) -> dict[str, Tool]:
    """The runtime tools: the config's (``tools`` of the plugin block), then ``tools=``."""
    listed = runtime_tools(config.plugin, known=explicit)
    return {**{t.name: t for t in listed}, **explicit}


# --- agents and policies ------------------------------------------------------------------------


def compaction_policy(entry: CompactionConfig | None) -> CompactionPolicy | None:
    """The ``CompactionPolicy`` a ``compaction`` record describes (None: none set)."""
    if entry is None:
        return None
    return CompactionPolicy(
        trigger_ratio=entry.trigger_ratio,
        keep_recent_turns=entry.keep_recent_turns,
        instructions=entry.instructions,
    )


def options_from_entry(entry: AgentEntry) -> tuple[AgentOptions, Setup | None]:
    """A declared agent's options, and the setup that adds its referenced tools (scoped)."""
    persona = entry.persona
    if persona is None and entry.persona_file is not None:
        with open(entry.persona_file, encoding="utf-8") as f:
            persona = f.read()
    listed = agent_tools(entry)
    names: tuple[str, ...] | None = None if entry.tools is None else listed.names

    async def add_tools(scope: AgentScope, agent: object) -> None:
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


# --- providers ------------------------------------------------------------------------------


def _stream_limits(record: StreamLimitsConfig) -> StreamLimits:
    """The limits a validated ``stream_limits`` record sets (the defaults for the rest)."""
    return StreamLimits(**attrs.asdict(record, filter=lambda _, value: value is not None))


def _models(record: OpenAIProviderConfig | AnthropicProviderConfig) -> dict[str, dict[str, Any]]:
    return {
        model: attrs.asdict(entry, filter=lambda _, value: value is not None)
        for model, entry in record.models.items()
    }


def _http_options(record: OpenAIProviderConfig | AnthropicProviderConfig) -> dict[str, Any]:
    """The constructor arguments both HTTP adapters take from their record."""
    options: dict[str, Any] = {
        "api_key_env": record.api_key_env or None,  # ``""``: no key is sent
        "headers": record.headers,
        "timeout": (record.timeout.connect, record.timeout.read),
        "stream_limits": _stream_limits(record.stream_limits),
        "context_window": record.context_window,
        "models": _models(record),
    }
    if record.base_url is not None:  # None: the adapter's default root
        options["base_url"] = record.base_url
    return options


def _scripted(record: ScriptedProviderConfig) -> ScriptedModel:
    replies = [
        Reply.tool_calls(
            *((call.name, call.arguments) for call in reply.tool_calls),
            text=reply.text or "",
            reasoning=reply.reasoning,
        )
        for reply in record.replies
    ]
    return ScriptedModel(
        replies,
        latency=record.latency_ms / 1000.0,
        system_prompt_update="in-history" if record.system_prompt_update == "in-history" else None,
        loop=record.loop,
        context_window=record.context_window,
    )


def adapter_from_config(
    name: str,
    record: ProviderConfig,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ModelAdapter:
    """Build the adapter for provider ``name`` from its validated record.

    Args:
        name: The provider (route) name.
        record: A record from ``load_config(...).providers`` (``OpenAIProviderConfig``,
            ``AnthropicProviderConfig`` or ``ScriptedProviderConfig``), never a raw mapping.
        transport: An httpx transport for an HTTP adapter's client (tests).

    Returns:
        An ``OpenAIAdapter``, ``AnthropicAdapter`` or ``ScriptedModel``.

    Raises:
        TypeError: ``record`` is a raw mapping, not a validated provider record.
    """
    if isinstance(record, Mapping):  # a raw section: validate it with load_config first
        raise TypeError(f"providers.{name}: expected a validated provider record, not a mapping")
    if isinstance(record, OpenAIProviderConfig):
        options = _http_options(record)
        if record.system_prompt_update is not None:  # None: the model table decides
            options["system_prompt_update"] = record.system_prompt_update
        return OpenAIAdapter(
            name,
            stream_usage=record.stream_usage,
            reasoning_replay=record.reasoning_replay,
            transport=transport,
            **options,
        )
    if isinstance(record, AnthropicProviderConfig):
        # Without ``api_key_env`` no key is sent (the adapter's own default names a variable).
        return AnthropicAdapter(name, transport=transport, **_http_options(record))
    if isinstance(record, ScriptedProviderConfig):
        return _scripted(record)
    raise TypeError(
        f"providers.{name}: expected a validated provider record, not {type(record).__name__}"
    )


def providers_from_config(config: RuntimeConfig) -> dict[str, ModelAdapter]:
    """The adapters of the config's providers, built from their validated records."""
    return {name: adapter_from_config(name, entry) for name, entry in config.providers.items()}


# --- MCP servers and the store ------------------------------------------------------------------


def mcp_server_from_config(name: str, record: McpServerConfig) -> McpServer:
    """The server an ``mcpServers.<name>`` entry declares."""
    modes = {t: c.execution_mode for t, c in record.tools.items() if c.execution_mode}
    if record.command is not None:
        return McpServer.stdio(
            name,
            record.command,
            record.args,
            env=record.env or None,
            cwd=record.cwd,
            prefix=record.prefix,
            execution_modes=modes,
        )
    assert record.url is not None  # the config's rules require one of the two
    return McpServer.http(
        name, record.url, record.headers or None, prefix=record.prefix, execution_modes=modes
    )


def mcp_servers_from_config(config: RuntimeConfig) -> list[McpServer]:
    """The servers of the config's ``mcpServers``, in order."""
    return [mcp_server_from_config(n, c) for n, c in config.mcp_servers.items()]


def store_from_config(config: RuntimeConfig) -> SessionStore:
    """The store the config's ``store`` URL names (none: a ``MemoryStore``); nothing opened."""
    if config.store is None:
        return MemoryStore()
    return store_from_url(config.store)


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


# --- fleet ----------------------------------------------------------------------------------


def fleet_options_from_config(cfg: RuntimeConfig) -> FleetOptions | None:
    """The config's ``fleet`` block as ``FleetOptions`` (None: not a worker)."""
    block = cfg.plugin.fleet
    if block is None:
        return None
    return FleetOptions(
        worker_id=block.worker_id,
        max_agents=block.max_agents,
        idle_unload_s=block.idle_unload_seconds,
        drain_timeout_s=block.drain_timeout_seconds,
        poll_interval_s=block.poll_interval_seconds,
        lease_s=block.lease_seconds,
    )
