"""Tests for dsh_agent_loop.config._loading: files, YAML limits, the whole document."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given, settings

from dsh_agent_loop import open_runtime
from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config import (
    PLUGIN_NAME,
    AgentEntry,
    LoopConfig,
    OpenAIProviderConfig,
    RuntimeConfig,
    ScriptedReplyConfig,
    TimeoutConfig,
    converter,
    load_config,
    load_settings_file,
)

from .helpers import P0, SEED_EXAMPLE, config_with, error_of, runtime_configs


def test_spec_example_loads_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "agents.yaml").write_text(SEED_EXAMPLE, encoding="utf-8")
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
    assert deepseek == OpenAIProviderConfig(
        base_url="https://api.deepseek.com", api_key_env="DEEPSEEK_API_KEY"
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
    path.write_text(SEED_EXAMPLE, encoding="utf-8")
    from_path = load_config(path)
    from_mapping = load_config(yaml.safe_load(SEED_EXAMPLE))
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
    config = load_config(yaml.safe_load(SEED_EXAMPLE))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.store = "memory"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.providers["x"] = OpenAIProviderConfig()  # type: ignore[index]
    assert hash(config) == hash(load_config(yaml.safe_load(SEED_EXAMPLE)))


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
        "unknown top-level key",
        {"plugin": []},
        "plugin: unknown key (did you mean 'plugins'? allowed: plugins, store, providers, "
        "mcpServers, maxParallelToolCalls, persona, turnBudget, tools, agents, subagents, otel, "
        "compaction, limits, permissions, sandbox, fleet)",
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
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param(src, exp, id=name) for name, src, exp in REJECTIONS],
)
def test_document_rejection_rules(source: dict[str, Any], expected: str) -> None:
    before = copy.deepcopy(source)
    assert error_of(source) == f"<config>: {expected}"
    assert source == before


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
    """Regression (docs/design.md#validation): aliases were expanded by every walk of the loaded
    tree."""
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
    """Regression (docs/design.md#validation): any size was read and parsed."""
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
    """Regression (docs/design.md#validation): deep nesting raised RecursionError."""
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert error_of("c.yaml") == f"c.yaml: {expected}"
    (tmp_path / "settings.yaml").write_text(text.replace("store", "persona"), encoding="utf-8")
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_settings_file(tmp_path / "settings.yaml")


def test_deep_mappings_are_a_config_error_naming_the_path() -> None:
    """Regression (docs/design.md#validation): a deep mapping given directly raised
    RecursionError."""
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
    """Regression (docs/design.md#validation): ``open_runtime(config=...)`` raised
    RecursionError."""
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


# --- properties -------------------------------------------------------------------------------


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
