"""Projections folded synchronously on every append: the inbox and the loop's own state.

The inbox fold (docs/design.md#inbox) applies ``agent/inbox/spliced`` events at list coordinates; a
persisted splice whose coordinates are out of range fails with ``invalid persisted inbox
splice at session seq N``. The loop-state fold tracks what the driver and crash repair need
from the log alone (turn and step numbers, open turn/step, the latest request header and
context, the runtime-context text, the message-id counter, and the counters that
``statistics()`` reports: steps, tool calls and token totals), and the permission rules granted
by "always" approvals (``permissions/allowed``). All sans-I/O.

A queue of follow-ups can hold tens of thousands of messages, so the common splices cost
O(1) amortised per message, never O(queue length): appending is a list append; claiming from
the front moves a head offset and compacts the list only once the dead prefix outweighs the
live part; the id-uniqueness check reads an id index. That index is built only once more
than a handful of messages are pending and dropped when the inbox empties, so an agent with
a short inbox (the usual case, thousands per process) carries no extra structure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, ClassVar, Final, final, overload

from msgspec import Struct, field

from .._errors import AgentLoopError
from .._frozen import FrozenDict
from ..events import (
    ASSISTANT_MESSAGE,
    INBOX_SPLICED,
    PERMISSIONS_ALLOWED,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    STEP_END,
    STEP_START,
    TOOL_APPROVAL,
    TOOL_APPROVAL_REQUESTED,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
)
from .history import message_text

__all__ = [
    "AWAITING_APPROVAL",
    "NEXT_STEP",
    "NEXT_TURN",
    "ApprovalState",
    "InboxProjection",
    "InvalidSpliceError",
    "LoopState",
    "PendingList",
]

NEXT_TURN: Final = "next-turn"
NEXT_STEP: Final = "next-step"
RUNTIME_CONTEXT_SOURCE: Final = "runtime-context"

_COMPACT_AT: Final = 32
"""Claimed slots at the front of a pending list before it may be compacted."""
_INDEX_AT: Final = 16
"""Pending messages (both lists) above which the projection keeps an id index."""


class InvalidSpliceError(AgentLoopError):
    """A persisted inbox splice has coordinates outside its list."""

    code = "INVALID_INBOX_SPLICE"


def _id_number(message_id: Any) -> int:
    if isinstance(message_id, str) and message_id.startswith("m-"):
        try:
            return int(message_id[2:])
        except ValueError:
            return 0
    return 0


@final
class PendingList(Struct, gc=False):
    """One pending list: a read-only sequence whose front can be claimed in O(1) amortised.

    Claimed messages stay in ``_items`` before ``_head`` until they outnumber the live ones
    (the session log references them anyway), so a claim never shifts the whole list. Not
    tracked by the garbage collector (it holds frozen messages only), and an empty list holds
    the shared empty tuple, so an idle agent's two lists cost the collector nothing.
    """

    _items: list[FrozenDict] | tuple[()] = ()
    _head: int = 0

    def __len__(self) -> int:
        return len(self._items) - self._head

    @overload
    def __getitem__(self, index: int) -> FrozenDict: ...
    @overload
    def __getitem__(self, index: slice) -> list[FrozenDict]: ...
    def __getitem__(self, index: int | slice) -> FrozenDict | list[FrozenDict]:
        """One message, or a list of messages for a slice (only the slice is copied)."""
        head = self._head
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return list(self._items[head + start : head + max(start, stop)])
            return [self._items[head + i] for i in range(start, stop, step)]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("pending list index out of range")
        return self._items[head + index]

    def __iter__(self) -> Iterator[FrozenDict]:
        return islice(self._items, self._head, None)

    def __reversed__(self) -> Iterator[FrozenDict]:
        items = self._items
        return (items[i] for i in range(len(items) - 1, self._head - 1, -1))

    def __contains__(self, value: object) -> bool:
        return any(m == value for m in self)

    def index(self, value: object) -> int:
        """Position of the first message equal to ``value``.

        Raises:
            ValueError: none is.
        """
        for i, message in enumerate(self):
            if message == value:
                return i
        raise ValueError("message is not pending")

    def count(self, value: object) -> int:
        """How many pending messages equal ``value``."""
        return sum(1 for m in self if m == value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PendingList | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __repr__(self) -> str:
        return f"PendingList({list(self)!r})"

    def splice(self, start: int, count: int, inserted: Sequence[FrozenDict]) -> list[FrozenDict]:
        """Replace ``count`` messages from ``start`` (in range) with ``inserted``; return those.

        Appending costs what ``list.append`` does; removing from the front without inserting
        moves ``_head``, and the dead prefix is dropped only when it is larger than the live
        part, so each message is moved at most once more: O(1) amortised per message.
        """
        items = self._items
        at = self._head + start
        removed = list(items[at : at + count])
        if start == 0 and count and not inserted:
            self._head += count
            if self._head == len(items):
                self._items = ()  # empty again: back to the shared empty tuple
                self._head = 0
            elif self._head >= _COMPACT_AT and 2 * self._head > len(items):
                del items[: self._head]  # type: ignore[union-attr]  # non-empty: a list
                self._head = 0
        elif inserted or count:
            if type(items) is tuple:
                items = self._items = []
            items[at : at + count] = inserted  # type: ignore[index]
            if not items:
                self._items = ()
                self._head = 0
        return removed


Sequence.register(PendingList)


def _new_lists() -> dict[str, PendingList]:
    return {NEXT_TURN: PendingList(), NEXT_STEP: PendingList()}


@final
class InboxProjection(Struct, gc=False):
    """The two pending lists, rebuilt from splices (not tracked by the garbage collector)."""

    types: ClassVar[frozenset[str]] = frozenset({INBOX_SPLICED, USER_MESSAGE})

    lists: dict[str, PendingList] = field(default_factory=_new_lists)
    """The ``next-turn`` and ``next-step`` lists (the same two objects for its whole life)."""
    max_id: int = 0
    """Highest ``m-<n>`` seen, so new ids stay unique per session."""
    _index: dict[Any, int] | None = None
    """Pending id -> how many pending messages carry it (1 unless a stored log broke the
    uniqueness rule); None while few messages are pending (a scan is cheaper then)."""
    _pending: int = 0
    """Messages pending in both lists."""

    def fold(self, event: Event) -> None:
        """Fold one splice (or note a user message id)."""
        data = event.data
        if event.type == USER_MESSAGE:
            n = _id_number(data["message"].get("id"))
            if n > self.max_id:
                self.max_id = n
            return
        target = self.lists.get(str(data.get("target")))
        start, removed = data.get("start"), data.get("removed_count")
        inserted = data.get("inserted", ())
        size = 0 if target is None else len(target)
        if (
            target is None
            or type(start) is not int
            or type(removed) is not int
            or not 0 <= start <= size
            or not 0 <= removed <= size - start
        ):
            raise InvalidSpliceError(f"invalid persisted inbox splice at session seq {event.seq}")
        gone = target.splice(start, removed, inserted)
        for message in inserted:
            n = _id_number(message.get("id"))
            if n > self.max_id:
                self.max_id = n
        self._pending += len(inserted) - removed
        self._reindex(gone, inserted)

    def _reindex(self, gone: list[FrozenDict], inserted: Sequence[FrozenDict]) -> None:
        index = self._index
        pending = self._pending
        if index is None:
            if pending > _INDEX_AT:
                index = self._index = {}
                for lst in self.lists.values():
                    for message in lst:
                        key = message.get("id")
                        index[key] = index.get(key, 0) + 1
            return
        if not pending:
            self._index = None
            return
        for message in gone:
            key = message.get("id")
            left = index[key] - 1
            if left:
                index[key] = left
            else:
                del index[key]
        for message in inserted:
            key = message.get("id")
            index[key] = index.get(key, 0) + 1

    def __len__(self) -> int:
        """Messages pending in both lists."""
        return self._pending

    def has_id(self, message_id: str) -> bool:
        """True when a message with this id is pending in either list."""
        if not self._pending:
            return False
        if self._index is not None:
            return message_id in self._index
        for pending in self.lists.values():
            for message in pending:
                if message.get("id") == message_id:
                    return True
        return False

    def ids(self) -> set[str]:
        """Ids pending in either list."""
        return {m["id"] for lst in self.lists.values() for m in lst}


@final
class LoopState(Struct, gc=False):
    """What the driver derives from the log: turns, steps, request records, context text.

    It also counts what ``statistics()`` reports (``counters``): an int increment per
    ``step/start``, per tool call of an assistant message (each gets its one ``tool/call``) and
    per usage kind of an ``assistant/message``. Not tracked by the garbage collector: it holds
    frozen data, ints and strings only (``approvals`` holds events, ``call_ids`` strings).
    """

    types: ClassVar[frozenset[str]] = frozenset(
        {
            TURN_START,
            TURN_END,
            STEP_START,
            STEP_END,
            REQUEST_HEADER,
            REQUEST_CONTEXT,
            USER_MESSAGE,
            ASSISTANT_MESSAGE,
            TOOL_APPROVAL_REQUESTED,
            TOOL_APPROVAL,
            PERMISSIONS_ALLOWED,
        }
    )

    turn: int = 0
    open_turn: bool = False
    step: int = 0
    open_step: bool = False
    header: FrozenDict | None = None
    """The latest ``request/header`` header."""
    context: FrozenDict | None = None
    """The latest ``request/context`` data."""
    runtime_context: str | None = None
    """Text of the latest runtime-context ``user/message``."""
    approvals: ApprovalState | None = None
    """Tool calls awaiting a decision (made on the first approval event)."""
    call_ids: dict[str, None] | None = None
    """Tool-call ids of every assistant message, as dict keys (a dict of strings is not
    tracked by the garbage collector; a set would be); made on the first call."""
    steps: int = 0
    """``step/start`` events folded."""
    tool_calls: int = 0
    """Tool calls of assistant messages folded (executed or not: one ``tool/call`` each)."""
    input_tokens: int = 0
    """Sum of the ``usage`` recorded on assistant messages, by kind (four counters)."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    reasoning_tokens: int = 0
    granted: tuple[str, ...] = ()
    """Allow rules recorded by ``approve(call_id, always=True)``, in log order, each once
    (``_agent/_permissions.py`` evaluates them after the policy's deny and ask rules)."""

    def counters(self) -> tuple[int, int, int, int, int, int]:
        """``(steps, tool_calls, input, output, cache-read, reasoning tokens)`` so far."""
        return (
            self.steps,
            self.tool_calls,
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.reasoning_tokens,
        )

    def _note_message(self, data: FrozenDict) -> None:
        keys, values = data._k, data._v  # (read in place: the hot path)
        self._note_calls(values[keys["message"]]["content"])
        i = keys.get("usage")
        if i is not None:
            usage = values[i]
            if type(usage) is FrozenDict:
                usage = dict(zip(usage._k, usage._v, strict=True))
            self.input_tokens += usage.get("input_tokens", 0)
            self.output_tokens += usage.get("output_tokens", 0)
            self.cache_read_tokens += usage.get("cache_read_tokens", 0)
            self.reasoning_tokens += usage.get("reasoning_tokens", 0)

    def _note_calls(self, content: tuple[FrozenDict, ...]) -> None:
        for block in content:
            if block["type"] == "tool-call":
                if self.call_ids is None:
                    self.call_ids = {}
                self.call_ids[block["call_id"]] = None
                self.tool_calls += 1

    def fold(self, event: Event) -> None:
        """Fold one event."""
        t = event.type
        data = event.data
        if t == STEP_START:
            self.step = data._v[data._k["step"]]
            self.open_step = True
            self.steps += 1
        elif t == STEP_END:
            self.open_step = False
        elif t in (TURN_START, TURN_END):
            self._turn_boundary(event)
        elif t == REQUEST_HEADER:
            self.header = data["header"]
        elif t == REQUEST_CONTEXT:
            self.context = data
        elif t == ASSISTANT_MESSAGE:
            self._note_message(data)
        elif t == USER_MESSAGE:
            message = data["message"]
            if message.get("source") == RUNTIME_CONTEXT_SOURCE:
                self.runtime_context = message_text(message)
        elif t in (TOOL_APPROVAL_REQUESTED, TOOL_APPROVAL, PERMISSIONS_ALLOWED):
            self._note_approval(event)

    def _note_approval(self, event: Event) -> None:
        if event.type == PERMISSIONS_ALLOWED:
            rule = event.data.get("rule")
            if isinstance(rule, str) and rule not in self.granted:
                self.granted = (*self.granted, rule)
            return
        if self.approvals is None:
            self.approvals = ApprovalState()
        self.approvals.fold(event)

    def _turn_boundary(self, event: Event) -> None:
        if event.type == TURN_START:
            self.turn = event.data["turn"]
            self.open_turn = True
            self.step = 0
        else:
            self.open_turn = False
            self.open_step = False
        if self.approvals is not None:
            self.approvals.fold(event)


AWAITING_APPROVAL: Final = "awaiting-approval"
"""The ``turn/end`` reason kind of a turn that left tool calls waiting for a decision."""


@final
class ApprovalState:
    """Tool calls waiting for a person's decision, rebuilt from the log (durable approval).

    A ``tool/approval-requested`` made in a turn becomes pending when that turn ends
    ``awaiting-approval``; a turn that ends any other way gave its deferred calls results
    itself, so their requests are dropped. ``tool/approval`` records a decision on a pending
    call. The next ``turn/start`` is the continuation that settles every decided call (the
    driver starts no other turn while calls are pending), so it clears the set.
    """

    __slots__ = ("awaiting", "decisions", "requested")

    types = frozenset({TOOL_APPROVAL_REQUESTED, TOOL_APPROVAL, TURN_START, TURN_END})

    def __init__(self) -> None:
        self.requested: dict[str, Event] = {}
        """``tool/approval-requested`` events by call id, in model order."""
        self.decisions: dict[str, FrozenDict] = {}
        """``tool/approval`` data by call id."""
        self.awaiting = False
        """True between a ``turn/end {kind: awaiting-approval}`` and the next ``turn/start``."""

    def fold(self, event: Event) -> None:
        """Fold one event."""
        t = event.type
        data = event.data
        if t == TOOL_APPROVAL_REQUESTED:
            self.requested[data["call_id"]] = event
        elif t == TOOL_APPROVAL:
            if data["call_id"] in self.requested:
                self.decisions[data["call_id"]] = data
        elif t == TURN_END:
            reason = data["reason"]
            if reason["kind"] == AWAITING_APPROVAL:
                ids = reason.get("call_ids", ())
                self.requested = {k: v for k, v in self.requested.items() if k in ids}
                self.awaiting = bool(self.requested)
            else:
                self.clear()
        elif t == TURN_START:
            self.clear()

    def clear(self) -> None:
        """Forget every request and decision."""
        self.requested = {}
        self.decisions = {}
        self.awaiting = False

    def pending(self) -> list[Event]:
        """Requests still waiting for a decision, in model order."""
        if not self.awaiting:
            return []
        return [d for k, d in self.requested.items() if k not in self.decisions]

    @property
    def ready(self) -> bool:
        """True when calls await the continuation and every one is decided."""
        return self.awaiting and len(self.decisions) == len(self.requested)
