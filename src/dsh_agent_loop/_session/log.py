"""``Session``: the append-only event log of one session, with its live projections.

``append`` is synchronous and never blocks: it assigns dense seqs, folds every registered
projection (so when it returns every projection reflects the batch), queues the events for the
session writer and wakes it. Events are stored exactly as appended; only the writer task moves
them to the store. A session given its runtime's ``RecordCache`` appends the payloads agents
write alike (``_session/records.py``) as one object: an equal payload, the same JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, final

from .._frozen import FrozenDict, freeze
from ..events import DURABLE_TYPES, SURFACE_TYPES, Event, _new_event
from .history import SurfaceProjection
from .projections import InboxProjection, LoopState
from .records import SHARED_PAYLOAD_TYPES, RecordCache

__all__ = ["Projection", "Session", "SessionView", "Waker"]


class Waker(Protocol):
    """What a session tells that events are pending (the session writer)."""

    def wake(self) -> None:
        """Events are pending; never switches tasks."""
        ...


class Projection(Protocol):
    """Something folded synchronously on every append."""

    types: frozenset[str] | None
    """Event types it folds (None: all)."""

    def fold(self, event: Event) -> None:
        """Fold one event."""
        ...


def _fold_surface(session: Session, event: Event) -> None:
    session.surface.fold(event)


def _fold_inbox(session: Session, event: Event) -> None:
    session.inbox.fold(event)


def _fold_state(session: Session, event: Event) -> None:
    session.state.fold(event)


def _fold_surface_state(session: Session, event: Event) -> None:
    session.surface.fold(event)
    session.state.fold(event)


def _fold_surface_inbox_state(session: Session, event: Event) -> None:
    session.surface.fold(event)
    session.inbox.fold(event)
    session.state.fold(event)


def _fold_inbox_state(session: Session, event: Event) -> None:
    session.inbox.fold(event)
    session.state.fold(event)


_FOLD_COMBOS: dict[tuple[str, ...], Callable[[Session, Event], None]] = {
    ("surface",): _fold_surface,
    ("inbox",): _fold_inbox,
    ("state",): _fold_state,
    ("surface", "state"): _fold_surface_state,
    ("inbox", "state"): _fold_inbox_state,
    ("surface", "inbox", "state"): _fold_surface_inbox_state,
}


def _builtin_folds() -> dict[str, Callable[[Session, Event], None]]:
    """Event type -> one function folding every built-in projection that takes it, in order."""
    table: dict[str, tuple[str, ...]] = {}
    for name, cls in (
        ("surface", SurfaceProjection),
        ("inbox", InboxProjection),
        ("state", LoopState),
    ):
        for t in cls.types:
            table[t] = (*table.get(t, ()), name)
    return {t: _FOLD_COMBOS[names] for t, names in table.items()}


_BUILTIN_FOLDS = _builtin_folds()


@final
class Session:
    """One session's log and projections. Owned by one agent; appended from its tasks."""

    __slots__ = (
        "_clock",
        "_events",
        "_extra",
        "_taken",
        "header",
        "id",
        "inbox",
        "records",
        "state",
        "surface",
        "wake_limit",
        "waker",
    )

    def __init__(
        self,
        header: Mapping[str, Any],
        *,
        clock: Callable[[], float],
        events: Sequence[Event] = (),
        records: RecordCache | None = None,
    ) -> None:
        self.header: FrozenDict = freeze(header)
        self.id: str = str(header["session_id"])
        self._clock = clock
        self.records = records
        """The runtime's shared payloads: ``add`` appends an equal payload of the
        ``SHARED_PAYLOAD_TYPES`` written before (by any agent of the runtime) in its place."""
        self._events: list[Event] = []
        self._taken = 0
        """Events before this index were handed to the writer; the rest are pending (no list
        of pending events: one per step would outlive the step's yield and reach the oldest
        generation of the collector)."""
        self._extra: list[Projection] | None = None
        self.waker: Waker | None = None
        """Set by the session writer (itself, not a bound method: one object less per
        session): woken when the first event is pending, and after each append while
        ``wake_limit`` or more are (the writer commits early then)."""
        self.wake_limit = 1
        self.surface = SurfaceProjection()
        self.inbox = InboxProjection()
        self.state = LoopState()
        for event in events:
            self._replay(event)
        self._taken = len(self._events)

    # -- projections -------------------------------------------------------------------
    def register_projection(self, projection: Projection, *, replay: bool = True) -> None:
        """Fold ``projection`` on every later append (and, with ``replay``, on the log so far)."""
        if replay:
            for event in self._events:
                if projection.types is None or event.type in projection.types:
                    projection.fold(event)
        if self._extra is None:
            self._extra = []
        self._extra.append(projection)

    def _fold(self, event: Event) -> None:
        # The built-in projections are dispatched from a class-level table (no per-session
        # dispatch structures: thousands of sessions live in one process).
        t = event.type
        fold = _BUILTIN_FOLDS.get(t)
        if fold is not None:
            fold(self, event)
        if self._extra is not None:
            for projection in self._extra:
                if projection.types is None or t in projection.types:
                    projection.fold(event)

    def _replay(self, event: Event) -> None:
        if event.seq != len(self._events):
            raise ValueError(f"stored seq {event.seq} is not dense (expected {len(self._events)})")
        self._check_type(event)
        self._fold(event)
        self._events.append(event)

    @staticmethod
    def _check_type(event: Event) -> None:
        if event.type not in DURABLE_TYPES and not event.ignorable:
            raise ValueError(f"unknown event type {event.type!r} (and not ignorable)")
        if event.surface_op is not None and event.type not in SURFACE_TYPES:
            raise ValueError(f"surface_op is not allowed on {event.type!r}")

    # -- appending ---------------------------------------------------------------------
    def add(
        self,
        type: str,
        data: FrozenDict,
        *,
        surface_op: Any = None,
        source_event_seqs: tuple[int, ...] | None = None,
    ) -> Event:
        """Append one event built from already-frozen ``data`` (the driver's hot path)."""
        if type in SHARED_PAYLOAD_TYPES and self.records is not None:
            data = self.records.payload(type, data)  # one object for equal payloads
        event = _new_event(  # field order: ignorable comes before surface_op
            type, len(self._events), self._clock(), data, False, surface_op, source_event_seqs
        )
        fold = _BUILTIN_FOLDS.get(type)
        if fold is not None:
            fold(self, event)
        if self._extra is not None:
            for projection in self._extra:
                if projection.types is None or type in projection.types:
                    projection.fold(event)
        events = self._events
        events.append(event)
        waker = self.waker
        if waker is not None:
            pending = len(events) - self._taken
            if pending == 1 or pending >= self.wake_limit:
                waker.wake()
        return event

    def append(self, *events: Event) -> list[Event]:
        """Append events (their ``seq`` and ``time`` are assigned here) and return them.

        Raises:
            ValueError: an unknown non-ignorable type, a misplaced ``surface_op``, or a replace
                that names events not on the surface. Nothing of the batch is appended then.
        """
        now = self._clock()
        stamped = [e.with_seq(len(self._events) + i, now) for i, e in enumerate(events)]
        for event in stamped:
            self._check_type(event)
        self._check_surface_ops(stamped)
        if not stamped:
            return stamped
        for event in stamped:
            self._fold(event)
            self._events.append(event)
        if self.waker is not None:
            self.waker.wake()
        return stamped

    def _check_surface_ops(self, batch: list[Event]) -> None:
        """Simulate the batch's surface changes so a bad replace refuses the whole batch."""
        if all(e.surface_op in (None, "append") for e in batch):
            return
        seqs = [e.seq for e in self.surface.entries]
        for event in batch:
            if event.type not in SURFACE_TYPES:
                continue
            op = event.surface_op
            if op is None or op == "append":
                seqs.append(event.seq)
                continue
            if not isinstance(op, Mapping) or op.get("op") != "replace":
                raise ValueError(f"unknown surface_op {op!r}")
            start, end = op.get("start_seq"), op.get("end_seq")
            if start not in seqs or end not in seqs or seqs.index(end) < seqs.index(start):
                raise ValueError(f"surface replace names seqs {start}..{end} not on the surface")
            i, j = seqs.index(start), seqs.index(end)
            seqs[i : j + 1] = [event.seq]

    def take_pending(self) -> list[Event]:
        """Hand the events not yet given to the store to the caller (the writer)."""
        events = self._events
        taken, self._taken = self._taken, len(events)
        return events[taken:]

    def has_pending(self) -> bool:
        """True when events wait for the writer."""
        return len(self._events) > self._taken

    def pending_count(self) -> int:
        """How many events wait for the writer."""
        return len(self._events) - self._taken

    def pending_events(self) -> list[Event]:
        """The events waiting for the writer (a copy; they stay pending)."""
        return self._events[self._taken :]

    # -- reading -------------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """A copy of the whole log."""
        return list(self._events)

    def event(self, seq: int) -> Event:
        """The event at ``seq``."""
        return self._events[seq]

    def __len__(self) -> int:
        return len(self._events)

    @property
    def last_seq(self) -> int:
        """Seq of the newest event, or -1."""
        return len(self._events) - 1

    def derive_messages(self) -> Sequence[FrozenDict]:
        """The model-facing messages in log order (replacements applied)."""
        return self.surface.messages()


@final
class SessionView:
    """Read-only view of a session for users: ``events``, ``derive_messages()``, ``id``."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def id(self) -> str:
        """The session id."""
        return self._session.id

    @property
    def header(self) -> FrozenDict:
        """The session header."""
        return self._session.header

    @property
    def events(self) -> list[Event]:
        """A copy of the log."""
        return self._session.events

    def derive_messages(self) -> Sequence[FrozenDict]:
        """The model-facing messages."""
        return self._session.derive_messages()

    def __len__(self) -> int:
        return len(self._session)
