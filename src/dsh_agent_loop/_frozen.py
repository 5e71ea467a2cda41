"""Deep-frozen JSON data: read-only mappings and tuples the garbage collector never walks.

Event data is frozen once, when it is appended, so a message that entered one request is
reused by every later request without copying. A process may hold millions of such values
(thousands of agents, dozens of events each), and CPython's cyclic collector walks every
tracked object on each collection of the old generation; it never untracks a ``dict``
subclass. So ``FrozenDict`` is not a ``dict``: it is a ``msgspec.Struct`` declared
``gc=False`` (never tracked) around one plain ``dict``. A plain ``dict`` or ``tuple`` holding
only atoms and ``FrozenDict``s is then untracked too (CPython untracks those itself), so
frozen JSON costs the collector nothing.

The price of ``gc=False`` is that a ``FrozenDict`` must never be part of a reference cycle
(the collector could not break one through it). Frozen JSON cannot form one; ``FrozenDict``
built directly around other objects (a hook payload holding an agent) must not be stored
anywhere that object can reach.

``FrozenDict`` reads like a read-only ``dict``: ``d[k]``, ``get``, ``keys``/``values``/
``items``, ``len``, ``in``, iteration, ``==`` with plain dicts, hashing, ``dict(d)``, ``**d``,
``isinstance(d, Mapping)``, keys as attributes (``msg.role``), ``copy``/``pickle``. Every
mutating method raises. ``json.dumps`` needs ``default=json_default`` (or ``thaw`` first).
Freezing is idempotent and cheap on data that is already frozen: a ``FrozenDict`` is trusted to
be deep frozen, because ``freeze`` is the only thing that builds one from mutable input.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from types import GenericAlias
from typing import TYPE_CHECKING, Any, Final, NoReturn

from msgspec import Struct, StructMeta

__all__ = ["FrozenDict", "freeze", "frozen", "json_default", "thaw"]


def _readonly(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError("event data is read-only")


class _FrozenDictMeta(StructMeta):
    """``FrozenDict(...)`` takes what ``dict(...)`` takes (a mapping, pairs, keywords)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not FrozenDict:  # a subclass (tests count reads with one)
            return StructMeta.__call__(cls, dict(*args, **kwargs))
        if not args:
            return _new(kwargs)  # a fresh dict made for this call
        if kwargs or len(args) > 1:
            return _new(dict(*args, **kwargs))
        arg = args[0]
        if type(arg) is dict:
            return _new(arg.copy())
        if type(arg) is FrozenDict:
            return arg  # immutable: a copy would be equal in every way
        return _new(dict(arg))


if TYPE_CHECKING:
    # What type checkers see: a read-only ``Mapping`` (a Struct cannot inherit ``Mapping``;
    # the class below is registered as one instead).

    class FrozenDict(Mapping[str, Any]):
        """A read-only mapping that is not GC-tracked (the runtime class is below)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def __getitem__(self, key: str) -> Any: ...
        def __len__(self) -> int: ...
        def __iter__(self) -> Iterator[str]: ...
        def __getattr__(self, name: str) -> Any: ...
        def __hash__(self) -> int: ...
        def copy(self) -> dict[str, Any]: ...
        def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]: ...
        def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]: ...
        @property
        def _d(self) -> dict[str, Any]: ...

else:

    class FrozenDict(Struct, frozen=True, gc=False, metaclass=_FrozenDictMeta):  # type: ignore[misc]
        """A read-only mapping that is not GC-tracked; keys also read as attributes (``msg.role``).

        ``FrozenDict(mapping_or_pairs, **keys)`` copies its arguments shallowly, like ``dict``;
        use ``freeze`` to deep-freeze mutable JSON.
        """

        _d: dict[str, Any]

        def __getitem__(self, key: str) -> Any:
            return self._d[key]

        def get(self, key: str, default: Any = None) -> Any:
            """The value of ``key``, or ``default``."""
            return self._d.get(key, default)

        def __len__(self) -> int:
            return len(self._d)

        def __iter__(self) -> Iterator[str]:
            return iter(self._d)

        def __reversed__(self) -> Iterator[str]:
            return reversed(self._d)

        def __contains__(self, key: object) -> bool:
            return key in self._d

        def keys(self) -> KeysView[str]:
            """The keys (a read-only view)."""
            return self._d.keys()

        def values(self) -> ValuesView[Any]:
            """The values (a read-only view)."""
            return self._d.values()

        def items(self) -> ItemsView[str, Any]:
            """The ``(key, value)`` pairs (a read-only view)."""
            return self._d.items()

        def copy(self) -> dict[str, Any]:
            """A shallow mutable copy (a plain ``dict``), as ``dict.copy`` of a subclass gives."""
            return self._d.copy()

        def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
            if not isinstance(other, Mapping):
                return NotImplemented
            return {**self._d, **other}

        def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]:
            if not isinstance(other, Mapping):
                return NotImplemented
            return {**other, **self._d}

        def __eq__(self, other: object) -> bool:
            if type(other) is FrozenDict:
                return self._d == other._d
            if type(other) is dict:
                return self._d == other
            if isinstance(other, Mapping):
                return self._d == dict(other.items())
            return NotImplemented

        def __ne__(self, other: object) -> bool:
            equal = self.__eq__(other)
            return equal if equal is NotImplemented else not equal

        def __hash__(self) -> int:
            return hash(tuple(self._d.items()))

        def __getattr__(self, name: str) -> Any:
            try:
                return self._d[name]
            except KeyError:
                raise AttributeError(name) from None

        def __repr__(self) -> str:
            return f"FrozenDict({self._d!r})"

        def __copy__(self) -> FrozenDict:
            return self

        def __deepcopy__(self, memo: object) -> FrozenDict:
            return self

        def __reduce__(self) -> tuple[Any, ...]:
            return (FrozenDict, (self._d,))

        def __class_getitem__(cls, params: Any) -> GenericAlias:
            return GenericAlias(cls, params)

        __setitem__ = _readonly
        __delitem__ = _readonly
        __ior__ = _readonly
        clear = _readonly
        pop = _readonly
        popitem = _readonly
        setdefault = _readonly
        update = _readonly


Mapping.register(FrozenDict)

frozen: Final[Callable[[dict[str, Any]], FrozenDict]] = StructMeta.__call__.__get__(FrozenDict)
"""``frozen(d)``: a ``FrozenDict`` owning ``d`` (no copy), in one C call. For hot paths:
``d`` must be a fresh ``dict`` that nothing else holds, with frozen values only
(``FrozenDict(k=v)`` copies and goes through a Python-level metaclass call)."""
_new: Final = frozen

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
        return _new(out)
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


def json_default(value: Any) -> Any:
    """``default=`` for ``json.dumps``: a ``FrozenDict`` encodes as the object it holds.

    Raises:
        TypeError: ``value`` is something else JSON cannot hold (what ``json`` raises too).
    """
    if type(value) is FrozenDict:
        return value._d
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
