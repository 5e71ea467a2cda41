"""``AgentOptions`` and ``TurnBudget`` (``_agent/options.py``): defaults and ``validate``."""

from __future__ import annotations

import attrs
import pytest

from dsh_agent_loop._agent.options import AgentOptions, TurnBudget
from dsh_agent_loop._errors import InvalidOptionError


def test_defaults_leave_everything_to_the_config():
    options = AgentOptions("a1")
    assert options.id == "a1"
    assert (options.provider, options.model, options.max_tokens) == (None, None, None)
    assert options.tools is None
    assert options.turn_budget is None
    options.validate()
    assert TurnBudget() == TurnBudget(None, None, None, None)


def test_tools_become_a_tuple():
    assert AgentOptions("a", tools=["read", "write"]).tools == ("read", "write")
    assert AgentOptions("a", tools=[]).tools == ()


def test_options_are_frozen_and_compare_by_value():
    assert AgentOptions("a", model="m") == AgentOptions("a", model="m")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        AgentOptions("a").id = "b"  # type: ignore[misc]


@pytest.mark.parametrize(
    "options",
    [
        AgentOptions("a", max_tokens=1),
        AgentOptions("a", reasoning_effort="high"),
        AgentOptions(
            "a", turn_budget=TurnBudget(max_steps=1, max_tool_calls=1, max_total_tokens=1)
        ),
        AgentOptions("a", turn_budget=TurnBudget(max_seconds=0.5)),
    ],
)
def test_valid_options_pass(options):
    options.validate()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (AgentOptions(""), "agent id must be a non-empty string"),
        (AgentOptions("a", max_tokens=0), "max_tokens must be a positive integer, got 0"),
        (AgentOptions("a", max_tokens=-5), "got -5"),
        (AgentOptions("a", max_tokens=True), "got True"),
        (AgentOptions("a", max_tokens=1.5), "got 1.5"),
        (AgentOptions("a", max_tokens="10"), "got '10'"),
        (AgentOptions("a", reasoning_effort=""), "reasoning_effort must be non-empty"),
        (AgentOptions("a", turn_budget=TurnBudget(max_steps=0)), "turn_budget.max_steps"),
        (
            AgentOptions("a", turn_budget=TurnBudget(max_tool_calls=-1)),
            "turn_budget.max_tool_calls must be positive, got -1",
        ),
        (
            AgentOptions("a", turn_budget=TurnBudget(max_total_tokens=0)),
            "turn_budget.max_total_tokens",
        ),
        (AgentOptions("a", turn_budget=TurnBudget(max_seconds=0.0)), "turn_budget.max_seconds"),
    ],
)
def test_invalid_options_raise_invalid_option(options, message):
    with pytest.raises(InvalidOptionError, match=message) as info:
        options.validate()
    assert info.value.code == "INVALID_OPTION"
