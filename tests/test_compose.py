"""Tests for dsh_agent_loop._compose: a config's records made into the runtime's live parts."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import dsh_agent_loop
from dsh_agent_loop import (
    AgentOptions,
    CompactionPolicy,
    ConfigError,
    Limits,
    Permissions,
    Sandbox,
    TurnBudget,
    tool,
)
from dsh_agent_loop import config as config_package
from dsh_agent_loop._compose import (
    Policies,
    adapter_from_config,
    compaction_policy,
    load_config,
    mcp_server_from_config,
    mcp_servers_from_config,
    options_from_entry,
    providers_from_config,
    store_from_config,
    tools_from_config,
)
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._tools.base import Tool
from dsh_agent_loop._tools.builtin import BUILTIN_TOOLS
from dsh_agent_loop.config import (
    PLUGIN_NAME,
    AgentEntry,
    AnthropicProviderConfig,
    ModelConfig,
    OpenAIProviderConfig,
    RuntimeConfig,
    ScriptedProviderConfig,
    ScriptedReplyConfig,
    ScriptedToolCallConfig,
    TimeoutConfig,
)
from dsh_agent_loop.config._compaction import CompactionConfig
from dsh_agent_loop.config._mcp import McpServerConfig, McpToolConfig
from dsh_agent_loop.config._providers import StreamLimitsConfig
from dsh_agent_loop.llm._anthropic import AnthropicAdapter
from dsh_agent_loop.llm._openai import OpenAIAdapter
from dsh_agent_loop.llm._scripted import Reply, ScriptedModel
from dsh_agent_loop.llm._stream_limits import StreamLimits
from dsh_agent_loop.stores._jsonl import JsonlStore
from dsh_agent_loop.stores._memory import MemoryStore
from dsh_agent_loop.stores.sqlite import SqliteStore

_MODULE = """
from dsh_agent_loop import tool

@tool
async def shout(text: str) -> str:
    \"\"\"Upper-case the text.\"\"\"
    return text.upper()
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a module on sys.path, not imported yet, holding the tool ``shout``."""
    name = f"composetools_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / "src"
    root.mkdir()
    (root / f"{name}.py").write_text(textwrap.dedent(_MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _with_agents(*agents: dict[str, Any], **block: Any) -> dict[str, Any]:
    return {"plugins": [{"name": PLUGIN_NAME, "config": {**block, "agents": list(agents)}}]}


class _Scope:
    """What an agent's setup sees of its scope: ``add_tool``."""

    def __init__(self) -> None:
        self.tools: list[Tool] = []

    def add_tool(self, tool: Tool) -> None:
        self.tools.append(tool)


# --- agents ----------------------------------------------------------------------------------


async def test_an_entry_becomes_options_and_a_setup_adding_its_referenced_tools(
    mod: str, tmp_path: Path
) -> None:
    persona = tmp_path / "persona.txt"
    persona.write_text("You are terse.", encoding="utf-8")
    entry = AgentEntry(
        id="a",
        provider="p",
        model="m",
        reasoning_effort="high",
        max_tokens=50,
        cwd="work",
        persona_file=str(persona),
        tools=("read_file", f"{mod}:shout"),
        turn_budget=TurnBudget(max_steps=3),
        require_approval=("write_file",),
        compaction=CompactionConfig(trigger_ratio=0.5, keep_recent_turns=1, instructions="x"),
        permissions=Permissions(deny=("run_command",)),
        sandbox=Sandbox(mode="read-only"),
    )
    options, setup = options_from_entry(entry)
    assert options == AgentOptions(
        id="a",
        provider="p",
        model="m",
        reasoning_effort="high",
        max_tokens=50,
        cwd="work",
        persona="You are terse.",
        tools=("read_file",),
        turn_budget=TurnBudget(max_steps=3),
        require_approval=frozenset({"write_file"}),
        compaction=CompactionPolicy(0.5, 1, "x"),
        permissions=Permissions(deny=("run_command",)),
        sandbox=Sandbox(mode="read-only"),
    )
    assert setup is not None
    scope = _Scope()
    await setup(scope, object())  # type: ignore[arg-type]
    assert [t.name for t in scope.tools] == ["shout"]


def test_an_entry_without_tools_sees_every_runtime_tool_and_needs_no_setup() -> None:
    options, setup = options_from_entry(AgentEntry(id="a", persona="p"))
    assert (options.tools, options.persona, options.compaction, setup) == (None, "p", None, None)
    options, setup = options_from_entry(AgentEntry(id="b", tools=()))
    assert (options.tools, setup) == ((), None)  # an empty list: no runtime tool


def test_a_compaction_record_becomes_its_policy() -> None:
    assert compaction_policy(None) is None
    assert compaction_policy(CompactionConfig()) == CompactionPolicy()
    policy = compaction_policy(CompactionConfig(0.6, 0, "keep names"))
    assert policy == CompactionPolicy(
        trigger_ratio=0.6, keep_recent_turns=0, instructions="keep names"
    )


def test_explicit_policies_win_over_the_config() -> None:
    config = load_config(
        _with_agents(
            compaction={"triggerRatio": 0.7},
            limits={"maxSubagents": 3},
            permissions={"mode": "allow-all"},
            sandbox="off",
        )
    )
    from_config = Policies.of(config, None, None, None, None)
    assert from_config == Policies(
        compaction=CompactionPolicy(trigger_ratio=0.7),
        limits=Limits(max_subagents=3),
        permissions=Permissions(mode="allow-all"),
        sandbox=Sandbox(mode="off"),
    )
    given = Policies(CompactionPolicy(0.2), Limits(max_subagents=9), Permissions(), Sandbox())
    assert Policies.of(config, *attrs_values(given)) == given
    assert Policies.of(RuntimeConfig(), None, None, None, None) == Policies()


def attrs_values(policies: Policies) -> tuple[Any, ...]:
    return (policies.compaction, policies.limits, policies.permissions, policies.sandbox)


# --- providers ------------------------------------------------------------------------------


async def test_an_openai_record_builds_its_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K", "sk-test")
    record = OpenAIProviderConfig(
        base_url="http://127.0.0.1:9/v1",
        api_key_env="K",
        headers=FrozenDict({"X-Team": "a"}),
        timeout=TimeoutConfig(connect=2, read=30),
        stream_limits=StreamLimitsConfig(max_line_bytes=1000),
        stream_usage=False,
        system_prompt_update="in-history",
        context_window=5000,
        reasoning_replay="always",
        models=FrozenDict({"m": ModelConfig(max_tokens=9)}),
    )
    adapter = adapter_from_config("o", record)
    try:
        assert isinstance(adapter, OpenAIAdapter)
        assert (adapter.name, adapter.url) == ("o", "http://127.0.0.1:9/v1/chat/completions")
        assert adapter.api_key_env == "K"
        assert adapter.stream_limits == StreamLimits(max_line_bytes=1000, idle_timeout=30.0)
        prepared = await adapter.prepare_call({"provider": "o", "model": "m"})
        assert prepared.context_window == 5000
        assert prepared.config["max_tokens"] == 9
        assert prepared.system_prompt_update == "in-history"
    finally:
        await adapter.aclose()


async def test_an_anthropic_record_without_a_key_variable_sends_no_key() -> None:
    adapter = adapter_from_config("a", AnthropicProviderConfig())
    try:
        assert isinstance(adapter, AnthropicAdapter)
        assert adapter.url == "https://api.anthropic.com/v1/messages"  # the default root
        assert adapter.api_key_env is None  # not the adapter's own ANTHROPIC_API_KEY default
        assert adapter.stream_limits == StreamLimits(idle_timeout=300.0)
    finally:
        await adapter.aclose()
    empty = adapter_from_config("o", OpenAIProviderConfig(api_key_env=""))
    try:
        assert isinstance(empty, OpenAIAdapter)
        assert empty.api_key_env is None
    finally:
        await empty.aclose()


def test_a_scripted_record_builds_its_script() -> None:
    record = ScriptedProviderConfig(
        replies=(
            ScriptedReplyConfig(text="hi", reasoning="r"),
            ScriptedReplyConfig(
                tool_calls=(ScriptedToolCallConfig(name="t", arguments=FrozenDict(a=1)),)
            ),
        ),
        latency_ms=20,
        loop=True,
        context_window=500,
        system_prompt_update="in-history",
    )
    model = adapter_from_config("s", record)
    assert isinstance(model, ScriptedModel)
    assert model.replies == [
        Reply(content="hi", thinking="r"),
        Reply(calls=(("t", '{"a":1}', None),)),
    ]
    assert (model.latency, model.loop, model.context_window) == (0.02, True, 500)
    assert model.system_prompt_update == "in-history"
    head = adapter_from_config("s", ScriptedProviderConfig(system_prompt_update="head"))
    assert isinstance(head, ScriptedModel)
    assert head.system_prompt_update is None


@pytest.mark.parametrize("given", [{"kind": "scripted"}, "scripted", None])
def test_anything_but_a_validated_record_is_refused(given: Any) -> None:
    with pytest.raises(TypeError, match=r"providers\.x: expected a validated provider record"):
        adapter_from_config("x", given)


async def test_every_provider_of_the_config_gets_its_adapter() -> None:
    config = load_config(
        {
            "providers": {
                "s": {"kind": "scripted", "replies": [{"text": "a"}]},
                "o": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
            }
        }
    )
    adapters = providers_from_config(config)
    try:
        assert list(adapters) == ["s", "o"]
        assert isinstance(adapters["s"], ScriptedModel)
        assert isinstance(adapters["o"], OpenAIAdapter)
    finally:
        for adapter in adapters.values():
            await adapter.aclose()


# --- tools ------------------------------------------------------------------------------------


def test_runtime_tools_come_from_the_config_and_explicit_ones_win(mod: str) -> None:
    config = load_config(_with_agents(tools=["list_dir", f"{mod}:shout"]))

    @tool
    async def list_dir(path: str) -> str:
        """Mine."""
        return path

    tools = tools_from_config(config, {"list_dir": list_dir})
    assert sorted(tools) == ["list_dir", "shout"]
    assert tools["list_dir"] is list_dir
    assert tools_from_config(config, {})["list_dir"] is BUILTIN_TOOLS["list_dir"]


def test_load_config_imports_references_where_the_config_package_does_not(mod: str) -> None:
    raw = _with_agents({"id": "a", "tools": [f"{mod}:shout", "nowhere_q:x", "grep"]})
    records = config_package.load_config(raw)  # the records only: nothing imported
    assert records.agents[0].tools == (f"{mod}:shout", "nowhere_q:x", "grep")
    assert mod not in sys.modules
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert mod in sys.modules
    message = str(info.value)
    assert re.findall(r"<config>: (\S+): ", message) == [
        "plugins[0].config.agents[0].tools[1]",
        "plugins[0].config.agents[0].tools[2]",
    ]
    assert "tools[1]: tool reference 'nowhere_q:x': cannot import 'nowhere_q'" in message
    assert "tools[2]: unknown tool 'grep'" in message
    assert dsh_agent_loop.load_config is load_config


# --- MCP servers and the store ------------------------------------------------------------------


def test_mcp_records_become_server_specs() -> None:
    files = McpServerConfig(
        command="npx",
        args=("-y", "server"),
        env=FrozenDict(DEBUG="1"),
        cwd="/tmp",
        tools=FrozenDict(read_file=McpToolConfig("parallel"), other=McpToolConfig()),
    )
    spec = mcp_server_from_config("files", files)
    assert (spec.name, spec.command, spec.args, spec.cwd) == (
        "files",
        "npx",
        ("-y", "server"),
        "/tmp",
    )
    assert spec.env == {"DEBUG": "1"}
    assert spec.execution_modes == {"read_file": "parallel"}
    assert (spec.url, spec.tool_prefix) == (None, "files__")
    web = mcp_server_from_config(
        "search", McpServerConfig(url="https://example.com/mcp", prefix="web_")
    )
    assert (web.url, web.headers, web.command, web.tool_prefix) == (
        "https://example.com/mcp",
        None,
        None,
        "web_",
    )
    bare = mcp_server_from_config("bare", McpServerConfig(command="srv"))
    assert (bare.env, bare.execution_modes) == (None, {})
    config = load_config(
        {"mcpServers": {"b": {"command": "x"}, "a": {"url": "http://127.0.0.1:9/mcp"}}}
    )
    assert [s.name for s in mcp_servers_from_config(config)] == ["b", "a"]


def test_the_store_comes_from_the_config_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(store_from_config(RuntimeConfig()), MemoryStore)
    assert isinstance(store_from_config(load_config({"store": "memory"})), MemoryStore)
    sqlite = store_from_config(load_config({"store": "sqlite:///s.db?busy_timeout=7"}))
    assert isinstance(sqlite, SqliteStore)
    assert sqlite.path == "s.db"
    jsonl = store_from_config(load_config({"store": "jsonl:///logs"}))
    assert isinstance(jsonl, JsonlStore)
    assert jsonl.directory == "logs"
    assert not (tmp_path / "s.db").exists()  # built, not opened
