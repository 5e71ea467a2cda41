"""Untrusted schemas (sans-I/O): what is refused, and checks that stay correct and bounded."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_agent_loop._tools.base import ArgumentsError
from dsh_agent_loop.mcp._schema import (
    MAX_CHECK_STEPS,
    MAX_SCHEMA_DEPTH,
    SchemaRefused,
    untrusted_validator,
)


def props(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def refusal(schema: Any) -> str:
    with pytest.raises(SchemaRefused) as caught:
        untrusted_validator(schema)
    return str(caught.value)


def problem(schema: Any, arguments: Any) -> str:
    with pytest.raises(ArgumentsError) as caught:
        untrusted_validator(schema)(arguments)
    return str(caught.value)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (props(x={"$ref": "https://example.com/s.json"}), "is not a local reference"),
        (props(x={"$ref": "other.json#/a"}), "'other.json#/a' is not a local reference"),
        (props(x={"$dynamicRef": "http://h/x"}), "$dynamicRef 'http://h/x' is not a local"),
        (props(x={"$ref": "#/$defs/missing"}), "does not point to a schema"),
        (props(x={"$ref": "#nowhere"}), "'#nowhere' does not point to a schema"),
        (props(x={"$id": "http://h/", "$ref": "#/a"}), "a nested $id ('http://h/')"),
        (
            props(x={"$schema": "http://json-schema.org/draft-07/schema#"}),
            "a nested $schema is not allowed",
        ),
        ({"$schema": "http://h/dialect"}, "is not a dialect known here"),
        (props(x={"pattern": "(?<=a)b"}), "not one a linear-time engine (RE2) can run"),
        (props(x={"pattern": r"(a)\1"}), "lookaround and backreferences are not supported"),
        ({"type": "object", "patternProperties": {"(?=x)": {}}}, "linear-time engine (RE2)"),
        (
            {"patternProperties": {"a": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties together with patternProperties",
        ),
        (props(n={"type": "nope"}), "/properties/n/type: 'nope' is not valid"),
        ({"type": "object", "required": "x"}, "/required: 'x' is not of type 'array'"),
        ([], "it is not a JSON object"),
        ({"enum": ["x" * 300_000]}, "bytes of JSON, more than 262,144"),
    ],
)
def test_a_schema_that_breaks_a_rule_is_refused_saying_which(schema: Any, says: str) -> None:
    assert says in refusal(schema)


def test_a_deep_schema_is_refused() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        schema = {"not": schema}
    assert f"nested deeper than {MAX_SCHEMA_DEPTH} levels" in refusal(schema)


def test_references_that_fan_out_are_refused_before_any_check() -> None:
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 4} for i in range(12)}
    defs["d12"] = {"type": "string"}
    assert "more than 10,000 subschemas" in refusal({"$defs": defs, "$ref": "#/$defs/d0"})


def test_local_references_anchors_and_recursion_work() -> None:
    tree = {
        "$defs": {
            "node": {
                "$anchor": "node",
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#node"}},
                },
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    check = untrusted_validator(tree)
    check({"value": 1, "children": [{"value": 2, "children": []}]})
    with pytest.raises(ArgumentsError, match=r"children/0/value: 'two' is not of type"):
        check({"value": 1, "children": [{"value": "two"}]})


def test_a_root_id_and_a_ref_to_the_root_keep_the_safe_checker() -> None:
    # A reference to the root, which names its dialect, must not bring back a stock validator
    # (which would run the pattern with `re`).
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/root.json",
        "type": "object",
        "properties": {"again": {"$ref": "#"}, "x": {"type": "string", "pattern": "(a+)+$"}},
    }
    assert "does not match" in problem(schema, {"again": {"x": "a" * 5_000 + "!"}})


def test_regexes_run_with_re2_everywhere() -> None:
    evil = "(a+)+$"
    long = "a" * 100_000 + "!"
    assert "does not match" in problem(props(x={"pattern": evil}), {"x": long})
    pattern_props = {"type": "object", "patternProperties": {evil: {"type": "integer"}}}
    untrusted_validator(pattern_props)({long: "not checked: the key does not match"})
    closed = {**pattern_props, "additionalProperties": False}
    assert "additional properties are not allowed" in problem(closed, {long: 1})
    names = {"type": "object", "propertyNames": {"pattern": evil}}
    assert "does not match" in problem(names, {long: 1})


def test_formats_are_not_asserted() -> None:
    untrusted_validator(props(x={"format": "email"}))({"x": "not an email"})


def test_enum_and_unique_items_keep_json_equality() -> None:
    enum = props(x={"enum": [1, "a", {"k": [1, 2]}, None]})
    check = untrusted_validator(enum)
    for value in (1, 1.0, "a", {"k": [1, 2]}, None):
        check({"x": value})
    for value in (True, "b", {"k": [2, 1]}, 2):
        with pytest.raises(ArgumentsError, match="is not one of"):
            check({"x": value})
    unique = untrusted_validator(props(x={"type": "array", "uniqueItems": True}))
    unique({"x": [1, True, "1", [1], {"a": 1}, {"a": True}]})
    for repeated in ([1, 1.0], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[1], [1]]):
        with pytest.raises(ArgumentsError, match="non-unique"):
            unique({"x": repeated})


def test_draft_07_schemas_keep_their_meaning() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"s": {"type": "string"}},
        "type": "object",
        "properties": {"pair": {"type": "array", "items": [{"$ref": "#/definitions/s"}]}},
    }
    assert "pair/0: 1 is not of type 'string'" in problem(schema, {"pair": [1, 2]})


def test_a_check_that_would_cost_too_much_stops_with_an_error() -> None:
    # Three ways back to the same node for each level of the arguments: 3**30 paths.
    node = {
        "type": "object",
        "required": ["x"],
        "properties": {"x": {"anyOf": [{"$ref": "#/$defs/t"}] * 3}},
    }
    schema = {"$defs": {"t": node}, "$ref": "#/$defs/t"}
    arguments: dict[str, Any] = {}
    for _ in range(30):
        arguments = {"x": arguments}
    assert f"more than {MAX_CHECK_STEPS:,} steps" in problem(schema, arguments)


def test_a_failure_quoting_a_large_value_is_paid_for() -> None:
    branches = [{"type": "string", "minLength": i} for i in range(1_000)]
    assert "more than" in problem({"anyOf": branches}, {"x": ["y" * 1_000] * 1_000})


def test_ordinary_arguments_pass_and_fail_as_usual() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "tag": {"type": "string"}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
    }
    check = untrusted_validator(schema)
    check({"items": [{"id": i, "tag": "t"} for i in range(500)]})
    with pytest.raises(ArgumentsError, match="'items' is a required property"):
        check({})
    with pytest.raises(ArgumentsError, match=r"additional properties are not allowed \('extra'\)"):
        check({"items": [{"id": 1, "extra": 2}]})
