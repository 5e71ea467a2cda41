"""The agent's inbox API: every change is one ``agent/inbox/spliced`` event (docs/design.md#inbox).

Two pending lists, ``next-turn`` (follow-up prompts) and ``next-step`` (steering and injected
context). Insert, edit, remove, claim and clear are all splices at list coordinates; the API
normalises coordinates like Python slices, so a stored splice is always in range. The session's
inbox projection folds each splice synchronously; this class only builds splices and publishes
the ``inserted`` / ``claimed`` / ``discarded`` notifications.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, Protocol, final

from .._frozen import FrozenDict, freeze, from_shape, shape
from .._session.log import Session
from .._session.projections import NEXT_STEP, NEXT_TURN, PendingList
from ..events import INBOX_CLAIMED, INBOX_DISCARDED, INBOX_INSERTED, INBOX_SPLICED

__all__ = ["Inbox", "MessageInput", "Target", "user_message"]

Target = Literal["next-turn", "next-step"]
MessageInput = str | Sequence[Mapping[str, Any]] | Mapping[str, Any]
_TARGETS = (NEXT_TURN, NEXT_STEP)


def user_message(message_id: str, content: MessageInput, source: str | None = None) -> FrozenDict:
    """Build a model-facing user message ``{role, id, content, source?}``."""
    if isinstance(content, str):
        blocks: Any = (from_shape(_TEXT_BLOCK, ("text", content)),)
    elif isinstance(content, Mapping):
        if "content" in content:
            return user_message(message_id, content["content"], content.get("source", source))
        blocks = (freeze(content),)
    else:
        blocks = freeze(list(content))
    if source is None:
        return from_shape(_USER, ("user", message_id, blocks))
    return from_shape(_USER_SOURCE, ("user", message_id, blocks, source))


# The shapes ``user_message`` builds (``from_shape``: one C call each).
_TEXT_BLOCK = shape(("type", "text"))
_USER = shape(("role", "id", "content"))
_USER_SOURCE = shape(("role", "id", "content", "source"))


class Notifier(Protocol):
    """Receives the inbox's notifications."""

    def notify(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Publish notification ``event_type``."""


@final
class Inbox:
    """Pending messages of one agent, backed by its session log."""

    __slots__ = (
        "_owner",
        "_session",
    )

    def __init__(self, session: Session, owner: Notifier) -> None:
        self._session = session
        self._owner = owner
        """Told ``notify(type, data)`` of every insert and removal (the agent)."""

    # -- reading ---------------------------------------------------------------------------
    def pending(self, target: Target) -> tuple[FrozenDict, ...]:
        """Messages pending in ``target``, oldest first."""
        return tuple(self._list(target))

    @property
    def next_turn(self) -> tuple[FrozenDict, ...]:
        """Pending follow-up prompts."""
        return self.pending(NEXT_TURN)

    @property
    def next_step(self) -> tuple[FrozenDict, ...]:
        """Pending steering and injected context."""
        return self.pending(NEXT_STEP)

    def __len__(self) -> int:
        return len(self._session.inbox)

    def _list(self, target: str) -> PendingList:
        if target not in _TARGETS:
            raise ValueError(f"unknown inbox target {target!r} (use 'next-turn' or 'next-step')")
        return self._session.inbox.lists[target]

    def find(self, message_id: str) -> tuple[Target, int] | None:
        """Where message ``message_id`` is pending, or None."""
        if not self._session.inbox.has_id(message_id):
            return None
        for target in _TARGETS:
            for i, message in enumerate(self._session.inbox.lists[target]):
                if message["id"] == message_id:
                    return target, i  # type: ignore[return-value]
        return None

    # -- changing -------------------------------------------------------------------------
    def new_id(self) -> str:
        """A fresh ``m-<n>`` id (counted per session)."""
        return f"m-{self._session.inbox.max_id + 1}"

    def splice(
        self,
        target: Target,
        start: int | None,
        stop: int | None,
        inserted: Sequence[FrozenDict] = (),
        *,
        outcome: Literal["canceled"] | None = "canceled",
    ) -> None:
        """Replace ``target[start:stop]`` with ``inserted`` (slice coordinates, normalised).

        Removed messages are discarded (``outcome="canceled"``) or claimed (``outcome=None``).

        Raises:
            ValueError: an inserted id is already pending (``message "<id>" is already pending``).
        """
        items = self._list(target)
        begin, end, _ = slice(start, stop).indices(len(items))
        removed = items[begin:end] if end > begin else []
        if inserted:
            self._check_new_ids(removed, inserted)
        elif not removed:
            return
        self._apply(target, begin, removed, inserted, outcome)

    def _apply(
        self,
        target: Target,
        begin: int,
        removed: Sequence[FrozenDict],
        inserted: Sequence[FrozenDict],
        outcome: Literal["canceled"] | None,
    ) -> None:
        data: dict[str, Any] = {
            "target": target,
            "start": begin,
            "removed_count": len(removed),
            "inserted": tuple(inserted),
        }
        if removed and outcome is not None:
            data["outcome"] = outcome
        self._session.add(INBOX_SPLICED, FrozenDict(data))
        kind = INBOX_DISCARDED if outcome is not None else INBOX_CLAIMED
        for message in removed:
            self._owner.notify(kind, {"message": message})
        for message in inserted:
            self._owner.notify(INBOX_INSERTED, {"message": message})

    def _check_new_ids(self, removed: Sequence[FrozenDict], inserted: Sequence[FrozenDict]) -> None:
        """Refuse an inserted id that stays pending or repeats (O(len(removed) + len(inserted)))."""
        projection = self._session.inbox
        if not removed and len(inserted) == 1:  # the common case: one new message
            message_id = inserted[0]["id"]
            if projection.has_id(message_id):
                raise ValueError(f'message "{message_id}" is already pending')
            return
        freed: Collection[str] = {m["id"] for m in removed} if removed else ()
        seen: set[str] = set()
        for message in inserted:
            message_id = message["id"]
            if message_id in seen or (message_id not in freed and projection.has_id(message_id)):
                raise ValueError(f'message "{message_id}" is already pending')
            seen.add(message_id)

    def insert(
        self,
        content: MessageInput,
        target: Target = NEXT_TURN,
        *,
        index: int | None = None,
        message_id: str | None = None,
        source: str | None = None,
    ) -> str:
        """Queue a message (at the end, or at ``index``) and return its id."""
        message = user_message(message_id or self.new_id(), content, source)
        at = len(self._list(target)) if index is None else index
        self.splice(target, at, at, (message,))
        return str(message["id"])

    def edit(self, message_id: str, content: MessageInput) -> None:
        """Replace the content of a pending message (same id, same place).

        Raises:
            KeyError: no pending message has this id.
        """
        found = self.find(message_id)
        if found is None:
            raise KeyError(message_id)
        target, i = found
        old = self._list(target)[i]
        message = user_message(message_id, content, old.get("source"))
        self.splice(target, i, i + 1, (message,))

    def remove(self, message_id: str) -> bool:
        """Discard a pending message; False when it was not pending."""
        found = self.find(message_id)
        if found is None:
            return False
        target, i = found
        self.splice(target, i, i + 1)
        return True

    def clear(self) -> None:
        """Discard everything: one canceled splice per non-empty list, next-step first."""
        for target in (NEXT_STEP, NEXT_TURN):
            if self._list(target):
                self.splice(target, 0, None)

    def claim(self, target: Target, count: int | None = None) -> tuple[FrozenDict, ...]:
        """Take the first ``count`` (all when None) messages of ``target`` (the loop only)."""
        items = self._list(target)
        taken = items[:count]
        if taken:
            self._apply(target, 0, taken, (), None)
        return tuple(taken)
