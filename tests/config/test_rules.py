"""Single-value config rules (``config/_rules.py``): each rule, ``kind_name`` and converters."""

from __future__ import annotations

import typing

import pytest

from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.config._rules import (
    Invalid,
    NonEmptyStr,
    NonNegativeNumber,
    PositiveInt,
    PositiveNumber,
    ProviderKind,
    Rule,
    StoreUrl,
    frozen_map,
    kind_name,
    to_tuple,
)


def rule_of(alias: object) -> Rule:
    (rule,) = [m for m in typing.get_args(alias)[1:] if isinstance(m, Rule)]
    return rule


@pytest.mark.parametrize(
    ("alias", "good", "bad", "problem"),
    [
        (PositiveInt, [1, 10**9], [0, -1], "must be a positive integer"),
        (PositiveNumber, [0.001, 5.0], [0.0, -1.0, float("inf"), float("nan")], "positive number"),
        (NonNegativeNumber, [0.0, 2.5], [-0.1, float("inf"), float("nan")], "non-negative"),
        (NonEmptyStr, ["x", " y "], ["", "   ", "\n"], "must be a non-empty string"),
    ],
)
def test_each_rule_accepts_good_values_and_names_the_problem_of_bad_ones(alias, good, bad, problem):
    rule = rule_of(alias)
    for value in good:
        assert rule.problem(value) is None
    for value in bad:
        assert problem in rule.problem(value)


@pytest.mark.parametrize(
    "url",
    ["memory", "memory:", "sqlite:///x.db", "jsonl:////abs", "postgresql://h/db", "postgres://h"],
)
def test_store_url_rule_accepts_each_supported_form(url):
    assert rule_of(StoreUrl).problem(url) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:///", "store URL 'sqlite:///' has no PATH"),
        ("jsonl:///", "has no PATH"),
        ("sqlite://x.db", "unsupported store URL 'sqlite://x.db'"),
        ("redis://h", "expected memory, sqlite:///PATH"),
        ("memory://", "unsupported"),
    ],
)
def test_store_url_rule_refuses_other_forms(url, problem):
    assert problem in rule_of(StoreUrl).problem(url)


def test_provider_kind_rule():
    rule = rule_of(ProviderKind)
    for kind in ("openai", "anthropic", "scripted"):
        assert rule.problem(kind) is None
    assert rule.problem("OpenAI") == (
        "unknown provider kind 'OpenAI' (expected openai, anthropic or scripted)"
    )


def test_each_rule_names_the_value_it_expects():
    assert rule_of(PositiveInt).expected == "a positive integer"
    assert rule_of(StoreUrl).expected == "a store URL string"
    assert typing.get_args(PositiveInt)[0] is int


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (3, "integer"),
        (1.5, "number"),
        ("s", "string"),
        ({}, "mapping"),
        (FrozenDict(), "mapping"),
        ([], "list"),
        ((), "list"),
        (b"x", "bytes"),
    ],
)
def test_kind_name_says_what_a_config_author_would(value, name):
    assert kind_name(value) == name


def test_invalid_carries_message_and_subpath():
    exc = Invalid("bad", ("agents", 0, "id"))
    assert isinstance(exc, ValueError)
    assert (exc.message, exc.subpath, str(exc)) == ("bad", ("agents", 0, "id"), "bad")
    assert Invalid("x").subpath == ()


def test_converters():
    assert to_tuple(["a", "b"]) == ("a", "b")
    assert to_tuple(iter(range(3))) == (0, 1, 2)
    frozen = FrozenDict(a=1)
    assert frozen_map(frozen) is frozen
    made = frozen_map({"a": 1})
    assert type(made) is FrozenDict
    assert made == {"a": 1}
