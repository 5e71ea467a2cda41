"""Tests for dsh_agent_loop.config: loading, validation messages, settings layers."""

from __future__ import annotations

import copy
import string
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import open_runtime
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.config import (
    PLUGIN_NAME,
    AgentEntry,
    LoopConfig,
    ModelConfig,
    ProviderConfig,
    RuntimeConfig,
    ScriptedReplyConfig,
    ScriptedToolCallConfig,
    Settings,
    SettingsLayer,
    TimeoutConfig,
    TurnBudget,
    converter,
    load_config,
    load_settings_file,
)
from dsh_agent_loop.errors import ConfigError

SPEC_EXAMPLE = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      maxParallelToolCalls: 10
      persona: You are a careful assistant.        # runtime persona (optional)
      agents:
        - {id: main, provider: deepseek, model: deepseek-chat, reasoningEffort: high, cwd: .}
store: sqlite:///sessions.db          # "memory:" | jsonl:///dir | postgresql://…
providers:
  deepseek: {kind: openai, base_url: https://api.deepseek.com, api_key_env: DEEPSEEK_API_KEY}
  demo: {kind: scripted, replies: [{text: "Hello!"}], latency_ms: 20, loop: true}
"""

P0 = "plugins[0].config"


def config_with(
    *agents: dict[str, Any], providers: dict[str, Any] | None = None, **loop: Any
) -> dict[str, Any]:
    """A config mapping with the plugin block ``loop`` and ``agents``."""
    block: dict[str, Any] = dict(loop)
    if agents:
        block["agents"] = list(agents)
    out: dict[str, Any] = {"plugins": [{"name": PLUGIN_NAME, "config": block}]}
    out["providers"] = {"ds": {"kind": "openai"}} if providers is None else providers
    return out


def error_of(source: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source, **kwargs)
    assert info.value.code == "CONFIG_INVALID"
    message = str(info.value)
    assert "\n" not in message
    return message


# --- loading ----------------------------------------------------------------------------------


def test_spec_example_loads_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "agents.yaml").write_text(SPEC_EXAMPLE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = load_config("agents.yaml")
    assert config.source == "agents.yaml"
    assert config.store == "sqlite:///sessions.db"
    assert config.plugin.max_parallel_tool_calls == 10
    assert config.plugin.persona == "You are a careful assistant."
    assert config.agents == (
        AgentEntry(
            id="main", provider="deepseek", model="deepseek-chat", reasoning_effort="high", cwd="."
        ),
    )
    deepseek = config.providers["deepseek"]
    assert deepseek == ProviderConfig(
        kind="openai", base_url="https://api.deepseek.com", api_key_env="DEEPSEEK_API_KEY"
    )
    assert deepseek.timeout == TimeoutConfig(connect=10.0, read=300.0)
    assert deepseek.stream_usage is True
    demo = config.providers["demo"]
    assert demo.kind == "scripted"
    assert demo.replies == (ScriptedReplyConfig(text="Hello!"),)
    assert demo.latency_ms == 20.0
    assert demo.loop is True


def test_spec_example_loads_from_mapping_and_path_object(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(SPEC_EXAMPLE, encoding="utf-8")
    from_path = load_config(path)
    from_mapping = load_config(yaml.safe_load(SPEC_EXAMPLE))
    assert from_mapping.source == "<config>"
    assert from_path.source == str(path)
    assert attrs.evolve(from_path, source="<config>") == from_mapping


def test_every_section_is_optional(tmp_path: Path) -> None:
    empty = RuntimeConfig()
    assert load_config(None) == empty
    assert load_config({}) == empty
    assert load_config({"plugins": [{"name": PLUGIN_NAME}]}) == empty
    (tmp_path / "empty.yaml").write_text("# nothing\n", encoding="utf-8")
    assert load_config(tmp_path / "empty.yaml").plugin == LoopConfig()
    assert load_config({"store": "memory:"}).store == "memory:"


def test_null_means_not_set(tmp_path: Path) -> None:
    text = "plugins:\n  - name: '@deepseek-ai/dsh-agent-loop'\n    config:\n      agents:\n"
    text += "store:\nproviders:\n  # deepseek: {kind: openai}\n"
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    assert attrs.evolve(load_config(tmp_path / "c.yaml"), source="<config>") == RuntimeConfig()
    loaded = load_config(config_with({"id": "a", "tools": None, "maxTokens": None}))
    assert loaded.agents == (AgentEntry(id="a"),)
    assert error_of(config_with({"id": None})) == (
        f"<config>: {P0}.agents[0].id: must be a non-empty string, got null"
    )


def test_records_are_frozen() -> None:
    config = load_config(yaml.safe_load(SPEC_EXAMPLE))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.store = "memory"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.providers["x"] = ProviderConfig(kind="openai")  # type: ignore[index]
    assert hash(config) == hash(load_config(yaml.safe_load(SPEC_EXAMPLE)))


def test_camel_case_keys_map_to_every_agent_field(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("persona", encoding="utf-8")
    agent = {
        "id": "a",
        "provider": "ds",
        "model": "m",
        "reasoningEffort": "low",
        "maxTokens": 5,
        "cwd": "work",
        "sessionId": "s-1",
        "personaFile": "p.md",
        "tools": ["read_file", "grep"],
        "turnBudget": {"maxSteps": 1, "maxToolCalls": 2, "maxTotalTokens": 3, "maxSeconds": 4},
    }
    resumed = {"id": "b", "resumeSessionId": "s-0", "persona": "be brief"}
    loop = {"maxParallelToolCalls": 3, "turnBudget": {"maxSteps": 9}}
    config = load_config(config_with(agent, resumed, **loop), base_dir=tmp_path)
    assert config.plugin.max_parallel_tool_calls == 3
    assert config.plugin.turn_budget == TurnBudget(max_steps=9)
    assert config.agents[0] == AgentEntry(
        id="a",
        provider="ds",
        model="m",
        reasoning_effort="low",
        max_tokens=5,
        cwd="work",
        session_id="s-1",
        persona_file=str(tmp_path / "p.md"),
        tools=("read_file", "grep"),
        turn_budget=TurnBudget(max_steps=1, max_tool_calls=2, max_total_tokens=3, max_seconds=4.0),
    )
    assert config.agents[1] == AgentEntry(id="b", resume_session_id="s-0", persona="be brief")


def test_unstructure_gives_the_file_shape_back() -> None:
    config = load_config(config_with({"id": "a", "maxTokens": 7, "reasoningEffort": "high"}))
    raw = converter.unstructure(config)
    assert raw == {
        "plugins": [
            {
                "name": PLUGIN_NAME,
                "config": {"agents": [{"id": "a", "reasoningEffort": "high", "maxTokens": 7}]},
            }
        ],
        "providers": {"ds": {"kind": "openai"}},
    }
    assert converter.structure(raw, RuntimeConfig) == config


def test_provider_keys(tmp_path: Path) -> None:
    raw = {
        "kind": "anthropic",
        "base_url": "https://example.test",
        "headers": {"X-Team": "a"},
        "timeout": {"connect": 2},
        "stream_usage": False,
        "system_prompt_update": "head",
        "context_window": 1000,
        "models": {"claude-x": {"context_window": 9, "max_tokens": 8, "reasoning_effort": "low"}},
    }
    provider = load_config({"providers": {"a": raw}}).providers["a"]
    assert provider.timeout == TimeoutConfig(connect=2.0, read=300.0)
    assert provider.headers == {"X-Team": "a"}
    assert provider.models["claude-x"] == ModelConfig(
        context_window=9, max_tokens=8, reasoning_effort="low"
    )
    assert provider.system_prompt_update == "head"
    assert provider.stream_usage is False
    scripted = {
        "kind": "scripted",
        "replies": [
            {"reasoning": "hm", "tool_calls": [{"name": "t", "arguments": {"x": [1, {"y": 2}]}}]}
        ],
    }
    reply = load_config({"providers": {"s": scripted}}).providers["s"].replies[0]
    assert reply.tool_calls == (ScriptedToolCallConfig(name="t", arguments={"x": [1, {"y": 2}]}),)
    assert isinstance(reply.tool_calls[0].arguments, FrozenDict)


@pytest.mark.parametrize(
    "url",
    [
        "memory",
        "memory:",
        "sqlite:///sessions.db",
        "sqlite:////abs/x.db",
        "jsonl:///dir",
        "postgresql://u@h/db",
        "postgres://h",
    ],
)
def test_store_urls_accepted(url: str) -> None:
    assert load_config({"store": url}).store == url


def test_explicit_provider_names_count_as_known() -> None:
    source = config_with({"id": "a", "provider": "extra"})
    assert "unknown provider 'extra'" in error_of(source)
    config = load_config(source, known_providers=["extra"])
    assert config.agents[0].provider == "extra"
    no_section = {"plugins": [{"name": PLUGIN_NAME, "config": {"agents": [{"id": "a"}]}}]}
    assert load_config(no_section).agents[0].provider is None


def test_persona_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "persona.md").write_text("You are terse.", encoding="utf-8")
    text = yaml.safe_dump(config_with({"id": "a", "personaFile": "persona.md"}, providers={}))
    (tmp_path / "conf" / "c.yaml").write_text(text, encoding="utf-8")
    config = load_config(tmp_path / "conf" / "c.yaml")
    assert config.agents[0].persona_file == str(tmp_path / "conf" / "persona.md")
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    message = error_of(tmp_path / "c.yaml")
    assert message == (
        f"{tmp_path / 'c.yaml'}: {P0}.agents[0].personaFile: "
        f"file not found: {tmp_path / 'persona.md'}"
    )


def test_runtime_config_is_validated_and_returned_as_is() -> None:
    good = load_config(config_with({"id": "a", "provider": "ds"}))
    assert load_config(good) is good
    bad = RuntimeConfig(plugin=LoopConfig(agents=(AgentEntry(id="a", max_tokens=0),)))
    assert error_of(bad) == f"<config>: {P0}.agents[0].maxTokens: must be a positive integer"
    elsewhere = RuntimeConfig(plugin=LoopConfig(agents=(AgentEntry(id="a", provider="x"),)))
    assert load_config(elsewhere, known_providers={"x"}) is elsewhere


# --- rejections -------------------------------------------------------------------------------

REJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "wrong type: string for an integer",
        config_with(maxParallelToolCalls="10"),
        f"{P0}.maxParallelToolCalls: must be a positive integer, got string",
    ),
    (
        "wrong type: bool is not an integer",
        config_with({"id": "a", "maxTokens": True}),
        f"{P0}.agents[0].maxTokens: must be a positive integer, got boolean",
    ),
    (
        "wrong type: number for a string",
        config_with({"id": "a", "model": 4}),
        f"{P0}.agents[0].model: must be a non-empty string, got integer",
    ),
    (
        "wrong type: agents is not a list",
        config_with(agents={"id": "a"}),
        f"{P0}.agents: expected a list, got mapping",
    ),
    (
        "wrong type: tools is a string",
        config_with({"id": "a", "tools": "read_file"}),
        f"{P0}.agents[0].tools: expected a list, got string",
    ),
    (
        "empty tool name",
        config_with({"id": "a", "tools": ["read_file", ""]}),
        f"{P0}.agents[0].tools[1]: must be a non-empty string",
    ),
    (
        "unknown top-level key",
        {"plugin": []},
        "plugin: unknown key (allowed: plugins, store, providers)",
    ),
    (
        "unknown agent key (snake_case in the camelCase block)",
        config_with({"id": "a", "max_tokens": 5}),
        f"{P0}.agents[0].max_tokens: unknown key (allowed: id, provider, model, "
        "reasoningEffort, maxTokens, cwd, sessionId, resumeSessionId, persona, personaFile, "
        "tools, turnBudget)",
    ),
    (
        "unknown provider key (camelCase in the snake_case section)",
        {"providers": {"p": {"kind": "openai", "baseUrl": "x"}}},
        "providers.p.baseUrl: unknown key (allowed: kind, base_url, api_key_env, headers, "
        "timeout, stream_usage, system_prompt_update, context_window, reasoning_replay, models, "
        "replies, latency_ms, loop)",
    ),
    (
        "provider base_url that is not http",
        {"providers": {"p": {"kind": "openai", "base_url": "file:///etc"}}},
        "providers.p.base_url: must be an http:// or https:// URL",
    ),
    (
        "anthropic base_url without a host",
        {"providers": {"p": {"kind": "anthropic", "base_url": "https://"}}},
        "providers.p.base_url: must be an http:// or https:// URL",
    ),
    (
        "unknown turn budget key",
        config_with(turnBudget={"steps": 3}),
        f"{P0}.turnBudget.steps: unknown key (allowed: maxSteps, maxToolCalls, "
        "maxTotalTokens, maxSeconds)",
    ),
    (
        "maxParallelToolCalls below 1",
        config_with(maxParallelToolCalls=0),
        f"{P0}.maxParallelToolCalls: must be a positive integer",
    ),
    (
        "maxTokens below 1",
        config_with({"id": "a"}, {"id": "b", "maxTokens": 0}),
        f"{P0}.agents[1].maxTokens: must be a positive integer",
    ),
    (
        "maxTokens not an integer",
        config_with({"id": "a", "maxTokens": 2.5}),
        f"{P0}.agents[0].maxTokens: must be a positive integer, got number",
    ),
    (
        "empty reasoningEffort",
        config_with({"id": "a", "reasoningEffort": " "}),
        f"{P0}.agents[0].reasoningEffort: must be a non-empty string",
    ),
    (
        "sessionId with resumeSessionId",
        config_with({"id": "a", "sessionId": "s", "resumeSessionId": "r"}),
        f"{P0}.agents[0].resumeSessionId: cannot be combined with sessionId",
    ),
    (
        "agent naming an unknown provider",
        config_with({"id": "a", "provider": "deepseek"}),
        f"{P0}.agents[0].provider: unknown provider 'deepseek' (known: ds)",
    ),
    (
        "unknown provider with no providers at all",
        config_with({"id": "a", "provider": "deepseek"}, providers={}),
        f"{P0}.agents[0].provider: unknown provider 'deepseek' (known: none configured)",
    ),
    (
        "bad store URL",
        {"store": "mysql://db"},
        "store: unsupported store URL 'mysql://db' (expected memory, sqlite:///PATH, "
        "jsonl:///PATH or postgresql://...)",
    ),
    (
        "store URL with two slashes",
        {"store": "sqlite://sessions.db"},
        "store: unsupported store URL 'sqlite://sessions.db' (expected memory, "
        "sqlite:///PATH, jsonl:///PATH or postgresql://...)",
    ),
    (
        "store URL without a path",
        {"store": "jsonl:///"},
        "store: store URL 'jsonl:///' has no PATH",
    ),
    (
        "unquoted memory: in YAML is a mapping",
        {"store": {"memory": None}},
        "store: must be a store URL string, got mapping",
    ),
    (
        "duplicate agent ids",
        config_with({"id": "a"}, {"id": "b"}, {"id": "a"}),
        f"{P0}.agents[2].id: duplicate agent id 'a' (also agents[0])",
    ),
    (
        "unknown provider kind",
        {"providers": {"g": {"kind": "gemini"}}},
        "providers.g.kind: unknown provider kind 'gemini' (expected openai, anthropic or scripted)",
    ),
    (
        "provider without kind",
        {"providers": {"g": {"base_url": "x"}}},
        "providers.g.kind: required key missing",
    ),
    (
        "persona with personaFile",
        config_with({"id": "a", "persona": "x", "personaFile": "p.md"}),
        f"{P0}.agents[0].personaFile: cannot be combined with persona",
    ),
    (
        "agent without id",
        config_with({"model": "m"}),
        f"{P0}.agents[0].id: required key missing",
    ),
    (
        "unknown plugin",
        {"plugins": [{"name": PLUGIN_NAME}, {"name": "@acme/other", "config": {"x": 1}}]},
        f"plugins[1].name: unknown plugin '@acme/other' (expected '{PLUGIN_NAME}')",
    ),
    (
        "plugin entry twice",
        {"plugins": [{"name": PLUGIN_NAME}, {"name": PLUGIN_NAME}]},
        "plugins[1].name: duplicate plugin entry (first at plugins[0])",
    ),
    (
        "scripted keys on an HTTP provider",
        {"providers": {"p": {"kind": "openai", "loop": True}}},
        "providers.p.loop: only valid for kind 'scripted'",
    ),
    (
        "HTTP keys on a scripted provider",
        {"providers": {"p": {"kind": "scripted", "api_key_env": "K"}}},
        "providers.p.api_key_env: not valid for kind 'scripted'",
    ),
    (
        "non-positive budget",
        config_with({"id": "a", "turnBudget": {"maxSeconds": 0}}),
        f"{P0}.agents[0].turnBudget.maxSeconds: must be a positive number",
    ),
    (
        "negative latency",
        {"providers": {"s": {"kind": "scripted", "latency_ms": -1}}},
        "providers.s.latency_ms: must be a non-negative number",
    ),
    (
        "bad system_prompt_update",
        {"providers": {"s": {"kind": "scripted", "system_prompt_update": "tail"}}},
        "providers.s.system_prompt_update: must be one of 'in-history', 'head', got 'tail'",
    ),
    (
        "header value not a string",
        {"providers": {"p": {"kind": "openai", "headers": {"X-N": 1}}}},
        "providers.p.headers.X-N: expected a string, got integer",
    ),
    (
        "provider name with a dot is quoted in the path",
        {"providers": {"a.b": {"kind": "x"}}},
        "providers['a.b'].kind: unknown provider kind 'x' (expected openai, anthropic or scripted)",
    ),
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param(src, exp, id=name) for name, src, exp in REJECTIONS],
)
def test_rejection_rules(source: dict[str, Any], expected: str) -> None:
    before = copy.deepcopy(source)
    assert error_of(source) == f"<config>: {expected}"
    assert source == before


def test_reply_tool_call_arguments_default_to_empty() -> None:
    source = {
        "providers": {"s": {"kind": "scripted", "replies": [{"tool_calls": [{"name": "t"}]}]}}
    }
    reply = load_config(source).providers["s"].replies[0]
    assert reply.tool_calls[0].arguments == {}
    bad = {
        "providers": {
            "s": {"kind": "scripted", "replies": [{"tool_calls": [{"name": "t", "arguments": 1}]}]}
        }
    }
    assert error_of(bad) == (
        "<config>: providers.s.replies[0].tool_calls[0].arguments: expected a mapping, got integer"
    )


def test_example_message_from_the_brief(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {id: a}
        - {id: b, maxTokens: -3}
"""
    (tmp_path / "quick.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert error_of("quick.yaml") == (
        "quick.yaml: plugins[0].config.agents[1].maxTokens: must be a positive integer"
    )


def test_several_errors_are_joined_in_file_order() -> None:
    source = {
        "store": "redis://x",
        "plugins": [
            {
                "name": PLUGIN_NAME,
                "config": {
                    "agents": [
                        {"id": "a", "provider": "nope", "maxTokens": 0},
                        {"id": "a", "reasoningEffort": ""},
                    ],
                    "maxParallelToolCalls": -1,
                },
            }
        ],
        "providers": {"ds": {"kind": "openai", "timeout": {"read": "slow"}}},
    }
    assert error_of(source) == "; ".join(
        [
            "<config>: store: unsupported store URL 'redis://x' (expected memory, "
            "sqlite:///PATH, jsonl:///PATH or postgresql://...)",
            f"<config>: {P0}.agents[0].provider: unknown provider 'nope' (known: ds)",
            f"<config>: {P0}.agents[0].maxTokens: must be a positive integer",
            f"<config>: {P0}.agents[1].id: duplicate agent id 'a' (also agents[0])",
            f"<config>: {P0}.agents[1].reasoningEffort: must be a non-empty string",
            f"<config>: {P0}.maxParallelToolCalls: must be a positive integer",
            "<config>: providers.ds.timeout.read: must be a positive number, got string",
        ]
    )


def test_cross_field_rules_run_even_when_the_structure_is_broken() -> None:
    source = config_with({"id": "a", "maxTokens": "many"}, {"id": "a"}, maxParallelToolCalls=[])
    assert error_of(source) == "; ".join(
        [
            f"<config>: {P0}.maxParallelToolCalls: must be a positive integer, got list",
            f"<config>: {P0}.agents[0].maxTokens: must be a positive integer, got string",
            f"<config>: {P0}.agents[1].id: duplicate agent id 'a' (also agents[0])",
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plugins: [\n", "c.yaml: 2:1: invalid YAML: expected the node content, but found"),
        ("store: memory\nstore: x\n", "c.yaml: 2:1: invalid YAML: duplicate key 'store'"),
        ("a: b: c\n", "c.yaml: 1:5: invalid YAML: mapping values are not allowed here"),
    ],
)
def test_yaml_syntax_errors_name_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert error_of("c.yaml").startswith(expected)


def test_unreadable_and_non_mapping_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert error_of("absent.yaml") == "absent.yaml: cannot read: No such file or directory"
    (tmp_path / "list.yaml").write_text("- 1\n", encoding="utf-8")
    assert error_of("list.yaml") == "list.yaml: expected a mapping at the top level, got list"
    with pytest.raises(TypeError):
        load_config(42)  # type: ignore[arg-type]


# --- limits: size, aliases, nesting -----------------------------------------------------------

MIB = 1024 * 1024


def billion_laughs(indent: str = "") -> str:
    """The classic file: nine levels, each a list of nine aliases of the level below."""
    lines = [f'{indent}lol1: &lol1 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(2, 10):
        aliases = ",".join([f"*lol{level - 1}"] * 9)
        lines.append(f"{indent}lol{level}: &lol{level} [{aliases}]")
    return "\n".join(lines) + "\n"


# The same bomb where every value is legal: scripted tool-call arguments are free-form JSON.
HIDDEN_BOMB = (
    "providers:\n  s:\n    kind: scripted\n    replies:\n      - tool_calls:\n"
    "          - name: t\n            arguments:\n" + billion_laughs(" " * 14)
)


@pytest.mark.parametrize(
    ("text", "where"),
    [(billion_laughs(), "5:14"), (HIDDEN_BOMB, "12:28")],
    ids=["classic", "in-tool-arguments"],
)
def test_a_billion_laughs_file_is_refused_before_expansion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, where: str
) -> None:
    """Regression (issue 10 item 14): aliases were expanded by every walk of the loaded tree."""
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert error_of("c.yaml") == (
        f"c.yaml: {where}: YAML aliases expand to more than 10000 nodes; refusing"
    )


def test_alias_uses_are_budgeted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scalars = "headers: {a: &h x, " + ", ".join(f"k{i}: *h" for i in range(101)) + "}"
    (tmp_path / "many.yaml").write_text(f"providers:\n  p: {{kind: openai, {scalars}}}\n")
    assert error_of("many.yaml").startswith("many.yaml: 2:")
    assert error_of("many.yaml").endswith(": more than 100 YAML aliases; refusing to expand them")
    (tmp_path / "self.yaml").write_text("store: &loop [*loop]\n", encoding="utf-8")
    assert error_of("self.yaml") == "self.yaml: 1:15: YAML alias *loop refers to itself"
    # Ordinary reuse stays well inside the budget.
    (tmp_path / "ok.yaml").write_text(
        "providers:\n"
        "  a: &base {kind: openai, base_url: 'https://x', timeout: {connect: 1, read: 2}}\n"
        "  b: {<<: *base, api_key_env: B}\n"
        "  c: {<<: *base, headers: {x: y}}\n",
        encoding="utf-8",
    )
    config = load_config("ok.yaml")
    assert config.providers["c"].timeout == TimeoutConfig(connect=1, read=2)
    assert config.providers["b"].api_key_env == "B"


def test_files_over_one_mib_are_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 10 item 14): any size was read and parsed."""
    monkeypatch.chdir(tmp_path)
    padded = "store: memory\n#"
    (tmp_path / "limit.yaml").write_text(padded + "x" * (MIB - len(padded)), encoding="utf-8")
    assert (tmp_path / "limit.yaml").stat().st_size == MIB
    assert load_config("limit.yaml").store == "memory"
    (tmp_path / "over.yaml").write_text(padded + "x" * (MIB + 1 - len(padded)), encoding="utf-8")
    expected = "over.yaml: file is larger than 1048576 bytes (1 MiB)"
    assert error_of("over.yaml") == expected
    with (tmp_path / "huge.yaml").open("wb") as huge:  # sparse: 1 GiB of NULs, nothing on disk
        huge.truncate(1024 * MIB)
    assert error_of("huge.yaml") == expected.replace("over", "huge")
    (tmp_path / "settings.yaml").write_text(padded + "x" * MIB, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"settings\.yaml: file is larger than 1048576 bytes"):
        load_settings_file(tmp_path / "settings.yaml")


def deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_mapping(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


DEEP = 10_000
LIST_PATH = "store" + "[0]" * 63
MAP_PATH = "providers" + ".a" * 63


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"store: {'[' * DEEP}{']' * DEEP}\n",
            f"{LIST_PATH}: nested deeper than 64 levels (at 1:71)",
        ),
        (
            f"providers: {'{a: ' * DEEP}1{'}' * DEEP}\n",
            f"{MAP_PATH}: nested deeper than 64 levels (at 1:264)",
        ),
        (
            "store:\n" + "".join(f"{'  ' * i}- \n" for i in range(100)),
            f"{LIST_PATH}: nested deeper than 64 levels (at 65:127)",
        ),
    ],
    ids=["flow-lists", "flow-mappings", "block-lists"],
)
def test_deep_yaml_is_a_config_error_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    """Regression (issue 10 item 14): deep nesting raised RecursionError."""
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert error_of("c.yaml") == f"c.yaml: {expected}"
    (tmp_path / "settings.yaml").write_text(text.replace("store", "persona"), encoding="utf-8")
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_settings_file(tmp_path / "settings.yaml")


def test_deep_mappings_are_a_config_error_naming_the_path() -> None:
    """Regression (issue 10 item 14): a deep mapping given directly raised RecursionError."""
    message = "nested deeper than 64 levels"
    assert error_of({"store": deep_list(DEEP)}) == f"<config>: {LIST_PATH}: {message}"
    assert error_of({"providers": deep_mapping(DEEP)}) == f"<config>: {MAP_PATH}: {message}"
    cycle: dict[str, Any] = {}
    cycle["a"] = cycle
    assert error_of({"providers": cycle}) == f"<config>: {MAP_PATH}: {message}"
    shared: Any = ["lol"] * 9
    for _ in range(8):  # a billion laughs made of shared Python lists
        shared = [shared] * 9
    assert error_of({"providers": {"s": {"kind": "scripted", "replies": shared}}}) == (
        "<config>: more than 250000 values"
    )


async def test_open_runtime_refuses_a_deep_config_mapping() -> None:
    """Regression (issue 10 item 14): ``open_runtime(config=...)`` raised RecursionError."""
    with pytest.raises(ConfigError) as info:
        async with open_runtime(config={"providers": deep_mapping(DEEP)}):
            pass
    assert str(info.value) == f"<config>: {MAP_PATH}: nested deeper than 64 levels"


def test_the_deepest_allowed_nesting_loads(tmp_path: Path) -> None:
    """64 levels load (the top-level mapping is level 1): the limit is not off by one."""
    arguments = deep_mapping(64 - 7)  # below: the file, providers, s, replies, [0], tool_calls, [0]
    raw = {"providers": {"s": {"kind": "scripted", "replies": [{"tool_calls": [{}]}]}}}
    call = raw["providers"]["s"]["replies"][0]["tool_calls"][0]
    call.update(name="t", arguments=arguments)
    loaded = load_config(raw)
    (reply,) = loaded.providers["s"].replies
    assert reply.tool_calls[0].arguments == arguments
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_config(path).providers == loaded.providers
    call["arguments"] = {"a": arguments}
    assert error_of(raw).endswith(".a: nested deeper than 64 levels")
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert error_of(path).endswith(".a: nested deeper than 64 levels (at 63:126)")


# --- settings ---------------------------------------------------------------------------------


def test_settings_defaults() -> None:
    s = Settings()
    assert s.max_parallel_tool_calls == 10
    assert s.turn_budget is None
    assert s.persona is None


def test_settings_precedence() -> None:
    plugin = LoopConfig(max_parallel_tool_calls=8, persona="plugin", turn_budget=TurnBudget(1))
    assert Settings(plugin).max_parallel_tool_calls == 8
    user = {"maxParallelToolCalls": 4, "turnBudget": {"maxSeconds": 5}}
    s = Settings(plugin, user)
    assert (s.max_parallel_tool_calls, s.persona) == (4, "plugin")
    assert s.turn_budget == TurnBudget(max_seconds=5.0)
    explicit = Settings(plugin, user, max_parallel_tool_calls=2, persona="explicit")
    assert (explicit.max_parallel_tool_calls, explicit.persona) == (2, "explicit")
    assert explicit.turn_budget == TurnBudget(max_seconds=5.0)


def test_update_user_layer_is_read_live() -> None:
    s = Settings(LoopConfig(max_parallel_tool_calls=6))
    assert s.max_parallel_tool_calls == 6
    s.update_user_layer({"maxParallelToolCalls": 1})
    assert s.max_parallel_tool_calls == 1
    assert s.user_layer == SettingsLayer(max_parallel_tool_calls=1)
    s.update_user_layer(SettingsLayer(persona="p"))
    assert (s.max_parallel_tool_calls, s.persona) == (6, "p")
    s.update_user_layer(None)
    assert (s.max_parallel_tool_calls, s.persona) == (6, None)
    pinned = Settings(max_parallel_tool_calls=3)
    pinned.update_user_layer({"maxParallelToolCalls": 9})
    assert pinned.max_parallel_tool_calls == 3


def test_bad_user_layer_is_rejected_and_the_old_one_kept() -> None:
    s = Settings(user={"maxParallelToolCalls": 5})
    with pytest.raises(ConfigError) as info:
        s.update_user_layer({"maxParallelToolCalls": 0, "agents": []})
    assert str(info.value) == (
        "<settings>: maxParallelToolCalls: must be a positive integer; <settings>: agents: "
        "unknown key (allowed: maxParallelToolCalls, persona, turnBudget)"
    )
    assert s.max_parallel_tool_calls == 5
    with pytest.raises(ConfigError, match=r"^<settings>: maxParallelToolCalls: must be a posi"):
        Settings(user={"maxParallelToolCalls": True})
    with pytest.raises(ConfigError, match="expected a mapping at the top level, got list"):
        s.update_user_layer([1])  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_explicit_settings_are_validated(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Settings(max_parallel_tool_calls=value)
    assert str(info.value) == "<arguments>: max_parallel_tool_calls: must be a positive integer"


def test_load_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    assert load_settings_file(path) == {}
    path.write_text("maxParallelToolCalls: 2\npersona: hi\n", encoding="utf-8")
    loaded = load_settings_file(path)
    assert loaded == {"maxParallelToolCalls": 2, "persona": "hi"}
    assert Settings(LoopConfig(max_parallel_tool_calls=7), loaded).max_parallel_tool_calls == 2
    path.write_text("maxParallelToolCalls: 0\nagents: []\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings_file(path)
    assert str(info.value) == (
        f"{path}: maxParallelToolCalls: must be a positive integer; {path}: agents: unknown "
        "key (allowed: maxParallelToolCalls, persona, turnBudget)"
    )
    path.write_text("", encoding="utf-8")
    assert load_settings_file(path) == {}


# --- properties -------------------------------------------------------------------------------

_names = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=8)
# PyYAML folds Unicode line breaks (NEL, LS, PS) and control characters, so texts that must
# survive a YAML round trip avoid them.
_texts = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=12)
_non_empty = _texts.filter(lambda s: bool(s.strip()))
_pos_ints = st.integers(min_value=1, max_value=2**40)
_pos_floats = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _pos_floats | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)
_budgets = st.builds(
    TurnBudget,
    max_steps=st.none() | _pos_ints,
    max_tool_calls=st.none() | _pos_ints,
    max_total_tokens=st.none() | _pos_ints,
    max_seconds=st.none() | _pos_floats,
)
_replies = st.builds(
    ScriptedReplyConfig,
    text=st.none() | _texts,
    reasoning=st.none() | _texts,
    tool_calls=st.lists(
        st.builds(
            ScriptedToolCallConfig,
            name=_non_empty,
            arguments=st.dictionaries(_texts, _json, max_size=3),
        ),
        max_size=2,
    ),
)
_scripted = st.builds(
    ProviderConfig,
    kind=st.just("scripted"),
    replies=st.lists(_replies, max_size=3),
    latency_ms=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    loop=st.booleans(),
    system_prompt_update=st.sampled_from([None, "in-history", "head"]),
    context_window=st.none() | _pos_ints,
)
_http = st.builds(
    ProviderConfig,
    kind=st.sampled_from(["openai", "anthropic"]),
    base_url=st.none()
    | st.builds("http://{}:8000/v1".format, st.from_regex(r"[a-z]{1,12}", fullmatch=True)),
    api_key_env=st.none() | _non_empty,
    headers=st.dictionaries(_texts, _texts, max_size=2),
    timeout=st.builds(TimeoutConfig, connect=_pos_floats, read=_pos_floats),
    stream_usage=st.booleans(),
    models=st.dictionaries(
        _non_empty,
        st.builds(
            ModelConfig,
            context_window=st.none() | _pos_ints,
            max_tokens=st.none() | _pos_ints,
            reasoning_effort=st.none() | _non_empty,
        ),
        max_size=2,
    ),
)


@st.composite
def runtime_configs(draw: st.DrawFn) -> RuntimeConfig:
    providers = draw(st.dictionaries(_names, _scripted | _http, max_size=3))
    ids = draw(st.lists(_non_empty, unique=True, max_size=4))
    agents = []
    for agent_id in ids:
        session = draw(st.sampled_from(["session_id", "resume_session_id", None]))
        extra = {session: draw(_non_empty)} if session else {}
        agents.append(
            AgentEntry(
                id=agent_id,
                provider=draw(st.none() | st.sampled_from(sorted(providers) or [None])),
                model=draw(st.none() | _non_empty),
                reasoning_effort=draw(st.none() | _non_empty),
                max_tokens=draw(st.none() | _pos_ints),
                cwd=draw(st.none() | _non_empty),
                persona=draw(st.none() | _texts),
                tools=draw(st.none() | st.tuples(_names, _names)),
                turn_budget=draw(st.none() | _budgets),
                **extra,
            )
        )
    plugin = LoopConfig(
        max_parallel_tool_calls=draw(st.none() | _pos_ints),
        persona=draw(st.none() | _texts),
        turn_budget=draw(st.none() | _budgets),
        agents=agents,
    )
    store = draw(st.sampled_from([None, "memory", "memory:", "sqlite:///x.db", "postgres://h"]))
    return RuntimeConfig(plugin=plugin, store=store, providers=providers)


@settings(max_examples=60, deadline=None)
@given(runtime_configs())
def test_round_trip_through_the_converter_and_yaml(config: RuntimeConfig) -> None:
    raw = converter.unstructure(config)
    assert load_config(raw) == config
    assert load_config(config) is config
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
        assert load_config(path) == attrs.evolve(config, source=str(path))


_layers = st.builds(
    SettingsLayer,
    max_parallel_tool_calls=st.none() | _pos_ints,
    persona=st.none() | _texts,
    turn_budget=st.none() | _budgets,
)


@given(plugin=_layers, user=_layers, explicit=st.none() | _pos_ints)
def test_the_highest_layer_that_sets_a_value_wins(
    plugin: SettingsLayer, user: SettingsLayer, explicit: int | None
) -> None:
    s = Settings(plugin, converter.unstructure(user), max_parallel_tool_calls=explicit)
    candidates = [explicit, user.max_parallel_tool_calls, plugin.max_parallel_tool_calls, 10]
    assert s.max_parallel_tool_calls == next(v for v in candidates if v is not None)
    expected_persona = user.persona if user.persona is not None else plugin.persona
    assert s.persona == expected_persona
    assert s.turn_budget == (user.turn_budget or plugin.turn_budget)


def test_resolved_settings_are_recomputed_after_each_user_layer_update() -> None:
    s = Settings(LoopConfig(persona="plugin"))
    for _ in range(2):  # a repeated read is answered from the resolved values
        assert s.persona == "plugin"
    s.update_user_layer({"persona": "user"})
    assert s.persona == "user"
    s.update_user_layer({"maxParallelToolCalls": 2})
    assert (s.persona, s.max_parallel_tool_calls) == ("plugin", 2)
