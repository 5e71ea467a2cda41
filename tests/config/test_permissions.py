"""``permissions:`` in a config: every rule must parse, and a fault names its key path."""

from __future__ import annotations

import pytest

from .helpers import P0, config_with, error_of


@pytest.mark.parametrize(
    ("rules", "where", "problem"),
    [
        (
            {"allow": ["run_command("]},
            "permissions.allow[0]",
            "a rule with a pattern ends with ')'",
        ),
        ({"ask": ["read_file", "fetch(x)"]}, "permissions.ask[1]", "KEY=GLOB"),
        ({"deny": ["*(x)"]}, "permissions.deny[0]", "'*' names every tool"),
        ({"deny": [5]}, "permissions.deny[0]", "must be a permission rule string, got integer"),
    ],
)
def test_a_rule_that_does_not_parse_names_its_key_path(
    rules: dict[str, object], where: str, problem: str
) -> None:
    message = error_of(config_with(permissions=rules))
    assert f"{P0}.{where}: " in message
    assert problem in message


def test_agent_and_sub_agent_rules_are_checked_too() -> None:
    agent = {"id": "a", "provider": "ds", "permissions": {"allow": ["write_file()"]}}
    sub = {"id": "s", "permissions": {"deny": ["bad name(x)"]}}
    message = error_of(config_with(agent, subagents=[sub]))
    assert (
        f"{P0}.agents[0].permissions.allow[0]: 'write_file()' is not a permission rule" in message
    )
    assert f"{P0}.subagents[0].permissions.deny[0]: 'bad name(x)' is not a permission rule" in (
        message
    )
