"""Deep-frozen JSON data (``_frozen.py``): ``FrozenDict``, ``freeze`` and ``thaw``."""

from __future__ import annotations

import copy
import enum
import json
import pickle
from collections import OrderedDict

import pytest

from dsh_agent_loop._frozen import FrozenDict, freeze, thaw


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("a", 2),
        lambda d: d.__delitem__("a"),
        lambda d: d.__ior__({"b": 1}),
        lambda d: d.clear(),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("b", 1),
        lambda d: d.update(b=1),
    ],
)
def test_every_mutating_method_raises_and_leaves_the_dict_unchanged(mutate):
    d = FrozenDict(a=1)
    with pytest.raises(TypeError, match="event data is read-only"):
        mutate(d)
    assert d == {"a": 1}


def test_keys_read_as_attributes_and_missing_ones_are_attribute_errors():
    d = FrozenDict(role="user", content="hi")
    assert d.role == "user"
    assert d.content == "hi"
    with pytest.raises(AttributeError, match="missing"):
        d.missing  # noqa: B018
    assert getattr(d, "missing", "default") == "default"


def test_equal_frozen_dicts_hash_equal_and_compare_equal_to_plain_dicts():
    a = FrozenDict(x=1, y=(1, 2))
    b = FrozenDict(x=1, y=(1, 2))
    assert a == b == {"x": 1, "y": (1, 2)}
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != FrozenDict(x=2, y=(1, 2))
    with pytest.raises(TypeError):  # a nested mutable value is unhashable
        hash(FrozenDict(x=[1]))


def test_copies_are_the_same_object_and_pickling_round_trips():
    d = freeze({"a": [1, {"b": 2}]})
    assert copy.copy(d) is d
    assert copy.deepcopy(d) is d
    back = pickle.loads(pickle.dumps(d))
    assert type(back) is FrozenDict
    assert back == d
    assert type(back["a"][1]) is FrozenDict


def test_repr_names_the_type_and_json_dumps_it_like_a_dict():
    d = FrozenDict(a=1)
    assert repr(d) == "FrozenDict({'a': 1})"
    assert json.dumps(freeze({"a": [1, None, "x"]})) == '{"a": [1, null, "x"]}'


def test_freeze_makes_mappings_frozen_dicts_and_sequences_tuples_deeply():
    value = {"a": [1, {"b": [True, None, 1.5]}], "c": OrderedDict(d="e")}
    frozen = freeze(value)
    assert type(frozen) is FrozenDict
    assert type(frozen["a"]) is tuple
    assert type(frozen["a"][1]) is FrozenDict
    assert frozen["a"][1]["b"] == (True, None, 1.5)
    assert type(frozen["c"]) is FrozenDict
    value["a"].append("later")  # the frozen copy does not follow the input
    assert len(frozen["a"]) == 2


def test_freeze_returns_atoms_and_frozen_dicts_unchanged():
    d = FrozenDict(a=1)
    assert freeze(d) is d
    for atom in ("s", 1, 1.5, True, None):
        assert freeze(atom) is atom


def test_freeze_keeps_subclasses_of_atoms():
    class Colour(enum.StrEnum):
        RED = "red"

    assert freeze({"c": Colour.RED})["c"] is Colour.RED


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1: "x"}, "keys must be strings, not int"),
        ({"a": {b"k": 1}}, "keys must be strings, not bytes"),
        ({"a": {1, 2}}, "JSON-compatible, not set"),
        ([b"bytes"], "JSON-compatible, not bytes"),
        (object(), "JSON-compatible, not object"),
    ],
)
def test_freeze_refuses_what_json_cannot_hold(value, message):
    with pytest.raises(TypeError, match=message):
        freeze(value)


def test_thaw_returns_plain_mutable_data_and_round_trips_freeze():
    value = {"a": [1, {"b": [True, None]}], "c": "d"}
    thawed = thaw(freeze(value))
    assert thawed == value
    assert type(thawed) is dict
    assert type(thawed["a"]) is list
    assert type(thawed["a"][1]) is dict
    thawed["a"].append(2)  # mutable again
    assert freeze(thaw(freeze(value))) == freeze(value)
    assert thaw("atom") == "atom"
