"""The built-in model table (``llm/_models.py``): lookups by name and family, and overrides."""

from __future__ import annotations

import pytest

from dsh_agent_loop.llm._models import (
    BUILTIN_MODELS,
    REASONING_REPLAY_MODES,
    ModelInfo,
    lookup_model,
    resolve_model,
)


@pytest.mark.parametrize(
    ("name", "window", "max_tokens", "effort", "replay"),
    [
        ("deepseek-chat", 128_000, 8_192, False, "never"),
        ("deepseek-reasoner", 128_000, 32_768, False, "never"),
        ("deepseek-v4-flash", 128_000, None, False, "tool-turns"),
        ("deepseek-coder", 128_000, None, False, "never"),
        ("gpt-4o-mini", 128_000, 16_384, False, "never"),
        ("gpt-4.1-mini", 1_047_576, 32_768, False, "never"),
        ("o3", 200_000, None, True, "never"),
        ("o4-mini-2025-04-16", 200_000, None, True, "never"),
        ("claude-sonnet-4-20250514", 200_000, 8_192, True, "never"),
        ("claude-3-opus-20240229", 200_000, 4_096, False, "never"),
        ("claude-3-7-sonnet-latest", 200_000, 8_192, True, "never"),
        ("claude-2.1", 200_000, 8_192, False, "never"),
    ],
)
def test_lookup_by_exact_name_or_family(name, window, max_tokens, effort, replay):
    info = lookup_model(name)
    assert info is not None
    assert info.context_window == window
    assert info.max_tokens == max_tokens
    assert info.reasoning_effort is effort
    assert info.reasoning_replay == replay


def test_provider_specific_details():
    assert lookup_model("deepseek-chat").system_prompt_update == "in-history"
    assert lookup_model("gpt-4o").system_prompt_update is None
    assert lookup_model("o3-mini").max_tokens_param == "max_completion_tokens"
    assert lookup_model("gpt-4o").max_tokens_param == "max_tokens"


@pytest.mark.parametrize("name", ["llama-3", "my-model", "", "Deepseek-chat", "xgpt-4o"])
def test_an_unknown_model_is_none_and_resolves_to_empty_defaults(name):
    assert lookup_model(name) is None
    info = resolve_model(name)
    assert info == ModelInfo()
    assert info.reasoning_replay == "never"
    assert info.context_window is None


def test_exact_names_come_before_their_family():
    patterns = [pattern for pattern, _ in BUILTIN_MODELS]
    assert patterns.index("deepseek-chat") < patterns.index("deepseek-*")
    assert patterns.index("deepseek-v4*") < patterns.index("deepseek-*")
    assert patterns.index("claude-sonnet-4*") < patterns.index("claude-*")
    assert patterns[-1] == "claude-*"
    for _, info in BUILTIN_MODELS:
        assert info.reasoning_replay in REASONING_REPLAY_MODES


def test_provider_wide_overrides_apply_to_every_model():
    info = resolve_model("gpt-4o", context_window=50_000, reasoning_replay="always")
    assert info.context_window == 50_000
    assert info.reasoning_replay == "always"
    assert info.max_tokens == 16_384  # the rest comes from the table
    unknown = resolve_model("local", context_window=8_000)
    assert unknown == ModelInfo(context_window=8_000)


def test_a_per_model_override_wins_over_provider_wide_settings():
    info = resolve_model(
        "deepseek-chat",
        models={
            "deepseek-chat": {
                "context_window": "64000",
                "max_tokens": 1_000,
                "reasoning_replay": "tool-turns",
            }
        },
        context_window=100_000,
        reasoning_replay="always",
    )
    assert info.context_window == 64_000
    assert info.max_tokens == 1_000
    assert info.reasoning_replay == "tool-turns"
    assert info.system_prompt_update == "in-history"


def test_reasoning_effort_override_as_a_bool_or_a_default_effort():
    off = resolve_model("o3", models={"o3": {"reasoning_effort": False}})
    assert off.reasoning_effort is False
    assert off.default_effort is None
    high = resolve_model("gpt-4o", models={"gpt-4o": {"reasoning_effort": "high"}})
    assert high.reasoning_effort is True
    assert high.default_effort == "high"


def test_overrides_for_other_models_or_none_values_change_nothing():
    table = lookup_model("gpt-4o")
    assert resolve_model("gpt-4o", models={"o3": {"context_window": 1}}) == table
    assert resolve_model("gpt-4o", models={"gpt-4o": {}}) == table
    nones = {"context_window": None, "max_tokens": None, "reasoning_replay": None}
    assert resolve_model("gpt-4o", models={"gpt-4o": nones}) == table


def test_model_info_is_frozen():
    with pytest.raises(AttributeError):
        ModelInfo().context_window = 3  # type: ignore[misc]
