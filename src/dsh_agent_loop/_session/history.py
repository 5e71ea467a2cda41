"""The surface projection: which events are model-facing, and the derived message history.

Surface events (``system/message``, ``user/message``, ``assistant/message``, ``tool/result``) are
appended to the surface unless they carry a replace ``surface_op``, which swaps the contiguous
surface range ``start_seq..end_seq`` for the replacing event. Derived history is the surface's
messages in order, minus empty system nodes.

Appends extend an append-only message list in place, and ``derive_messages()`` returns a
``MessagesView`` over a prefix of it: building a request is O(1), and a message that entered
one request is the same object in every later one. A replacement (rare) builds a new list, so
views handed out earlier keep what they showed. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, ClassVar, final, overload

from msgspec import Struct, field

from .._frozen import FrozenDict
from ..events import SURFACE_TYPES, SYSTEM_MESSAGE, Event

__all__ = ["MessagesView", "SurfaceProjection", "message_text"]


@final
class MessagesView(Struct, gc=False, eq=False):
    """An immutable view of the first ``n`` messages of an append-only list.

    A read-only ``Sequence`` (registered as one): ``len``, indexing and slicing, iteration,
    ``in``, ``reversed``, ``index``, ``count``, and ``==`` with any sequence. Not GC-tracked (a
    ``msgspec.Struct`` declared ``gc=False``): a request holds one for as long as its model
    streams, and it refers only to the message list, which never refers back.
    """

    _items: list[FrozenDict]
    _n: int

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> FrozenDict: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[FrozenDict, ...]: ...
    def __getitem__(self, index: int | slice) -> FrozenDict | tuple[FrozenDict, ...]:
        if type(index) is not int:
            if isinstance(index, slice):
                return tuple(self._items[: self._n][index])
            index = index.__index__()
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("message index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[FrozenDict]:
        return islice(self._items, self._n)  # C-speed; the list only grows past _n

    def __reversed__(self) -> Iterator[FrozenDict]:
        items = self._items
        for i in range(self._n - 1, -1, -1):
            yield items[i]

    def __contains__(self, value: object) -> bool:
        return any(m is value or m == value for m in self)

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        """The position of the first message equal to ``value`` (``ValueError`` if none)."""
        n = self._n
        start = max(start + n, 0) if start < 0 else start
        stop = n if stop is None else (stop + n if stop < 0 else min(stop, n))
        items = self._items
        for i in range(start, stop):
            if items[i] is value or items[i] == value:
                return i
        raise ValueError("message not in view")

    def count(self, value: object) -> int:
        """How many messages equal ``value``."""
        return sum(1 for m in self if m is value or m == value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessagesView({list(self)!r})"


Sequence.register(MessagesView)


def message_text(message: FrozenDict) -> str:
    """Concatenated text of a message's text blocks."""
    return "".join(b.get("text", "") for b in message.get("content", ()) if b.get("type") == "text")


def _is_visible(event: Event) -> bool:
    message = event.data.get("message")
    if message is None:
        return False
    return not (event.type == SYSTEM_MESSAGE and not message.get("content"))


def _no_entries() -> list[Event]:
    return []


def _no_messages() -> list[FrozenDict]:
    return []


@final
class SurfaceProjection(Struct, gc=False):
    """Folds surface events; answers derived history and the surviving system nodes.

    Not tracked by the garbage collector (it holds events and frozen messages only).
    """

    types: ClassVar[frozenset[str]] = SURFACE_TYPES

    entries: list[Event] = field(default_factory=_no_entries)
    """Surface events in order."""
    system_nodes: tuple[Event, ...] = ()
    """Surviving ``system/message`` surface events in order (node 0 is the head). A tuple:
    system messages are few, and a tuple of events is not tracked by the collector."""
    generation: int = 0
    """Counts replacements; a change tells the driver a new request series starts."""
    _nodes: tuple[tuple[int, str], ...] | None = None
    _messages: list[FrozenDict] = field(default_factory=_no_messages)

    def fold(self, event: Event) -> None:
        """Fold one event (non-surface types are ignored)."""
        if event.type not in SURFACE_TYPES:
            return
        op = event.surface_op
        if op is None or op == "append":
            self.entries.append(event)
            data = event.data
            i = data._k.get("message")  # (read in place: the hot path)
            message = None if i is None else data._v[i]
            if event.type == SYSTEM_MESSAGE:
                self.system_nodes = (*self.system_nodes, event)
                self._nodes = None
                if message is not None and message.get("content"):
                    self._messages.append(message)
            elif message is not None:
                self._messages.append(message)
            return
        self._replace(event, op)

    def check_replace(self, op: Any) -> tuple[int, int]:
        """Return the surface positions ``op`` replaces.

        Raises:
            ValueError: the op is malformed or names events not on the surface.
        """
        if not isinstance(op, Mapping) or op.get("op") != "replace":
            raise ValueError(f"unknown surface_op {op!r}")
        start, end = op.get("start_seq"), op.get("end_seq")
        positions = {e.seq: i for i, e in enumerate(self.entries)}
        if start not in positions or end not in positions:
            raise ValueError(f"surface replace names seqs {start}..{end} not on the surface")
        i, j = positions[start], positions[end]
        if j < i:
            raise ValueError("surface replace range is reversed")
        return i, j

    def _replace(self, event: Event, op: Any) -> None:
        i, j = self.check_replace(op)
        self.entries[i : j + 1] = [event]
        self.generation += 1
        self.system_nodes = tuple([e for e in self.entries if e.type == SYSTEM_MESSAGE])
        self._nodes = None
        self._messages = [e.data["message"] for e in self.entries if _is_visible(e)]

    def node_texts(self) -> list[tuple[int, str]]:
        """``(seq, text)`` of the surviving system nodes, head first (cached until they change)."""
        if self._nodes is None:  # kept as a tuple (untracked by the collector), handed as a list
            self._nodes = tuple(
                [(int(e.seq or 0), message_text(e.data["message"])) for e in self.system_nodes]
            )
        return list(self._nodes)

    def messages(self) -> Sequence[FrozenDict]:
        """The derived history now (an O(1) immutable view: a ``MessagesView``)."""
        # (a registered Sequence, which type checkers don't see)
        return MessagesView(self._messages, len(self._messages))  # type: ignore[return-value]
