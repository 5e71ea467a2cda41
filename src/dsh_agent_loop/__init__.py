"""dsh-agent-loop: a trio-native agent runtime with durable session logs.

Create or resume persisted agent sessions and drive every turn — model request, streaming
response, tool execution, repeat — with each fact appended to a durable session log before the
next step is derived from it.
"""

from __future__ import annotations

from . import invariants as invariants
from ._compose import load_config as load_config
from ._frozen import FrozenDict as FrozenDict
from ._frozen import thaw as thaw
from ._providers import AnthropicProvider as AnthropicProvider
from ._providers import OpenAIProvider as OpenAIProvider
from .agent.agent import Agent as Agent
from .agent.calls import RunStream as RunStream
from .agent.compaction import Compacted as Compacted
from .agent.compaction import CompactionError as CompactionError
from .agent.context import ContextUsage as ContextUsage
from .agent.delegate import delegate_tool as delegate_tool
from .agent.lifecycle import AgentHandle as AgentHandle
from .agent.options import AgentOptions as AgentOptions
from .agent.options import CompactionPolicy as CompactionPolicy
from .agent.options import TurnBudget as TurnBudget
from .agent.prompt import PromptAssembly as PromptAssembly
from .agent.prompt import PromptSection as PromptSection
from .agent.request import PreStepDecision as PreStepDecision
from .agent.request import Retry as Retry
from .agent.results import ApprovalRequest as ApprovalRequest
from .agent.results import ToolCallRecord as ToolCallRecord
from .agent.results import TurnAbortedError as TurnAbortedError
from .agent.results import TurnBlockedError as TurnBlockedError
from .agent.results import TurnError as TurnError
from .agent.results import TurnFailedError as TurnFailedError
from .agent.results import TurnResult as TurnResult
from .agent.services import AgentScope as AgentScope
from .config import RuntimeConfig as RuntimeConfig
from .errors import AgentAlreadyExistsError as AgentAlreadyExistsError
from .errors import AgentClosedError as AgentClosedError
from .errors import AgentLoopError as AgentLoopError
from .errors import ConfigError as ConfigError
from .errors import InvalidOptionError as InvalidOptionError
from .errors import LimitExceededError as LimitExceededError
from .errors import SequenceConflictError as SequenceConflictError
from .errors import SessionAlreadyExistsError as SessionAlreadyExistsError
from .errors import SessionAlreadyOwnedError as SessionAlreadyOwnedError
from .errors import SessionNotFoundError as SessionNotFoundError
from .errors import SessionOwnershipLostError as SessionOwnershipLostError
from .errors import StoreCorruptError as StoreCorruptError
from .errors import StoreError as StoreError
from .errors import SubscriberOverflowError as SubscriberOverflowError
from .events import Event as Event
from .hooks import HookBus as HookBus
from .limits import Limits as Limits
from .llm.base import Failure as Failure
from .llm.base import ModelRequest as ModelRequest
from .llm.base import Usage as Usage
from .llm.scripted import Reply as Reply
from .llm.scripted import ScriptedModel as ScriptedModel
from .llm.stream_limits import StreamLimits as StreamLimits
from .permissions import Permissions as Permissions
from .runtime import Runtime as Runtime
from .runtime import open_runtime as open_runtime
from .sandbox import Sandbox as Sandbox
from .session.store import SessionInfo as SessionInfo
from .session.store import SessionStore as SessionStore
from .stores.jsonl import JsonlStore as JsonlStore
from .stores.memory import MemoryStore as MemoryStore
from .stores.sqlite import SqliteStore as SqliteStore
from .tools.base import Tool as Tool
from .tools.base import ToolContext as ToolContext
from .tools.base import ToolResult as ToolResult
from .tools.base import tool as tool
from .tools.pipeline import Deny as Deny

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
    "ApprovalRequest",
    "Compacted",
    "CompactionError",
    "CompactionPolicy",
    "ConfigError",
    "ContextUsage",
    "Deny",
    "Event",
    "Failure",
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
    "open_runtime",
    "thaw",
    "tool",
]
