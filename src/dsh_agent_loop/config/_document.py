"""The config document: ``RuntimeConfig``, the whole file shape once loaded and validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

import attrs

from .._frozen import FrozenDict
from ._agents import AgentEntry, LoopConfig
from ._mcp import McpServerConfig
from ._providers import ProviderConfig
from ._rules import StoreUrl, frozen_map

__all__ = ["FileShape", "PluginEntry", "RuntimeConfig"]


@final
@attrs.frozen
class RuntimeConfig:
    """A loaded, validated config file."""

    plugin: LoopConfig = attrs.field(factory=LoopConfig)
    store: StoreUrl | None = None
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=FrozenDict, converter=frozen_map)
    source: str = "<config>"
    """Label used in error messages: the file path, or ``<config>``."""
    mcp_servers: Mapping[str, McpServerConfig] = attrs.field(
        factory=FrozenDict, converter=frozen_map
    )
    """``mcpServers``: the MCP servers whose tools every agent may call."""

    @property
    def agents(self) -> tuple[AgentEntry, ...]:
        """The declared agents."""
        return self.plugin.agents


@final
@attrs.frozen
class PluginEntry:
    """One entry of ``plugins:`` (only this library's is read)."""

    name: str
    config: LoopConfig = attrs.field(factory=LoopConfig)


@final
@attrs.frozen
class FileShape:
    """The file as written: ``plugins``, ``store``, ``providers``, ``mcpServers``."""

    plugins: tuple[PluginEntry, ...] = ()
    store: StoreUrl | None = None
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=FrozenDict, converter=frozen_map)
    mcp_servers: Mapping[str, McpServerConfig] = attrs.field(
        factory=FrozenDict, converter=frozen_map
    )
