"""Config faults (``config/_faults.py``): key paths, file order and the one-line error."""

from __future__ import annotations

import pytest
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config._agents import AgentEntry, LoopConfig, TurnBudget
from dsh_agent_loop.config._faults import faults_of, raise_faults, render
from dsh_agent_loop.config._rules import Invalid


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ((), ""),
        (("plugins", 0, "config"), "plugins[0].config"),
        (("providers", "a.b", "kind"), "providers['a.b'].kind"),
        (("x", "@scope/name-1"), "x.@scope/name-1"),
        ((3,), "[3]"),
        (("has space",), "['has space']"),
    ],
)
def test_render_writes_paths_as_in_messages(path, text):
    assert render(path) == text


def test_raise_faults_does_nothing_without_faults():
    raise_faults([], {}, "f.yaml")


def test_raise_faults_joins_unique_faults_in_file_order():
    raw = {"store": "x", "providers": {"p": {"kind": "k", "timeout": 0}}}
    faults = [
        (("providers", "p", "timeout"), "must be positive"),
        (("store",), "unsupported"),
        (("providers", "p", "kind"), "unknown kind"),
        (("store",), "unsupported"),  # duplicate: reported once
    ]
    with pytest.raises(ConfigError) as info:
        raise_faults(faults, raw, "f.yaml")
    assert info.value.message == (
        "f.yaml: store: unsupported; "
        "f.yaml: providers.p.kind: unknown kind; "
        "f.yaml: providers.p.timeout: must be positive"
    )
    assert info.value.code == "CONFIG_INVALID"


def test_a_fault_without_a_path_or_at_an_absent_key_is_still_reported():
    with pytest.raises(ConfigError) as info:
        raise_faults([(("missing", 2), "late"), ((), "top")], {"a": [1]}, "<config>")
    assert info.value.message == "<config>: top; <config>: missing[2]: late"


def _at(exc: Exception, note: object) -> Exception:
    exc.__notes__ = [note]
    return exc


def test_faults_of_maps_attribute_names_to_file_keys_and_indexes():
    budget = ClassValidationError(
        "budget",
        [
            _at(
                Invalid("must be a positive integer"),
                AttributeValidationNote("n", "max_steps", int),
            )
        ],
        TurnBudget,
    )
    agents = IterableValidationError(
        "agents",
        [_at(KeyError("id"), IterableValidationNote("i", 1, AgentEntry))],
        tuple,
    )
    top = ClassValidationError(
        "loop",
        [
            _at(budget, AttributeValidationNote("b", "turn_budget", TurnBudget)),
            _at(agents, AttributeValidationNote("a", "agents", tuple)),
            ForbiddenExtraKeysError("extra", LoopConfig, {"bogus"}),
            ValueError("plain"),
            ValueError(""),
        ],
        LoopConfig,
    )
    faults = list(faults_of(top, ("plugins", 0, "config")))
    base = ("plugins", 0, "config")
    assert faults[0] == ((*base, "turnBudget", "maxSteps"), "must be a positive integer")
    assert faults[1] == ((*base, "agents", 1), "required key missing")
    path, message = faults[2]
    assert path == (*base, "bogus")
    assert message.startswith("unknown key (allowed: maxParallelToolCalls, persona, turnBudget")
    assert faults[3:] == [(base, "plain"), (base, "ValueError")]


def test_an_invalid_fault_extends_the_path_by_its_subpath():
    assert list(faults_of(Invalid("bad", ("a", 0)), ("root",))) == [(("root", "a", 0), "bad")]
