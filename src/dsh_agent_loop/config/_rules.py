"""Single-value rules of the config records, and the fault a strict hook raises.

A rule rides on a field's type through ``Annotated`` (``PositiveInt`` is an ``int`` that must be
at least 1), so the converter checks it while structuring and the records stay plain data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final, Literal, TypeAlias, final

import attrs

from .._frozen import FrozenDict
from .._permission_rules import rule_problem
from .._store_url import StoreUrlError, parse_store_url

KeyPath: TypeAlias = tuple[str | int, ...]
"""A key path as written in the file: mapping keys and list indexes."""
Fault: TypeAlias = tuple[KeyPath, str]
"""One validation fault: where, and what is wrong."""

PROVIDER_KINDS: Final = ("openai", "anthropic", "scripted")


@final
class Invalid(ValueError):
    """A fault found by a hook: ``message`` at ``subpath`` below the value being structured."""

    def __init__(self, message: str, subpath: KeyPath = ()) -> None:
        super().__init__(message)
        self.message = message
        self.subpath = subpath


@final
@attrs.frozen
class Rule:
    """A single-value rule attached with ``Annotated``: its base type, then ``problem(value)``."""

    expected: str
    problem: Callable[[Any], str | None]


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else "must be a positive integer"


def _positive_number(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a positive number"


def _non_negative_number(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else "must be a non-negative number"


def _ratio(value: float) -> str | None:
    return None if math.isfinite(value) and 0 < value <= 1 else "must be a number in (0, 1]"


def _non_negative_int(value: int) -> str | None:
    return None if value >= 0 else "must be a non-negative integer"


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must be a non-empty string"


_STORE_HINT = "expected memory, sqlite:///PATH, jsonl:///PATH or postgresql://..."


def _store_url_problem(url: str) -> str | None:
    if url not in ("memory", "memory:") and not url.startswith(("postgresql://", "postgres://")):
        scheme = next((s for s in ("sqlite", "jsonl") if url.startswith(f"{s}:///")), None)
        if scheme is None:
            return f"unsupported store URL {url!r} ({_STORE_HINT})"
        if not url[len(scheme) + 4 :].partition("?")[0]:
            return f"store URL {url!r} has no PATH"
    try:  # the options in the query string: known keys, good values
        parse_store_url(url)
    except StoreUrlError as exc:
        return str(exc)
    return None


def _provider_kind_problem(kind: str) -> str | None:
    if kind in PROVIDER_KINDS:
        return None
    return f"unknown provider kind {kind!r} (expected openai, anthropic or scripted)"


PositiveInt: TypeAlias = Annotated[int, Rule("a positive integer", _at_least_one)]
PositiveNumber: TypeAlias = Annotated[float, Rule("a positive number", _positive_number)]
NonNegativeNumber: TypeAlias = Annotated[float, Rule("a non-negative number", _non_negative_number)]
NonEmptyStr: TypeAlias = Annotated[str, Rule("a non-empty string", _non_empty)]
Ratio: TypeAlias = Annotated[float, Rule("a number in (0, 1]", _ratio)]
NonNegativeInt: TypeAlias = Annotated[int, Rule("a non-negative integer", _non_negative_int)]
StoreUrl: TypeAlias = Annotated[str, Rule("a store URL string", _store_url_problem)]
ProviderKind: TypeAlias = Annotated[
    Literal["openai", "anthropic", "scripted"], Rule("a string", _provider_kind_problem)
]
PermissionRule: TypeAlias = Annotated[str, Rule("a permission rule string", rule_problem)]
"""``NAME``, ``*`` or ``NAME(PATTERN)``: an item of ``permissions.allow``, ``ask`` or ``deny``."""
ReasoningReplay: TypeAlias = Literal["never", "tool-turns", "always"]
"""The ``reasoning_replay`` policy of an openai provider or model
(docs/design.md#reasoning-replay)."""


def kind_name(value: Any) -> str:
    """Name of a raw value's type as a config author would say it."""
    if value is None:
        return "null"
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, cls):
            return name
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def to_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    """Any iterable as a tuple (an attrs field converter)."""
    return tuple(value)


def frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """A mapping as a ``FrozenDict``, kept when it is one (an attrs field converter)."""
    return value if type(value) is FrozenDict else FrozenDict(value)
