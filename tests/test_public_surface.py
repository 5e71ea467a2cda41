"""The public namespaces are pinned: a name added, removed or renamed is a visible decision.

Changing one of these lists is fine when the change is meant (update CHANGELOG.md with it); the
test exists so that no public name appears or disappears by accident.
"""

from __future__ import annotations

import importlib

import pytest

PINNED = {
    "dsh_agent_loop": [
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
        "ContextUsage",
        "ConfigError",
        "Deny",
        "Event",
        "Failure",
        "FrozenDict",
        "HookBus",
        "InvalidOptionError",
        "LimitExceededError",
        "Limits",
        "JsonlStore",
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
        "StoreCorruptError",
        "StreamLimits",
        "SessionStore",
        "SqliteStore",
        "StoreError",
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
    ],
    "dsh_agent_loop.testing": [
        "CancellationReport",
        "Reply",
        "ScriptedModel",
        "actor_of",
        "explore_cancellation",
        "explore_cancellation_async",
    ],
    "dsh_agent_loop.otel": ["trace_runtime"],
    "dsh_agent_loop.stores": ["JsonlStore", "MemoryStore", "SqliteStore", "store_from_url"],
    "dsh_agent_loop.config": [
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
    ],
}


@pytest.mark.parametrize("module_name", sorted(PINNED))
def test_public_names_are_pinned(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PINNED[module_name])
    assert len(set(module.__all__)) == len(module.__all__), "a name is listed twice"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_the_root_names_what_the_spec_surface_uses() -> None:
    import dsh_agent_loop

    # docs/design.md#public-surface: the names acceptance checks import from the root.
    spec = {
        "open_runtime", "AgentOptions", "ScriptedModel", "Reply", "tool", "Retry",
        "PreStepDecision", "PromptAssembly", "PromptSection", "MemoryStore", "SqliteStore",
        "JsonlStore", "invariants", "Event", "SessionAlreadyExistsError",
        "SessionNotFoundError", "SessionAlreadyOwnedError", "SessionOwnershipLostError",
        "SequenceConflictError",
    }  # fmt: skip
    assert spec <= set(dsh_agent_loop.__all__)


#: The public ``Agent``'s names: a thin façade over its actor (``agent/agent.py``), each name
#: described in docs/embedding.md's "The Agent API" table.
AGENT_NAMES = [
    "approve", "cancel", "children", "closed", "compact", "context_usage", "deny", "flush",
    "followup", "id", "inbox", "inject", "options", "parent", "pending_approvals",
    "replace_history", "resolve_approvals", "run", "run_stream", "send", "session",
    "session_id", "statistics", "status", "steer", "subscribe", "wait_idle",
]  # fmt: skip
MAX_AGENT_NAMES = 28


def _agent_api_section() -> str:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "embedding.md").read_text(encoding="utf-8")
    start = text.index("### The Agent API")
    return text[start : text.index("\n#", start + 1)]


def test_the_agent_shows_only_its_documented_verbs() -> None:
    from dsh_agent_loop import Agent

    public = sorted(name for name in dir(Agent) if not name.startswith("_"))
    assert public == sorted(AGENT_NAMES)
    assert len(public) <= MAX_AGENT_NAMES
    assert Agent.__slots__ == ("_actor",)  # one small object: it holds its actor, nothing else
    section = _agent_api_section()
    undocumented = [n for n in public if f"| `{n}`" not in section and f"| `{n}(" not in section]
    assert undocumented == []
