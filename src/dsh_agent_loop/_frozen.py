"""Deep-frozen JSON data: read-only mappings and tuples the garbage collector never walks.

Event data is frozen once, when it is appended, so a message that entered one request is
reused by every later request without copying. A process may hold millions of such values
(thousands of agents, dozens of events each), and CPython's cyclic collector walks every
tracked object on each collection of the old generation; it never untracks a ``dict``
subclass. So ``FrozenDict`` is not a ``dict``: it is a ``msgspec.Struct`` declared
``gc=False`` (never tracked) holding a shared ``Shape`` (its keys, each mapped to an index) and
a tuple of values. A plain ``dict`` or ``tuple`` holding only atoms and ``FrozenDict``s is
then untracked too (CPython untracks those itself), so frozen JSON costs the collector nothing.

Memory: a ``dict`` costs at least 184 bytes however few its keys, and an agent's log holds
dozens of small mappings of a handful of recurring shapes (``{turn, step, message}``,
``{role, content}``...). A ``FrozenDict`` is 32 bytes plus a tuple of 40 + 8 per value, and the
shape is shared by every mapping with the same keys (an intern table bounded by
``SHAPES_MAX``), like CPython's split-table dicts: about half the bytes.

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
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

from msgspec import Struct, StructMeta

__all__ = ["FrozenDict", "Shape", "freeze", "from_shape", "frozen", "json_default", "shape", "thaw"]


def _readonly(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError("event data is read-only")


class _FrozenDictMeta(StructMeta):
    """``FrozenDict(...)`` takes what ``dict(...)`` takes (a mapping, pairs, keywords)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not FrozenDict:  # a subclass (tests count reads with one)
            d = dict(*args, **kwargs)
            return StructMeta.__call__(cls, shape(tuple(d)), tuple(d.values()))
        if not args:
            return frozen(kwargs)  # a fresh dict made for this call
        if kwargs or len(args) > 1:
            return frozen(dict(*args, **kwargs))
        arg = args[0]
        if type(arg) is dict:
            return frozen(arg)  # read, not kept: nothing to copy
        if type(arg) is FrozenDict:
            return arg  # immutable: a copy would be equal in every way
        return frozen(dict(arg))


Shape = dict[str, int]
"""The keys of a ``FrozenDict`` in order, each mapped to its index in the values tuple.

Shared by every ``FrozenDict`` with the same keys in the same order (see ``shape``), as CPython
shares the keys of split-table dicts, and never changed once made."""

#: Distinct key tuples whose shapes are shared; past this, new shapes are made per mapping.
SHAPES_MAX: Final = 8192
_SHAPES: Final[dict[tuple[str, ...], Shape]] = {}


def shape(keys: tuple[str, ...]) -> Shape:
    """The shared ``Shape`` of ``keys`` (a new unshared one once ``SHAPES_MAX`` are kept).

    A process-wide intern table, like ``sys.intern``: a shape holds only key strings, and the
    table is bounded, so it cannot grow with the number of agents or events.
    """
    found = _SHAPES.get(keys)
    if found is None:
        found = {k: i for i, k in enumerate(keys)}
        if len(found) != len(keys):
            raise ValueError("a shape's keys must be distinct")
        if len(_SHAPES) < SHAPES_MAX:
            _SHAPES[keys] = found
    return found


if TYPE_CHECKING:
    # What type checkers see: a read-only ``Mapping`` (a Struct cannot inherit ``Mapping``;
    # the class below is registered as one instead).

    @final
    class FrozenDict(Mapping[str, Any]):
        """A read-only mapping that is not GC-tracked (the runtime class is below)."""

        _k: Shape
        _v: tuple[Any, ...]

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

    @final
    class FrozenDict(Struct, frozen=True, gc=False, metaclass=_FrozenDictMeta):  # type: ignore[misc]
        """A read-only mapping that is not GC-tracked; keys also read as attributes (``msg.role``).

        ``FrozenDict(mapping_or_pairs, **keys)`` copies its arguments shallowly, like ``dict``;
        use ``freeze`` to deep-freeze mutable JSON.

        Stored compactly: a shared ``Shape`` (key to index) and a tuple of values, about half
        the bytes of a ``dict`` (which costs at least 184 bytes however few its keys).

        Final: code is trusted with a ``FrozenDict`` because it is frozen JSON, which a subclass
        need not be (type checkers refuse one; tests subclass it only to count reads).
        """

        _k: Shape
        _v: tuple[Any, ...]

        def __getitem__(self, key: str) -> Any:
            return self._v[self._k[key]]

        def get(self, key: str, default: Any = None) -> Any:
            """The value of ``key``, or ``default``."""
            i = self._k.get(key)
            return default if i is None else self._v[i]

        @property
        def _d(self) -> dict[str, Any]:
            """A new plain ``dict`` of the same items (shallow)."""
            return dict(zip(self._k, self._v, strict=True))

        def __len__(self) -> int:
            return len(self._v)

        def __iter__(self) -> Iterator[str]:
            return iter(self._k)

        def __reversed__(self) -> Iterator[str]:
            return reversed(self._k)

        def __contains__(self, key: object) -> bool:
            return key in self._k

        def keys(self) -> KeysView[str]:
            """The keys (a read-only view)."""
            return self._k.keys()

        def values(self) -> ValuesView[Any]:
            """The values (a read-only view)."""
            return self._d.values()

        def items(self) -> ItemsView[str, Any]:
            """The ``(key, value)`` pairs (a read-only view)."""
            return self._d.items()

        def copy(self) -> dict[str, Any]:
            """A shallow mutable copy (a plain ``dict``), as ``dict.copy`` of a subclass gives."""
            return dict(zip(self._k, self._v, strict=True))

        def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
            if not isinstance(other, Mapping):
                return NotImplemented
            return {**self._d, **other}

        def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]:
            if not isinstance(other, Mapping):
                return NotImplemented
            return {**other, **self._d}

        def __eq__(self, other: object) -> bool:
            if isinstance(other, FrozenDict):
                if self._k is other._k:
                    return self._v == other._v
                return len(self._v) == len(other._v) and self._d == other._d
            if type(other) is dict:
                return len(self._v) == len(other) and self._d == other
            if isinstance(other, Mapping):
                return self._d == dict(other.items())
            return NotImplemented

        def __ne__(self, other: object) -> bool:
            equal = self.__eq__(other)
            return equal if equal is NotImplemented else not equal

        def __hash__(self) -> int:
            return hash(tuple(zip(self._k, self._v, strict=True)))

        def __getattr__(self, name: str) -> Any:
            i = self._k.get(name)
            if i is None:
                raise AttributeError(name)
            return self._v[i]

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

from_shape: Final[Callable[[Shape, tuple[Any, ...]], FrozenDict]] = StructMeta.__call__.__get__(
    FrozenDict
)
"""``from_shape(s, values)``: the ``FrozenDict`` of ``shape`` ``s`` and ``values`` (frozen, one
per key in order), in one C call: the hot-path builders keep their shapes as constants."""


def frozen(d: dict[str, Any]) -> FrozenDict:
    """A ``FrozenDict`` of the items of ``d`` (string keys, frozen values), without checks.

    For hot paths: ``d`` is read once and not kept (``FrozenDict(k=v)`` goes through a
    Python-level metaclass call and checks nothing more).
    """
    keys = tuple(d)
    found = _SHAPES.get(keys)  # ``shape(keys)``, inlined for the common case
    return from_shape(shape(keys) if found is None else found, tuple(d.values()))


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
        return frozen(out)
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, tuple | list):
        return tuple([freeze(v) for v in value])
    raise TypeError(f"event data must be JSON-compatible, not {cls.__name__}")


def thaw(value: Any) -> Any:
    """Return a plain mutable JSON copy (dicts and lists) of frozen ``value``."""
    if type(value) is FrozenDict:
        return {k: thaw(v) for k, v in zip(value._k, value._v, strict=True)}
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
    if isinstance(value, FrozenDict):
        return dict(zip(value._k, value._v, strict=True))
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
