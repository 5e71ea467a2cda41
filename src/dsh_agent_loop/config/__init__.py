"""Configuration: the config file as frozen records, strict loading, and layered live settings.

``load_config`` reads the whole file shape (docs/design.md#file-shape) into a ``RuntimeConfig``: the
plugin block
with its declared agents (``agents``), the store URL and the providers (``providers``, one
tagged union over ``kind``). ``Settings`` reads the live settings layers (``settings``).

The records are plain data, and this package imports none of the packages they describe
(``agent``, ``llm``, ``tools``, ``stores``, ``mcp``): the runtime's composition
(``_compose.py``) makes live objects of them, and ``dsh_agent_loop.load_config`` is this
``load_config`` handed the tool catalog that checks ``tools`` lists (``config/tools.py``).
"""

from __future__ import annotations

from ._converter import converter as converter
from .agents import PLUGIN_NAME as PLUGIN_NAME
from .agents import AgentEntry as AgentEntry
from .agents import LoopConfig as LoopConfig
from .agents import TurnBudget as TurnBudget
from .document import RuntimeConfig as RuntimeConfig
from .loading import load_config as load_config
from .loading import load_settings_file as load_settings_file
from .providers import AnthropicProviderConfig as AnthropicProviderConfig
from .providers import ModelConfig as ModelConfig
from .providers import OpenAIProviderConfig as OpenAIProviderConfig
from .providers import ProviderConfig as ProviderConfig
from .providers import ScriptedProviderConfig as ScriptedProviderConfig
from .providers import ScriptedReplyConfig as ScriptedReplyConfig
from .providers import ScriptedToolCallConfig as ScriptedToolCallConfig
from .providers import TimeoutConfig as TimeoutConfig
from .settings import DEFAULT_MAX_PARALLEL_TOOL_CALLS as DEFAULT_MAX_PARALLEL_TOOL_CALLS
from .settings import Settings as Settings
from .settings import SettingsLayer as SettingsLayer
from .tracing import OtelConfig as OtelConfig

__all__ = [
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "PLUGIN_NAME",
    "AgentEntry",
    "AnthropicProviderConfig",
    "LoopConfig",
    "ModelConfig",
    "OpenAIProviderConfig",
    "OtelConfig",
    "ProviderConfig",
    "RuntimeConfig",
    "ScriptedProviderConfig",
    "ScriptedReplyConfig",
    "ScriptedToolCallConfig",
    "Settings",
    "SettingsLayer",
    "TimeoutConfig",
    "TurnBudget",
    "converter",
    "load_config",
    "load_settings_file",
]
