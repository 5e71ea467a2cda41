"""Deep-frozen JSON data: read-only mappings and tuples.

Event data is frozen once, when it is appended, so a message that entered one request is
reused by every later request without copying. ``FrozenDict`` subclasses ``dict`` so that
``json.dumps`` and C-level lookups stay fast; every mutating method raises. Freezing is
idempotent and cheap on data that is already frozen: a ``FrozenDict`` is trusted to be deep
frozen, because ``freeze`` is the only thing that builds one from mutable input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["FrozenDict", "freeze", "thaw"]


def _readonly(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError("event data is read-only")


class FrozenDict(dict[str, Any]):
    """A read-only ``dict``; keys also read as attributes (``msg.role``)."""

    __slots__ = ()

    __setitem__ = _readonly
    __delitem__ = _readonly
    __ior__ = _readonly
    clear = _readonly
    pop = _readonly
    popitem = _readonly
    setdefault = _readonly
    update = _readonly

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: object) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


_ATOMS = (str, int, float, bool, type(None))


def freeze(value: Any) -> Any:
    """Return a deep-frozen copy of JSON-compatible ``value`` (or ``value`` if already frozen).

    Mappings become ``FrozenDict`` (keys must be strings), lists and tuples become tuples.

    Raises:
        TypeError: ``value`` holds something that is not JSON-compatible.
    """
    cls = type(value)
    if cls is FrozenDict or cls in _ATOMS:
        return value
    if cls is tuple or cls is list:
        return tuple([freeze(v) for v in value])
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError(f"event data keys must be strings, not {type(k).__name__}")
            out[k] = freeze(v)
        return FrozenDict(out)
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, tuple | list):
        return tuple([freeze(v) for v in value])
    raise TypeError(f"event data must be JSON-compatible, not {cls.__name__}")


def thaw(value: Any) -> Any:
    """Return a plain mutable JSON copy (dicts and lists) of frozen ``value``."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value
