"""Tests for dsh_agent_loop.config._agents: the plugin block, agent declarations, budgets."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsh_agent_loop.config import PLUGIN_NAME, AgentEntry, TurnBudget, load_config

from .helpers import P0, config_with, error_of


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
        "tools": ["read_file", "list_dir"],
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
        tools=("read_file", "list_dir"),
        turn_budget=TurnBudget(max_steps=1, max_tool_calls=2, max_total_tokens=3, max_seconds=4.0),
    )
    assert config.agents[1] == AgentEntry(id="b", resume_session_id="s-0", persona="be brief")


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
        "unknown agent key, with the closest known key",
        config_with({"id": "a", "maxToken": 5}),
        f"{P0}.agents[0].maxToken: unknown key (did you mean 'maxTokens'? allowed: id, "
        "provider, model, "
        "reasoningEffort, maxTokens, cwd, sessionId, resumeSessionId, persona, personaFile, "
        "tools, turnBudget, requireApproval, compaction, permissions, sandbox)",
    ),
    (
        "unknown turn budget key",
        config_with(turnBudget={"steps": 3}),
        f"{P0}.turnBudget.steps: unknown key (did you mean 'maxSteps'? allowed: maxSteps, "
        "maxToolCalls, "
        "maxTotalTokens, maxSeconds)",
    ),
    (
        "both spellings of one key in an agent",
        config_with({"id": "a", "maxTokens": 5, "max_tokens": 6}),
        f"{P0}.agents[0].max_tokens: same key as 'maxTokens': write one spelling of it",
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
        "duplicate agent ids",
        config_with({"id": "a"}, {"id": "b"}, {"id": "a"}),
        f"{P0}.agents[2].id: duplicate agent id 'a' (also agents[0])",
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
        "non-positive budget",
        config_with({"id": "a", "turnBudget": {"maxSeconds": 0}}),
        f"{P0}.agents[0].turnBudget.maxSeconds: must be a positive number",
    ),
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param(src, exp, id=name) for name, src, exp in REJECTIONS],
)
def test_agent_rejection_rules(source: dict[str, Any], expected: str) -> None:
    before = copy.deepcopy(source)
    assert error_of(source) == f"<config>: {expected}"
    assert source == before
