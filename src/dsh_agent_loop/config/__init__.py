"""Configuration: the config file as frozen records, strict loading, and layered live settings.

``load_config`` reads the whole file shape (docs/design.md#file-shape) into a ``RuntimeConfig``: the
plugin block
with its declared agents (``agents``), the store URL and the providers (``providers``, one
tagged union over ``kind``). ``Settings`` reads the live settings layers (``settings``).

The records are plain data, and this package imports none of the packages they describe
(``agent``, ``llm``, ``tools``, ``stores``, ``mcp``): the runtime's composition
(``_compose.py``) makes live objects of them, and ``dsh_agent_loop.load_config`` is this
``load_config`` handed the tool catalog that checks ``tools`` lists (``config/_tools.py``).
"""

from __future__ import annotations

from ._agents import PLUGIN_NAME as PLUGIN_NAME
from ._agents import AgentEntry as AgentEntry
from ._agents import LoopConfig as LoopConfig
from ._agents import SubagentEntry as SubagentEntry
from ._agents import TurnBudget as TurnBudget
from ._compaction import CompactionConfig as CompactionConfig
from ._converter import converter as converter
from ._document import FileShape as FileShape
from ._document import PluginEntry as PluginEntry
from ._document import RuntimeConfig as RuntimeConfig
from ._fleet import FleetConfig as FleetConfig
from ._loading import load_config as load_config
from ._loading import load_provider as load_provider
from ._loading import load_settings_file as load_settings_file
from ._mcp import McpServerConfig as McpServerConfig
from ._mcp import McpToolConfig as McpToolConfig
from ._providers import AnthropicProviderConfig as AnthropicProviderConfig
from ._providers import ModelConfig as ModelConfig
from ._providers import OpenAIProviderConfig as OpenAIProviderConfig
from ._providers import ProviderConfig as ProviderConfig
from ._providers import ScriptedProviderConfig as ScriptedProviderConfig
from ._providers import ScriptedReplyConfig as ScriptedReplyConfig
from ._providers import ScriptedToolCallConfig as ScriptedToolCallConfig
from ._providers import StreamLimitsConfig as StreamLimitsConfig
from ._providers import TimeoutConfig as TimeoutConfig
from ._settings import DEFAULT_MAX_PARALLEL_TOOL_CALLS as DEFAULT_MAX_PARALLEL_TOOL_CALLS
from ._settings import Settings as Settings
from ._settings import SettingsLayer as SettingsLayer
from ._tools import ToolCatalog as ToolCatalog
from ._tools import is_tool_ref as is_tool_ref
from ._tracing import OtelConfig as OtelConfig

__all__ = [
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "PLUGIN_NAME",
    "AgentEntry",
    "AnthropicProviderConfig",
    "CompactionConfig",
    "FileShape",
    "FleetConfig",
    "LoopConfig",
    "McpServerConfig",
    "McpToolConfig",
    "ModelConfig",
    "OpenAIProviderConfig",
    "OtelConfig",
    "PluginEntry",
    "ProviderConfig",
    "RuntimeConfig",
    "ScriptedProviderConfig",
    "ScriptedReplyConfig",
    "ScriptedToolCallConfig",
    "Settings",
    "SettingsLayer",
    "StreamLimitsConfig",
    "SubagentEntry",
    "TimeoutConfig",
    "ToolCatalog",
    "TurnBudget",
    "converter",
    "is_tool_ref",
    "load_config",
    "load_provider",
    "load_settings_file",
]
