"""The public namespaces are pinned: a name added, removed or renamed is a visible decision.

What users and extension authors import is chosen: the root; ``testing``; ``stores`` (the store
protocol and records, the built-in stores, store URLs) with ``stores.sqlite`` and
``stores.postgres``; ``llm`` (request, chunk and usage types, the adapter protocol, the built-in
adapters); ``events``; ``mcp``; ``otel``; ``config``; ``fleet``; ``serve`` (the server, an
extra); plus ``invariants`` (the log checker), ``cli`` (the ``dsh-agent`` entry point) and the
``bench`` modules that ``scripts/bench`` wraps.
Every other module is internal and named so: a dotted-path part starting with ``_``.

Changing one of these lists is fine when the change is meant (update CHANGELOG.md with it); the
test exists so that no public name appears or disappears by accident.
"""

from __future__ import annotations

import importlib
from pathlib import Path

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
        "ApprovalPendingError",
        "ApprovalRequest",
        "Compacted",
        "CompactionError",
        "CompactionPolicy",
        "ContextUsage",
        "ConfigError",
        "Deny",
        "Event",
        "Failure",
        "FleetClient",
        "FleetOptions",
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
        "open_client",
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
    "dsh_agent_loop.serve": ["serve"],
    "dsh_agent_loop.fleet": [
        "FleetClient",
        "FleetCommandError",
        "FleetOptions",
        "FleetStatus",
        "WorkerStatus",
        "open_client",
    ],
    "dsh_agent_loop.stores": [
        "FORMAT_VERSION",
        "JsonlStore",
        "MemoryStore",
        "ReadHandle",
        "STORE_URL_OPTIONS",
        "SessionInfo",
        "SessionStore",
        "SqliteStore",
        "StoreStatistics",
        "StoreUrl",
        "StoreUrlError",
        "WriteHandle",
        "info_from_events",
        "parse_store_url",
        "store_from_url",
    ],
    "dsh_agent_loop.stores.sqlite": [
        "SqliteStore",
        "SqliteStoreStatistics",
    ],
    "dsh_agent_loop.stores.postgres": ["PostgresStore"],
    "dsh_agent_loop.llm": [
        "AnthropicAdapter",
        "AnthropicStreamDecoder",
        "Assembler",
        "BUILTIN_MODELS",
        "BlockEnd",
        "BlockStart",
        "Chunk",
        "DEFAULT_STREAM_LIMITS",
        "FOLD_CHUNK",
        "Failure",
        "Finish",
        "ModelAdapter",
        "ModelError",
        "ModelInfo",
        "ModelRequest",
        "ModelRouter",
        "OpenAIAdapter",
        "OpenAIStreamDecoder",
        "PreparedCall",
        "REASONING_REPLAY_MODES",
        "ReasoningDelta",
        "ReasoningReplay",
        "Reply",
        "SSEEvent",
        "SSELimitError",
        "SSEParser",
        "ScriptedModel",
        "StreamLimits",
        "TRANSIENT_CODES",
        "TextDelta",
        "ToolCallDelta",
        "Usage",
        "UsageChunk",
        "lookup_model",
        "make_request",
        "resolve_model",
    ],
    "dsh_agent_loop.events": [
        "DURABLE_TYPES",
        "Event",
        "SURFACE_TYPES",
        "event_from_dict",
        "event_from_json",
        "event_to_dict",
        "event_to_json",
    ],
    "dsh_agent_loop.mcp": [
        "McpConnection",
        "McpServer",
        "McpServers",
        "McpServersStatistics",
        "McpStartError",
        "open_mcp_servers",
        "tool_result",
    ],
    "dsh_agent_loop.invariants": ["Violation", "check", "check_messages"],
    "dsh_agent_loop.cli": ["main"],
    "dsh_agent_loop.config": [
        "AgentEntry",
        "AnthropicProviderConfig",
        "CompactionConfig",
        "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
        "FileShape",
        "LoopConfig",
        "McpServerConfig",
        "McpToolConfig",
        "ModelConfig",
        "OpenAIProviderConfig",
        "FleetConfig",
        "OtelConfig",
        "PLUGIN_NAME",
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


#: The public ``Agent``'s names: a thin façade over its actor (``_agent/agent.py``), each name
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


#: Every public module of the package: the pinned namespaces, and the benchmark modules that
#: ``scripts/bench`` and ``dsh-agent bench`` run (tools, not an API: they keep no name list).
PUBLIC_MODULES = sorted(
    {
        *PINNED,
        "dsh_agent_loop.bench",
        "dsh_agent_loop.bench.compaction",
        "dsh_agent_loop.bench.fleet",
        "dsh_agent_loop.bench.loop",
        "dsh_agent_loop.bench.scale",
        "dsh_agent_loop.bench.stores",
        "dsh_agent_loop.cli.__main__",
    }
)


def public_modules(package_path: list[str], prefix: str) -> list[str]:
    """Modules under ``prefix`` with no private part (``_x``; dunders are not private)."""
    import pkgutil

    def private(part: str) -> bool:
        return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))

    names = [prefix.rstrip(".")]
    names += [info.name for info in pkgutil.walk_packages(package_path, prefix)]
    return sorted(n for n in names if not any(private(p) for p in n.split(".")))


def test_every_module_is_pinned_or_named_internal() -> None:
    import dsh_agent_loop

    assert public_modules(list(dsh_agent_loop.__path__), "dsh_agent_loop.") == PUBLIC_MODULES


def test_the_module_walk_sees_a_new_public_module(tmp_path: Path) -> None:
    pkg = tmp_path / "fakepkg"
    (pkg / "_inner").mkdir(parents=True)
    for rel in ("__init__.py", "api.py", "_private.py", "_inner/__init__.py", "_inner/deep.py"):
        (pkg / rel).write_text("", encoding="utf-8")
    assert public_modules([str(pkg)], "fakepkg.") == ["fakepkg", "fakepkg.api"]
