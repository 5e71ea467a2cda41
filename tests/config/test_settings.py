"""Tests for dsh_agent_loop.config._settings: the live settings layers and the settings file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config import (
    LoopConfig,
    Settings,
    SettingsLayer,
    TurnBudget,
    converter,
    load_settings_file,
)

from .helpers import layers, pos_ints


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


@given(plugin=layers, user=layers, explicit=st.none() | pos_ints)
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
