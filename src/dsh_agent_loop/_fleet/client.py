"""``FleetClient`` and ``open_client``: reach any session of a fleet from any process.

See docs/design.md#fleet-clients. A client needs no runtime and owns nothing: it writes rows
into the fleet's tables (``sql``) in the store's database and reads session logs through the
store. What it writes is durable when the call returns; a worker delivers it:

- ``send`` accepts one message in one transaction that also takes the session's next number
  (the row lock orders racing senders, so messages reach the log in the order their ``send``
  calls returned). A ``message_id`` already accepted for the session is the same message: the
  call changes nothing and returns that id.
- ``cancel``/``approve``/``deny``/``withdraw`` are commands, numbered in the same order as
  messages; ``approve``/``deny``/``cancel`` return once a worker applied them (its error, if
  any, raised as ``FleetCommandError``), or at once with ``wait=False``.
- ``create`` queues a ``create`` command carrying the options a resume remembers
  (``header_options``); the worker that claims it creates the session (the header's options
  record is the same one ``rt.agents.create`` writes).
- ``run`` sends, then follows the session's log (``events``) until the turn that claimed the
  message ends (``follow``); cancelled (or past ``timeout``), it sends ``withdraw``: the worker
  removes the message if still queued or aborts its turn, as ``agent.run`` does.
- ``events`` reads committed events, then polls for new ones (``poll_interval``).

A session is known when the fleet has a row for it or the store has it; anything else raises
``SessionNotFoundError``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, final

import trio

from .._agent.inbox import MessageInput
from .._agent.options import AgentOptions
from .._agent.output import output_schema
from .._agent.remember import HEADER_OPTIONS, header_options
from .._agent.results import TurnResult
from .._errors import (
    AgentLoopError,
    InvalidOptionError,
    LimitExceededError,
    SessionAlreadyExistsError,
    SessionNotFoundError,
)
from .._frozen import thaw
from .._session.store import ReadHandle, SessionStore
from ..events import Event
from . import sql as _sql
from .db import FleetDb
from .follow import Follow
from .options import FleetStatus, WorkerStatus

__all__ = ["EventTail", "FleetClient", "FleetCommandError", "open_client"]

#: Largest message (its JSON) ``send`` accepts.
MAX_MESSAGE_BYTES: Final = 1_000_000
#: Longest ``message_id``/``session_id``/``call_id``.
MAX_ID: Final = 200
#: Seconds between looks at a command's outcome, or at a session's log for new events.
POLL_INTERVAL: Final = 0.05
#: Seconds a cancelled ``run`` spends (shielded) sending its ``withdraw``.
WITHDRAW_GRACE: Final = 5.0
#: Default lease, in seconds, of a fleet on SQLite (``FleetOptions.lease_s``).
SQLITE_LEASE: Final = 10.0


class FleetCommandError(AgentLoopError):
    """The worker that applied a command met an error (the message says which)."""

    code = "FLEET_COMMAND_FAILED"


def new_message_id() -> str:
    """A fresh message id (never of the ``m-<n>`` form agents number their own with)."""
    return f"msg-{uuid.uuid4().hex}"


def _check_id(what: str, value: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID:
        raise InvalidOptionError(f"{what} must be a string of 1..{MAX_ID} characters")


def _create_body(options: AgentOptions) -> str:
    """A ``create`` command's body: the header record a resume reads its options from."""
    record = {
        "agent_id": options.id,
        "cwd": options.cwd,
        HEADER_OPTIONS: thaw(header_options(options)),
    }
    return json.dumps(record, ensure_ascii=False, default=str)


def _content(message: MessageInput) -> Any:
    if isinstance(message, str):
        return message
    return thaw(message) if isinstance(message, Mapping) else [thaw(m) for m in message]


@final
class FleetClient:
    """Send to, steer and watch any session of the fleet on ``store`` (module docstring)."""

    def __init__(self, store: SessionStore, *, lease: float | None = None) -> None:
        self.store = store
        self._db = FleetDb.of(store)
        self.lease = lease or self._db.store_lease or SQLITE_LEASE
        """Seconds without a heartbeat after which ``status()`` shows a worker as gone."""
        self._known: set[str] = set()

    @property
    def db(self) -> FleetDb:
        """The fleet's tables (the worker shares the client's connection)."""
        return self._db

    async def aclose(self) -> None:
        """Close the fleet's connections (the store is the caller's)."""
        await self._db.aclose()

    async def known(self, session_id: str) -> bool:
        """True when the store has ``session_id`` or the fleet has it queued for creation.

        Raises:
            InvalidOptionError: not a session id (empty, or over ``MAX_ID`` characters).
        """
        _check_id("session_id", session_id)
        if session_id in self._known:
            return True
        known = await self._db.run(_sql.known, session_id, again=True)
        if not known and await self.store.stat(session_id) is None:
            return False
        if len(self._known) < 100_000:
            self._known.add(session_id)
        return True

    async def queued(self, session_id: str) -> tuple[str, float] | None:
        """``(agent_id, when)`` of a session ``create`` queued, until a worker creates it.

        None once the store has the session, or when no ``create`` queued it.
        """
        _check_id("session_id", session_id)
        if await self.store.stat(session_id) is not None:
            return None
        return await self._db.run(_sql.creation, session_id, again=True)

    async def _check_known(self, session_id: str) -> None:
        """Raise ``SessionNotFoundError`` unless the fleet or the store has ``session_id``."""
        if not await self.known(session_id):
            raise SessionNotFoundError(f"session {session_id!r} not found")

    # --- messages ------------------------------------------------------------------------------

    async def send(
        self,
        session_id: str,
        message: MessageInput,
        *,
        kind: str = "followup",
        message_id: str | None = None,
        _output: Mapping[str, Any] | None = None,
    ) -> str:
        """Accept ``message`` for ``session_id``; durable when this returns. Returns its id.

        ``kind``: ``followup`` (a prompt for the next turn), ``steer`` (next step, wakes the
        agent) or ``inject`` (next step, no wake), as ``agent.followup``/``steer``/``inject``.

        Raises:
            SessionNotFoundError: no such session. InvalidOptionError: a bad kind or id.
            LimitExceededError: the message is larger than ``MAX_MESSAGE_BYTES``.
        """
        row = self._message_row(session_id, message, kind, message_id, _output)
        await self._check_known(session_id)
        await self._db.run(_sql.send, *row, time.time(), again=True)
        return row[1]

    async def send_many(
        self, messages: Sequence[tuple[str, MessageInput]], *, kind: str = "followup"
    ) -> list[str]:
        """``send`` many ``(session_id, message)`` pairs in one transaction; returns their ids.

        For a bulk load (a simulation prompting thousands of sessions): one commit instead of
        one per message. The messages of one session keep their order in the sequence.

        Raises:
            SessionNotFoundError, InvalidOptionError, LimitExceededError: as ``send`` (nothing
            is sent).
        """
        rows = [self._message_row(sid, message, kind, None, None) for sid, message in messages]
        for sid in dict.fromkeys(sid for sid, _ in messages):
            await self._check_known(sid)
        await self._db.run(_sql.send_many, rows, time.time(), again=True)
        return [mid for _, mid, _, _ in rows]

    def _message_row(
        self,
        session_id: str,
        message: MessageInput,
        kind: str,
        message_id: str | None,
        output: Mapping[str, Any] | None,
    ) -> tuple[str, str, str, str]:
        """``(session_id, message_id, kind, body)`` of one message, checked.

        Raises:
            InvalidOptionError: a bad kind or id. LimitExceededError: the message is too large.
        """
        if kind not in _sql.MESSAGE_KINDS:
            raise InvalidOptionError(f"kind must be one of {_sql.MESSAGE_KINDS}, not {kind!r}")
        mid = message_id if message_id is not None else new_message_id()
        _check_id("message_id", mid)
        _check_id("session_id", session_id)
        record: dict[str, Any] = {"message_id": mid, "content": _content(message)}
        if output is not None:
            record["output"] = dict(output)
        body = json.dumps(record, ensure_ascii=False)
        size = len(body.encode())
        if size > MAX_MESSAGE_BYTES:
            raise LimitExceededError(
                f"message of {size} bytes is over the fleet's {MAX_MESSAGE_BYTES}"
            )
        return session_id, mid, kind, body

    async def run(
        self,
        session_id: str,
        message: MessageInput,
        *,
        timeout: float | None = None,
        output_type: Any = None,
        output_retries: int = 2,
        message_id: str | None = None,
        wait_for_approvals: bool = False,
    ) -> TurnResult:
        """Send ``message`` and return the result of the turn that claims it (as ``agent.run``).

        Raises:
            SessionNotFoundError: no such session. ApprovalPendingError: tool calls of the
            session wait for a decision, so the message would wait behind them; nothing was sent
            (``wait_for_approvals=True`` sends it anyway). trio.TooSlowError: ``timeout`` passed
            (the message was withdrawn). TurnFailedError, TurnBlockedError, TurnAbortedError:
            as ``agent.run``.
        """
        output: tuple[Any, bool] | None = None
        record: dict[str, Any] | None = None
        if output_type is not None:
            schema, wrapped = output_schema(output_type)
            output = (output_type, wrapped)
            record = {"schema": schema, "wrapped": wrapped, "retries": output_retries}
        mid = message_id if message_id is not None else new_message_id()
        follow = Follow(mid, output)
        await self._check_known(session_id)
        stored = await self.stored(session_id)
        for event in stored:
            follow.fold(event)
        if not wait_for_approvals:
            follow.refuse_behind_approvals(session_id)
        deadline = trio.current_time() + timeout if timeout is not None else float("inf")
        await self.send(session_id, message, message_id=mid, _output=record)
        try:
            with trio.fail_at(deadline) if timeout is not None else _forever():
                async for event in self.events(session_id, after_seq=len(stored) - 1):
                    follow.fold(event)
                    if follow.done:
                        break
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(WITHDRAW_GRACE):
                await self._command(
                    session_id, "withdraw", {"message_id": mid, "turn": follow.turn}
                )
            raise
        return follow.outcome()

    async def stored(self, session_id: str) -> list[Event]:
        """The session's stored events ([] for a session only queued for creation, or unknown)."""
        try:
            reader = await self.store.open(session_id, "read")
        except SessionNotFoundError:
            return []
        try:
            return await reader.read()
        finally:
            await reader.close()

    # --- commands ------------------------------------------------------------------------------

    async def _command(self, session_id: str, kind: str, args: Mapping[str, Any]) -> int:
        """Queue one command; its number.

        Raises:
            LimitExceededError: its arguments (a denial's message) are over ``MAX_MESSAGE_BYTES``.
        """
        body = json.dumps(dict(args), ensure_ascii=False)
        size = len(body.encode())
        if size > MAX_MESSAGE_BYTES:
            raise LimitExceededError(
                f"{kind} of {size} bytes is over the fleet's {MAX_MESSAGE_BYTES}"
            )
        return await self._db.run(
            _sql.command, session_id, kind, body, time.time(), False, again=False
        )

    async def _apply(self, session_id: str, kind: str, args: Mapping[str, Any], wait: bool) -> None:
        await self._check_known(session_id)
        n = await self._command(session_id, kind, args)
        if not wait:
            return
        while True:
            done, error = await self._db.run(_sql.command_outcome, session_id, n, again=True)
            if done is not None:
                if error:
                    raise FleetCommandError(f"{kind} on session {session_id!r}: {error}")
                return
            await trio.sleep(POLL_INTERVAL)

    async def cancel(self, session_id: str, *, keep_inbox: bool = False, wait: bool = True) -> None:
        """Abort the session's running turn (clearing its inbox unless ``keep_inbox``).

        Raises:
            SessionNotFoundError: no such session. FleetCommandError: the worker's error.
        """
        await self._apply(session_id, "cancel", {"keep_inbox": bool(keep_inbox)}, wait)

    async def approve(
        self, session_id: str, call_id: str, *, always: bool = False, wait: bool = True
    ) -> None:
        """Approve a tool call waiting for a decision (as ``agent.approve``).

        Raises:
            SessionNotFoundError: no such session. FleetCommandError: no such call waits, or
            another error of the worker's.
        """
        _check_id("call_id", call_id)
        await self._apply(session_id, "approve", {"call_id": call_id, "always": always}, wait)

    async def deny(
        self, session_id: str, call_id: str, message: str | None = None, *, wait: bool = True
    ) -> None:
        """Deny a tool call waiting for a decision (as ``agent.deny``).

        Raises:
            SessionNotFoundError: no such session. FleetCommandError: the worker's error.
        """
        _check_id("call_id", call_id)
        await self._apply(session_id, "deny", {"call_id": call_id, "message": message}, wait)

    async def create_many(self, options: Sequence[AgentOptions]) -> list[str]:
        """``create`` many sessions (fresh ids) in one transaction; returns their ids."""
        rows = []
        for each in options:
            each.validate()
            sid = f"{each.id}-session-{uuid.uuid4().hex}"
            rows.append((sid, _create_body(each)))
        await self._db.run(_sql.create_many, rows, time.time())
        self._known.update(sid for sid, _ in rows[: max(0, 100_000 - len(self._known))])
        return [sid for sid, _ in rows]

    async def create(self, options: AgentOptions, *, session_id: str | None = None) -> str:
        """Queue a new session for the fleet to create and run; returns its id.

        Raises:
            InvalidOptionError: bad options. SessionAlreadyExistsError: the id is taken.
        """
        options.validate()
        sid = session_id or f"{options.id}-session-{uuid.uuid4().hex}"
        _check_id("session_id", sid)
        if await self.store.stat(sid) is not None:
            raise SessionAlreadyExistsError(f"session {sid!r} already exists")
        body = _create_body(options)
        try:
            await self._db.run(_sql.command, sid, "create", body, time.time(), True)
        except _sql.Taken:
            raise SessionAlreadyExistsError(f"session {sid!r} already exists") from None
        self._known.add(sid)
        return sid

    # --- reading -------------------------------------------------------------------------------

    def events(
        self, session_id: str, *, after_seq: int = -1, poll_interval: float = POLL_INTERVAL
    ) -> EventTail:
        """Committed events of the session after ``after_seq``, then new ones as they commit.

        An async iterator that ends only when the caller stops (``break``, or ``async with``
        around it). A session the fleet has queued but not created yet yields nothing until its
        worker creates it. Iterating raises ``SessionNotFoundError`` for an unknown session.
        """
        return EventTail(self, session_id, after_seq + 1, poll_interval)

    async def owner(self, session_id: str) -> str | None:
        """The live worker that holds ``session_id`` now, or None (nobody, or a gone worker)."""
        _check_id("session_id", session_id)
        found = await self._db.run(_sql.assigned_worker, session_id, again=True)
        if found is None or time.time() - found[1] >= self.lease:
            return None
        return found[0]

    async def owners(self, session_ids: Sequence[str]) -> dict[str, str]:
        """``owner`` of many sessions in one read: session id → live worker (held ones only)."""
        for sid in session_ids:
            _check_id("session_id", sid)
        found = await self._db.run(_sql.assigned_workers, list(session_ids), again=True)
        now = time.time()
        return {sid: w for sid, (w, beat) in found.items() if now - beat < self.lease}

    async def status(self) -> FleetStatus:
        """Live workers, sessions waiting and the age of the oldest undelivered message."""
        rows = await self._db.run(_sql.workers, again=True)
        sessions, undelivered, oldest = await self._db.run(_sql.waiting, again=True)
        now = time.time()
        workers = tuple(
            WorkerStatus(
                worker_id=r.worker_id,
                host=r.host,
                pid=r.pid,
                started_at=r.started_at,
                last_heartbeat=r.heartbeat_at,
                live_agents=r.live_agents,
                max_agents=r.max_agents,
                state=r.state,
                alive=now - r.heartbeat_at < self.lease,
            )
            for r in rows
        )
        age = None if oldest is None else max(0.0, now - oldest)
        return FleetStatus(workers, sessions, undelivered, age)


@final
class EventTail:
    """``client.events(...)``: a session's log as it grows (see ``FleetClient.events``).

    Holds no resource between reads (a store's read handle is a name for its connections), so
    dropping it unfinished leaks nothing; ``async with`` is there for symmetry.
    """

    def __init__(self, client: FleetClient, session_id: str, offset: int, poll: float) -> None:
        self._client = client
        self._sid = session_id
        self._offset = max(0, offset)
        self._poll = poll
        self._reader: ReadHandle | None = None
        self._batch: deque[Event] = deque()

    def __aiter__(self) -> EventTail:
        return self

    async def __aenter__(self) -> EventTail:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._reader = None

    async def __anext__(self) -> Event:
        while not self._batch:
            if self._reader is None:
                await self._client._check_known(self._sid)
                try:
                    self._reader = await self._client.store.open(self._sid, "read")
                except SessionNotFoundError:  # queued for creation: not in the store yet
                    await trio.sleep(self._poll)
                    continue
            self._batch.extend(await self._reader.read(self._offset))
            self._offset += len(self._batch)
            if not self._batch:
                await trio.sleep(self._poll)
        return self._batch.popleft()


class _forever:
    """A no-op context manager (no ``timeout``)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@asynccontextmanager
async def open_client(
    store: SessionStore | str, *, lease: float | None = None
) -> AsyncIterator[FleetClient]:
    """A fleet client on ``store`` (a store object, or a URL: the client then owns the store).

    Raises:
        ConfigError: the store cannot carry a fleet (only SQLite and PostgreSQL can).
        StoreUrlError: a bad URL.
    """
    owned: SessionStore | None = None
    if isinstance(store, str):
        from ..stores import store_from_url

        store = owned = store_from_url(store)
    client = FleetClient(store, lease=lease)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
            if owned is not None:
                await owned.aclose()
