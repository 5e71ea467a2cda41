"""What the server says about a session, folded from its log once (docs/design.md#serve).

A ``Digest`` folds a session's committed events in order: turns, token totals (every model call
the log records: each ``assistant/message``'s ``usage`` and each compaction's summary call), the
time of the last event, whether a turn is open, the last ``turn/end`` reason, and the calls
waiting for a decision (the runtime's own ``ApprovalState`` projection decides which). It is
incremental: the ``Digests`` cache keeps one per session and reads only the events appended since
(a log only grows), so listing a store the server has read before costs one ``stat`` per session
and no re-read. A malformed stored event is skipped, never fatal.

``status`` combines the digest with the fleet: ``awaiting-approval`` when calls wait for a
decision, else ``running`` when a turn is open and a live worker holds the session, else
``idle`` when a live worker holds it, else ``unowned``.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

from .._agent import subagents
from .._frozen import thaw
from .._session.projections import ApprovalState
from .._session.store import SessionInfo, SessionStore
from ..events import (
    ASSISTANT_MESSAGE,
    CONTEXT_COMPACTION,
    TURN_END,
    TURN_START,
    Event,
)

#: Sessions whose digests the server keeps (least recently used dropped first).
MAX_DIGESTS: Final = 20_000
#: Sessions whose header links (parent, fork source) the server keeps: two ids each.
MAX_LINKS: Final = 500_000
#: Status values, in the order the page lists them.
STATUSES: Final = ("running", "awaiting-approval", "idle", "unowned")


def _tokens(usage: Any) -> tuple[int, int]:
    if not isinstance(usage, Mapping):
        return 0, 0
    values = []
    for key in ("input_tokens", "output_tokens"):
        value = usage.get(key)
        values.append(value if isinstance(value, int) and value >= 0 else 0)
    return values[0], values[1]


@final
class Digest:
    """One session's figures, folded from its events (module docstring)."""

    def __init__(self, info: SessionInfo, header: Mapping[str, Any]) -> None:
        self.session_id = info.session_id
        self.agent_id = info.agent_id
        self.created_at = info.created_at
        self.header = header
        self.parent, self.forked_from = subagents.links(header)
        self.events = 0
        self.turns = 0
        self.open_turn = False
        self.last_turn_end: Mapping[str, Any] | None = None
        self.last_time: float | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.approvals = ApprovalState()

    def fold(self, events: Sequence[Event]) -> None:
        """Fold ``events``, the next ones of the log after those folded already."""
        for event in events:
            self.events += 1
            self.last_time = event.time
            with contextlib.suppress(KeyError, TypeError, AttributeError, ValueError):
                self._fold_one(event)

    def _fold_one(self, event: Event) -> None:
        t, data = event.type, event.data
        if t in ApprovalState.types:
            self.approvals.fold(event)
        if t == TURN_START:
            self.turns += 1
            self.open_turn = True
        elif t == TURN_END:
            self.open_turn = False
            reason = data.get("reason")
            self.last_turn_end = reason if isinstance(reason, Mapping) else None
        elif t == ASSISTANT_MESSAGE:
            self._add(data.get("usage"))
        elif t == CONTEXT_COMPACTION:
            call = data.get("call")
            if isinstance(call, Mapping):
                self._add(call.get("usage"))

    def _add(self, usage: Any) -> None:
        i, o = _tokens(usage)
        self.input_tokens += i
        self.output_tokens += o

    def pending(self) -> list[dict[str, Any]]:
        """The calls waiting for a decision: call id, tool name, arguments and turn."""
        return [
            {
                "call_id": str(e.data.get("call_id")),
                "name": e.data.get("name"),
                "arguments": thaw(e.data.get("arguments")),
                "turn": e.data.get("turn"),
            }
            for e in self.approvals.pending()
        ]

    def status(self, owner: str | None) -> str:
        """``awaiting-approval``, ``running``, ``idle`` or ``unowned`` (module docstring)."""
        if self.approvals.pending():
            return "awaiting-approval"
        if owner is None:
            return "unowned"
        return "running" if self.open_turn else "idle"

    def summary(self, owner: str | None) -> dict[str, Any]:
        """The API's session summary (docs/serve.md#sessions)."""
        return {
            "id": self.session_id,
            "agent": self.agent_id,
            "status": self.status(owner),
            "created_at": self.created_at,
            "last_activity": self.last_time,
            "events": self.events,
            "turns": self.turns,
            "tokens": {
                "input": self.input_tokens,
                "output": self.output_tokens,
                "total": self.input_tokens + self.output_tokens,
            },
            "parent": self.parent,
            "forked_from": self.forked_from,
            "owner": owner,
            "pending_approvals": len(self.approvals.pending()),
            "last_turn_end": thaw(self.last_turn_end) if self.last_turn_end else None,
        }


@final
class Digests:
    """The server's digests by session id, brought up to date on each read (LRU-bounded)."""

    def __init__(self, store: SessionStore, limit: int = MAX_DIGESTS) -> None:
        self._store = store
        self._limit = limit
        self._cache: OrderedDict[str, Digest] = OrderedDict()
        self._links: dict[str, tuple[str | None, str | None]] = {}

    async def links(self, info: SessionInfo) -> tuple[str | None, str | None]:
        """``(parent, forked_from)`` of the session: its header only, read once (it never changes).

        Raises:
            SessionNotFoundError: the session was deleted meanwhile. StoreError: a read failed.
        """
        found = self._links.get(info.session_id)
        if found is None:
            digest = self._cache.get(info.session_id)
            if digest is not None:
                found = (digest.parent, digest.forked_from)
            else:
                reader = await self._store.open(info.session_id, "read")
                try:
                    found = subagents.links(reader.header)
                finally:
                    await reader.close()
            if len(self._links) < MAX_LINKS:
                self._links[info.session_id] = found
        return found

    async def of(self, info: SessionInfo) -> Digest:
        """The digest of the session ``info`` describes, folded up to its stored events.

        Raises:
            SessionNotFoundError: the session was deleted meanwhile. StoreError: a read failed.
        """
        digest = self._cache.get(info.session_id)
        if digest is not None and digest.events > info.event_count:
            digest = None  # a log never shrinks: this is another session of the same id
        if digest is not None and digest.events == info.event_count:
            self._cache.move_to_end(info.session_id)
            return digest
        reader = await self._store.open(info.session_id, "read")
        try:
            if digest is None:
                digest = Digest(info, reader.header)
            digest.fold(await reader.read(digest.events))
        finally:
            await reader.close()
        self._cache[info.session_id] = digest
        self._cache.move_to_end(info.session_id)
        while len(self._cache) > self._limit:
            self._cache.popitem(last=False)
        return digest
