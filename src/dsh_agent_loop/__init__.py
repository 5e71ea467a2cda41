"""dsh-agent-loop: a trio-native agent runtime with durable session logs.

Create or resume persisted agent sessions and drive every turn — model request, streaming
response, tool execution, repeat — with each fact appended to a durable session log before the
next step is derived from it.
"""

from __future__ import annotations

from . import invariants as invariants
from ._agent.agent import Agent as Agent
from ._agent.calls import RunStream as RunStream
from ._agent.compaction import Compacted as Compacted
from ._agent.compaction import CompactionError as CompactionError
from ._agent.context import ContextUsage as ContextUsage
from ._agent.delegate import delegate_tool as delegate_tool
from ._agent.lifecycle import AgentHandle as AgentHandle
from ._agent.options import AgentOptions as AgentOptions
from ._agent.options import CompactionPolicy as CompactionPolicy
from ._agent.options import TurnBudget as TurnBudget
from ._agent.prompt import PromptAssembly as PromptAssembly
from ._agent.prompt import PromptSection as PromptSection
from ._agent.request import PreStepDecision as PreStepDecision
from ._agent.request import Retry as Retry
from ._agent.results import ApprovalRequest as ApprovalRequest
from ._agent.results import ToolCallRecord as ToolCallRecord
from ._agent.results import TurnAbortedError as TurnAbortedError
from ._agent.results import TurnBlockedError as TurnBlockedError
from ._agent.results import TurnError as TurnError
from ._agent.results import TurnFailedError as TurnFailedError
from ._agent.results import TurnResult as TurnResult
from ._agent.services import AgentScope as AgentScope
from ._compose import load_config as load_config
from ._errors import AgentAlreadyExistsError as AgentAlreadyExistsError
from ._errors import AgentClosedError as AgentClosedError
from ._errors import AgentLoopError as AgentLoopError
from ._errors import ApprovalPendingError as ApprovalPendingError
from ._errors import ConfigError as ConfigError
from ._errors import InvalidOptionError as InvalidOptionError
from ._errors import LimitExceededError as LimitExceededError
from ._errors import SequenceConflictError as SequenceConflictError
from ._errors import SessionAlreadyExistsError as SessionAlreadyExistsError
from ._errors import SessionAlreadyOwnedError as SessionAlreadyOwnedError
from ._errors import SessionNotFoundError as SessionNotFoundError
from ._errors import SessionOwnershipLostError as SessionOwnershipLostError
from ._errors import StoreCorruptError as StoreCorruptError
from ._errors import StoreError as StoreError
from ._errors import SubscriberOverflowError as SubscriberOverflowError
from ._frozen import FrozenDict as FrozenDict
from ._frozen import thaw as thaw
from ._hooks import HookBus as HookBus
from ._limits import Limits as Limits
from ._permissions import Permissions as Permissions
from ._providers import AnthropicProvider as AnthropicProvider
from ._providers import OpenAIProvider as OpenAIProvider
from ._runtime import Runtime as Runtime
from ._runtime import open_runtime as open_runtime
from ._sandbox import Sandbox as Sandbox
from ._session.store import SessionInfo as SessionInfo
from ._session.store import SessionStore as SessionStore
from ._tools.base import Tool as Tool
from ._tools.base import ToolContext as ToolContext
from ._tools.base import ToolResult as ToolResult
from ._tools.base import tool as tool
from ._tools.pipeline import Deny as Deny
from .config import RuntimeConfig as RuntimeConfig
from .events import Event as Event
from .fleet import FleetClient as FleetClient
from .fleet import FleetOptions as FleetOptions
from .fleet import open_client as open_client
from .llm import Failure as Failure
from .llm import ModelRequest as ModelRequest
from .llm import Reply as Reply
from .llm import ScriptedModel as ScriptedModel
from .llm import StreamLimits as StreamLimits
from .llm import Usage as Usage
from .stores import JsonlStore as JsonlStore
from .stores import MemoryStore as MemoryStore
from .stores.sqlite import SqliteStore as SqliteStore

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentAlreadyExistsError",
    "AgentClosedError",
    "AgentHandle",
    "AgentLoopError",
    "AgentOptions",
    "AgentScope",
    "AnthropicProvider",
    "ApprovalPendingError",
    "ApprovalRequest",
    "Compacted",
    "CompactionError",
    "CompactionPolicy",
    "ConfigError",
    "ContextUsage",
    "Deny",
    "Event",
    "Failure",
    "FleetClient",
    "FleetOptions",
    "FrozenDict",
    "HookBus",
    "InvalidOptionError",
    "JsonlStore",
    "LimitExceededError",
    "Limits",
    "MemoryStore",
    "ModelRequest",
    "OpenAIProvider",
    "Permissions",
    "PreStepDecision",
    "PromptAssembly",
    "PromptSection",
    "Reply",
    "Retry",
    "RunStream",
    "Runtime",
    "RuntimeConfig",
    "Sandbox",
    "ScriptedModel",
    "SequenceConflictError",
    "SessionAlreadyExistsError",
    "SessionAlreadyOwnedError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionOwnershipLostError",
    "SessionStore",
    "SqliteStore",
    "StoreCorruptError",
    "StoreError",
    "StreamLimits",
    "SubscriberOverflowError",
    "Tool",
    "ToolCallRecord",
    "ToolContext",
    "ToolResult",
    "TurnAbortedError",
    "TurnBlockedError",
    "TurnBudget",
    "TurnError",
    "TurnFailedError",
    "TurnResult",
    "Usage",
    "delegate_tool",
    "invariants",
    "load_config",
    "open_client",
    "open_runtime",
    "thaw",
    "tool",
]
