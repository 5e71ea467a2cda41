"""Deep-frozen JSON data (``_frozen.py``): ``FrozenDict``, ``freeze`` and ``thaw``."""

from __future__ import annotations

import copy
import enum
import gc
import json
import pickle
from collections import OrderedDict
from collections.abc import Mapping

import pytest

from dsh_agent_loop import _frozen
from dsh_agent_loop._frozen import (
    FrozenDict,
    freeze,
    from_shape,
    frozen,
    json_default,
    shape,
    thaw,
)


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


def test_repr_names_the_type_and_json_dumps_it_like_a_dict_through_json_default():
    d = FrozenDict(a=1)
    assert repr(d) == "FrozenDict({'a': 1})"
    value = freeze({"a": [1, None, "x", {"b": {}}]})
    assert json.dumps(value, default=json_default) == '{"a": [1, null, "x", {"b": {}}]}'
    assert json.dumps(thaw(value)) == json.dumps(value, default=json_default)
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        json.dumps({"s": {1}}, default=json_default)


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


def test_frozen_dicts_are_never_tracked_and_neither_are_plain_containers_of_them():
    d = freeze({"a": [1, {"b": "c"}], "d": {"e": None}})
    assert not gc.is_tracked(d)
    assert not gc.is_tracked(d["d"])
    assert not gc.is_tracked(FrozenDict(a=1))
    assert not gc.is_tracked(FrozenDict({"x": d}))
    holder = {"k": d, "j": FrozenDict()}
    assert not gc.is_tracked(holder)  # CPython tracks a dict only once it holds a tracked value
    items = (d, d["d"])
    lst = [d]
    gc.collect()  # the collector untracks tuples of untracked items
    assert not gc.is_tracked(items)
    assert not gc.is_tracked(d["a"])
    assert gc.is_tracked(lst)  # a list always is; that is why the log keeps tuples and structs


def test_a_frozen_dict_reads_like_a_read_only_dict():
    d = FrozenDict(a=1, b=FrozenDict(c=(1, 2)))
    assert isinstance(d, Mapping)
    assert not isinstance(d, dict)
    assert d["a"] == 1
    assert d.get("a") == 1
    assert d.get("zz") is None
    assert d.get("zz", 5) == 5
    assert "a" in d
    assert "zz" not in d
    assert len(d) == 2
    assert list(d) == ["a", "b"]
    assert list(reversed(d)) == ["b", "a"]
    assert list(d.keys()) == ["a", "b"]
    assert list(d.values()) == [1, {"c": (1, 2)}]
    assert list(d.items()) == [("a", 1), ("b", {"c": (1, 2)})]
    assert dict(d) == {"a": 1, "b": {"c": (1, 2)}}
    assert type(dict(d)) is dict
    assert {**d, "z": 0} == {"a": 1, "b": {"c": (1, 2)}, "z": 0}

    def kw(**kwargs: object) -> dict[str, object]:
        return kwargs

    assert kw(**d) == {"a": 1, "b": {"c": (1, 2)}}
    assert d.b.c == (1, 2)
    with pytest.raises(KeyError):
        d["zz"]
    copied = d.copy()
    assert type(copied) is dict
    copied["a"] = 2  # a plain mutable copy, as dict.copy() of a subclass was
    assert d["a"] == 1
    assert d | {"z": 0} == {"a": 1, "b": {"c": (1, 2)}, "z": 0}
    assert {"z": 0} | d == {"z": 0, "a": 1, "b": {"c": (1, 2)}}
    assert type(d | {"z": 0}) is dict


def test_frozen_dicts_compare_with_plain_dicts_and_other_mappings_both_ways():
    d = freeze({"a": [1, {"b": 2}]})
    assert d == {"a": (1, {"b": 2})}
    assert {"a": (1, {"b": 2})} == d  # noqa: SIM300  # dict.__eq__ first
    assert d != {"a": (1, {"b": 3})}
    assert {"a": (1, {"b": 3})} != d  # noqa: SIM300
    assert d == OrderedDict(a=(1, FrozenDict(b=2)))
    assert d != {"a": [1, {"b": 2}]}  # a list is not a tuple, as before
    assert d != [("a", 1)]
    assert (d == 3) is False
    assert FrozenDict() == {}
    assert hash(FrozenDict(x=1, y=(1, 2))) == hash(freeze({"x": 1, "y": [1, 2]}))


def test_the_constructor_takes_what_dict_takes_and_copies_its_input():
    source = {"a": 1}
    d = FrozenDict(source)
    source["a"] = 2  # the frozen dict does not follow its input
    assert d == {"a": 1}
    assert FrozenDict([("a", 1), ("b", 2)]) == {"a": 1, "b": 2}
    assert FrozenDict({"a": 1}, b=2) == {"a": 1, "b": 2}
    assert FrozenDict(OrderedDict(a=1)) == {"a": 1}
    assert FrozenDict() == {}
    assert FrozenDict(d) is d  # immutable: nothing to copy
    with pytest.raises(TypeError):
        FrozenDict(1)
    owned = {"k": "v"}
    made = frozen(owned)  # the hot-path constructor takes the fresh dict as it is
    assert type(made) is FrozenDict
    assert made == {"k": "v"}
    assert FrozenDict[str, int] is not FrozenDict  # subscriptable in annotations


def test_attributes_cannot_be_set_or_deleted():
    d = FrozenDict(a=1)
    with pytest.raises(AttributeError):
        d.a = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.new = 1  # type: ignore[attr-defined]
    with pytest.raises((AttributeError, TypeError)):
        del d.a
    with pytest.raises(TypeError, match="event data is read-only"):
        d |= {"b": 1}  # type: ignore[misc]
    assert d == {"a": 1}


def test_thaw_handles_nested_frozen_dicts_and_pickle_keeps_nested_types():
    d = freeze({"a": {"b": [{"c": 1}]}})
    thawed = thaw(d)
    assert type(thawed["a"]) is dict
    assert type(thawed["a"]["b"][0]) is dict
    back = pickle.loads(pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back["a"]["b"][0]) is FrozenDict
    assert not gc.is_tracked(back)


def test_mappings_with_the_same_keys_in_the_same_order_share_one_shape():
    a = freeze({"role": "user", "content": ["hi"]})
    b = FrozenDict(role="assistant", content=())
    assert a._k is b._k is shape(("role", "content"))
    assert a._v == ("user", ("hi",))
    swapped = FrozenDict(content=(), role="assistant")
    assert swapped._k is not b._k
    assert swapped == b  # order does not matter for equality, as with dicts
    assert list(swapped) == ["content", "role"]
    assert swapped != FrozenDict(content=(), role="user")
    assert FrozenDict(a=1) != FrozenDict(a=1, b=2)
    assert FrozenDict(a=1, b=2) != {"a": 1}


def test_from_shape_builds_from_a_shape_and_its_values_in_order():
    s = shape(("turn", "step"))
    d = from_shape(s, (1, 2))
    assert type(d) is FrozenDict
    assert d == {"turn": 1, "step": 2}
    assert d.get("step") == 2
    assert d.get("zz", 0) == 0
    assert json.dumps(d, default=json_default) == '{"turn": 1, "step": 2}'
    with pytest.raises(ValueError, match="distinct"):
        shape(("a", "a"))


def test_the_shape_table_is_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_frozen, "_SHAPES", {})
    monkeypatch.setattr(_frozen, "SHAPES_MAX", 2)
    kept = [freeze({f"k{i}": i}) for i in range(2)]
    assert len(_frozen._SHAPES) == 2
    past = [FrozenDict(zz=1), FrozenDict(zz=1)]
    assert past[0] == past[1] == {"zz": 1}
    assert past[0]._k is not past[1]._k  # made per mapping once the table is full
    assert len(_frozen._SHAPES) == 2
    assert kept[0] == {"k0": 0}


def test_a_subclass_reads_like_the_class():
    class Counted(FrozenDict):
        pass

    d = Counted({"a": 1}, b=2)
    assert type(d) is Counted
    assert d == {"a": 1, "b": 2}
    assert d._k is shape(("a", "b"))
    assert thaw(d) == {"a": 1, "b": 2}
    assert json.dumps(d, default=json_default) == '{"a": 1, "b": 2}'


def test_frozen_dict_is_final():
    # the marker ``typing.final`` leaves, so type checkers refuse a subclass in the package;
    # tests may still subclass it at run time (it counts reads with one)
    assert FrozenDict.__final__ is True
