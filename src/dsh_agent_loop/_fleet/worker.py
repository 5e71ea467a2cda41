"""``Worker``: the part of a fleet runtime that claims sessions and delivers their messages.

See docs/design.md#fleet-workers. A session is a virtual actor: addressed by its id, activated
(``rt.agents.resume``, crash repair included, or ``create`` for a ``create`` command) on the
worker that claims it, unloaded when idle. The worker's task loops:

1. **Claim** sessions that have work (undelivered messages, undone commands) and no live worker,
   or whose worker's heartbeat is older than the lease (a takeover), up to ``max_agents`` live
   agents; the claim is a row update (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), and writing
   still needs the store's ownership: a session another process still owns is given back and
   tried again later.
2. **Activate** each claimed session. The log is the record of delivery: every message whose id
   a splice of the log already inserted (a worker that died between its flush and its
   bookkeeping) is marked delivered and never inserted again.
3. **Deliver**, per live session in the session's order, each message (``followup``, ``steer``
   or ``inject`` with the client's message id) and command; then ``flush`` (the durability
   barrier) and only then mark them delivered. A command is a barrier of its own: what precedes
   it is flushed and marked first, then it is applied, flushed and marked, so a command applied
   again after a crash never reaches a message sent after it.
4. **Unload** agents idle for ``idle_unload_s`` (dispose: the lease is released) and give their
   sessions back.

A heartbeat task renews this worker's row every third of the lease and compares the sessions
assigned to it with its live agents: one taken over by another worker (this process was paused
past its lease) is dropped and logged; its writes fail on the stale epoch anyway.

``stop()`` drains: no more claims or deliveries, running turns get ``drain_timeout_s`` to finish,
then every agent is disposed (a turn still running ends ``aborted {cause: disposed}``), and the
worker's sessions and row are given back. Lines for activations, takeovers, unloads, drops and
the drain go to the ``dsh_agent_loop.fleet`` logger.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterable
from typing import Any, Final, final

import trio

from .._agent.agent import actor_of
from .._agent.handle import QuietTeardown
from .._agent.lifecycle import AgentHandle, Agents
from .._agent.options import AgentOptions
from .._agent.output import OutputRegistry, SchemaOutput
from .._agent.remember import remembered_options
from .._errors import (
    AgentAlreadyExistsError,
    AgentClosedError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    StoreError,
)
from .._session.store import SessionStore
from ..events import INBOX_SPLICED
from . import sql as _sql
from .client import SQLITE_LEASE, FleetClient
from .options import FleetOptions

__all__ = ["Worker"]

log = logging.getLogger("dsh_agent_loop.fleet")

#: Most undelivered items one round reads.
ROUND_ITEMS: Final = 5_000
#: Activations running at once.
ACTIVATIONS: Final = 32
#: Seconds a session whose activation failed waits before a worker tries it again.
RETRY_BUSY: Final = 1.0
RETRY_BROKEN: Final = 30.0


@final
class _Live:
    """One live agent of this worker."""

    __slots__ = ("fed_upto", "feeding", "handle", "last_active", "logged")

    def __init__(self, handle: AgentHandle, now: float, logged: set[str]) -> None:
        self.handle = handle
        self.last_active = now
        self.logged = logged
        """Ids of the messages the session's log holds (never inserted again)."""
        self.fed_upto = 0
        """The highest item number fed (items come in order; a later read may repeat some)."""
        self.feeding = trio.Lock()
        """Held while items are fed: one feed at a time per session, in order."""


def _default_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@final
class Worker:
    """Claims, activates, feeds and unloads sessions (see the module docstring)."""

    def __init__(
        self, agents: Agents, store: SessionStore, options: FleetOptions, client: FleetClient
    ) -> None:
        options.validate()
        self.options = options
        self.id = options.worker_id or _default_id()
        self._agents = agents
        self._store = store
        self._db = client.db
        self.lease = options.lease_s or self._db.store_lease or SQLITE_LEASE
        self._live: dict[str, _Live] = {}
        self._activating: set[str] = set()
        self._unsettled: list[tuple[str, int]] = []
        """Messages inserted and flushed, not yet marked delivered."""
        self._done: list[tuple[str, int, str | None]] = []
        """Commands applied (``create`` by its activation), not yet marked done."""
        self._stopping = False
        self._stopped = trio.Event()
        self._limiter = trio.CapacityLimiter(ACTIVATIONS)
        self._cancel: trio.CancelScope | None = None
        self._stranded: set[str] = set()
        """Sessions dropped after a store failure, still assigned here: activated again."""
        self._retry_at: dict[str, float] = {}
        """Sessions of this worker whose activation failed: not tried again before then."""
        self._swept = -math.inf
        """When ``_unload_idle`` last looked at every live agent (it runs at most once a second)."""
        self._poke = trio.Event()
        """Set when an activation finished: its session's items wait for the next round."""
        self.activations = self.takeovers = self.unloads = self.delivered = 0

    @property
    def live_agents(self) -> int:
        """Agents live on this worker."""
        return len(self._live)

    def _row(self) -> _sql.WorkerRow:
        now = time.time()
        return _sql.WorkerRow(
            self.id,
            socket.gethostname(),
            os.getpid(),
            now,
            now,
            0,
            self.options.max_agents,
            "running",
        )

    # --- the task ------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then claim and deliver until ``stop()``."""
        await self._db.run(_sql.register, self._row(), again=True)
        log.info(
            "worker %s started (lease %.1fs, max %d agents)",
            self.id,
            self.lease,
            self.options.max_agents,
        )
        with trio.CancelScope() as scope:
            self._cancel = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeats)
                if self._db.dialect == "postgresql":
                    nursery.start_soon(self._notifications)
                await self._recover(nursery)
                task_status.started()
                poll = self.options.poll_interval_s
                wait = poll if self._db.dialect == "sqlite" else poll * 20
                while not self._stopping:
                    try:
                        await self._round(nursery)
                    except StoreError as exc:
                        log.warning("worker %s: store error, retrying: %s", self.id, exc)
                    except Exception:  # a bug must not take every agent of the worker down
                        log.exception("worker %s: round failed; going on", self.id)
                    await self._sleep(wait)
                nursery.cancel_scope.cancel()

    async def _sleep(self, wait: float) -> None:
        """Wait for a wake-up (a notification, an activation that finished) or ``wait``."""
        with trio.move_on_after(wait):
            await self._poke.wait()
        self._poke = trio.Event()

    async def _notifications(self) -> None:
        """Turn the database's notifications into wake-ups (PostgreSQL)."""
        while True:
            if await self._db.notified():
                self._poke.set()

    async def _recover(self, nursery: trio.Nursery) -> None:
        """Resume the sessions a former worker of this id left assigned to it (it crashed)."""
        mine = await self._db.run(_sql.heartbeat, self.id, time.time(), 0, "running", again=True)
        keep = sorted(mine)[: self.options.max_agents]
        for sid in keep:
            self._start(nursery, sid, self.id)
        await self._db.run(_sql.release, self.id, sorted(mine)[len(keep) :], again=True)
        if keep:
            log.info("worker %s: resuming %d sessions it held before", self.id, len(keep))

    async def _round(self, nursery: trio.Nursery) -> None:
        now = time.time()
        room = self.options.max_agents - len(self._live) - len(self._activating)
        if room > 0 and (
            self._db.dialect == "postgresql"
            or await self._db.run(_sql.has_candidates, self.id, now, self.lease, again=True)
        ):
            claimed = await self._db.run(_sql.claim, self.id, now, self.lease, room)
            if claimed:  # one read for every claimed session's work
                work = await self._db.run(_sql.work_of_many, [sid for sid, _ in claimed])
                for sid, previous in claimed:
                    self._start(nursery, sid, previous, work.get(sid, []))
        self._restart_stranded(nursery)
        await self._deliver(nursery)
        sweep = min(1.0, self.options.idle_unload_s / 4)
        if trio.current_time() - self._swept >= sweep:
            self._swept = trio.current_time()
            await self._unload_idle()

    # --- activation ----------------------------------------------------------------------------

    async def _activate(
        self, sid: str, previous: str | None, items: list[_sql.Item] | None
    ) -> None:
        try:
            async with self._limiter:
                if items is None:
                    items = await self._db.run(_sql.work_of, sid, again=True)
                await self._open(sid, previous, items)
        except StoreError as exc:  # the claim stays ours: the next round's work retries it
            log.warning("activating %s: store error: %s", sid, exc)
        finally:
            self._activating.discard(sid)

    async def _open(self, sid: str, previous: str | None, items: list[_sql.Item]) -> None:
        create = next((i for i in items if i.kind == "create"), None)
        try:
            agents = self._agents.apart()  # sessions of one agent id may be live together
            if create is not None:
                options = _options_of(create.body)
                try:  # new as a rule: one store trip, not a failed open and then a create
                    handle = await agents.create(sid, options)
                except SessionAlreadyExistsError:  # created before a crash: resume it
                    handle = await agents.resume(sid, options)
            else:
                handle = await agents.resume(sid)
        except (SessionAlreadyOwnedError, AgentAlreadyExistsError) as exc:
            await self._give_back(sid, previous, RETRY_BUSY, f"busy: {exc}")
            return
        except Exception as exc:  # a broken session must not stop the others
            await self._give_back(sid, previous, RETRY_BROKEN, f"cannot activate: {exc!r}")
            done = [
                (i.session_id, i.n, f"{type(exc).__name__}: {exc}")
                for i in items
                if not i.is_message
            ]
            if done:
                await self._db.run(_sql.settle, (), done, time.time(), again=True)
            return
        if self._stopping:
            await _dispose(handle)
            await self._db.run(_sql.release, self.id, (sid,), again=True)
            return
        # the log is the record: messages a splice already inserted are delivered
        logged = _inserted_ids(handle)
        self._live[sid] = _Live(handle, trio.current_time(), logged)
        self.activations += 1
        self._poke.set()
        if previous is not None and previous != self.id:
            self.takeovers += 1
            log.info(
                "took over %s from %s (repaired, %d events)",
                sid,
                previous,
                len(handle.agent.session),
            )
        else:
            log.info("activated %s", sid)
        await self._feed(sid, items)  # what it was activated for, at once

    async def _give_back(self, sid: str, previous: str | None, wait: float, why: str) -> None:
        log.info("could not activate %s (%s); retrying in %.0fs", sid, why, wait)
        self._retry_at[sid] = trio.current_time() + wait
        if len(self._retry_at) > 10_000:  # forget the past ones
            now = trio.current_time()
            self._retry_at = {k: t for k, t in self._retry_at.items() if t > now}
        await self._db.run(_sql.unclaim, self.id, sid, previous, time.time() + wait, again=True)

    # --- delivery ------------------------------------------------------------------------------

    def _restart_stranded(self, nursery: trio.Nursery) -> None:
        """Activate again the dropped sessions whose pause is over (room permitting)."""
        if not self._stranded:
            return
        now = trio.current_time()
        room = self.options.max_agents - len(self._live) - len(self._activating)
        for sid in sorted(self._stranded):
            if room <= 0:
                break
            if self._retry_at.get(sid, 0) <= now and sid not in self._activating:
                self._stranded.discard(sid)
                room -= 1
                self._start(nursery, sid, self.id)

    def _start(
        self,
        nursery: trio.Nursery,
        sid: str,
        previous: str | None,
        items: list[_sql.Item] | None = None,
    ) -> None:
        self._activating.add(sid)
        nursery.start_soon(self._activate, sid, previous, items)

    async def _deliver(self, nursery: trio.Nursery) -> None:
        items = await self._db.run(_sql.work, self.id, ROUND_ITEMS, again=True)
        by_session: dict[str, list[_sql.Item]] = {}
        room = self.options.max_agents - len(self._live) - len(self._activating)
        now = trio.current_time()
        for item in items:
            sid = item.session_id
            if sid in self._live:
                by_session.setdefault(sid, []).append(item)
            elif sid not in self._activating and room > 0 and self._retry_at.get(sid, 0) <= now:
                room -= 1  # ours, not live: an activation that failed on a store error
                self._start(nursery, sid, self.id)
        async with trio.open_nursery() as nursery:
            for sid, queue in by_session.items():
                nursery.start_soon(self._feed, sid, queue)
        await self._settle()

    async def _settle(self, done: Iterable[tuple[str, int, str | None]] = ()) -> None:
        delivered, self._unsettled = self._unsettled, []
        done = [*self._done, *done]
        self._done = []
        if delivered or done:
            try:
                await self._db.run(_sql.settle, delivered, done, time.time(), again=True)
            except BaseException:
                self._unsettled.extend(delivered)
                self._done.extend(done)
                raise
            self.delivered += len(delivered)

    async def _feed(self, sid: str, queue: list[_sql.Item]) -> None:
        live = self._live.get(sid)
        if live is None:
            return
        async with live.feeding:
            await self._feed_locked(sid, live, [i for i in queue if i.n > live.fed_upto])

    async def _feed_locked(self, sid: str, live: _Live, queue: list[_sql.Item]) -> None:
        agent = live.handle.agent
        fed: list[tuple[str, int]] = []
        live.last_active = trio.current_time()
        try:
            for item in queue:
                live.fed_upto = item.n
                if item.is_message:
                    mid = item.body["message_id"]
                    if mid not in live.logged:
                        _put(agent, item)
                        live.logged.add(mid)
                    fed.append((sid, item.n))
                    continue
                if item.kind == "create":  # applied by the activation: only its mark is left
                    self._done.append((sid, item.n, None))
                    continue
                await agent.flush()  # a command is a barrier: what precedes it first
                self._unsettled.extend(fed)
                fed = []
                error = _apply(agent, item)
                await agent.flush()
                await self._settle([(sid, item.n, error)])
            await agent.flush()
            self._unsettled.extend(fed)
        except (AgentClosedError, StoreError) as exc:
            await self._drop(sid, f"its session failed: {exc}")

    async def _drop(self, sid: str, why: str, *, taken: bool = False) -> None:
        """Forget a live session; unless another worker ``taken`` it, activate it again later.

        A session whose store failed (a lease lost under load, a connection gone) stays assigned
        to this worker; it is resumed again (crash repair) after ``RETRY_BUSY`` — or, if another
        worker holds it by then, the activation finds that and gives it up.
        """
        live = self._live.pop(sid, None)
        if live is None:
            return
        log.warning("dropped %s: %s", sid, why)
        await _dispose(live.handle)
        if not taken:
            self._retry_at[sid] = trio.current_time() + RETRY_BUSY
            self._stranded.add(sid)

    # --- unloading -----------------------------------------------------------------------------

    async def _unload_idle(self) -> None:
        now = trio.current_time()
        idle_after = self.options.idle_unload_s
        gone: list[str] = []
        for sid, live in list(self._live.items()):
            actor = actor_of(live.handle.agent)
            if actor.closed:
                await self._drop(sid, "its agent closed (its session failed)")
                continue
            if actor.status_now != "idle" or actor.has_work():
                live.last_active = now
            elif now - live.last_active >= idle_after:
                gone.append(sid)
        handles = [self._live.pop(sid).handle for sid in gone]
        await _dispose_many(handles)  # one batch: shared waits, no task per agent
        for sid in gone:
            self.unloads += 1
            log.info("unloaded %s (idle %.0fs)", sid, idle_after)
        if gone:
            await self._settle()  # marks first: a released session must not look undone
            await self._db.run(_sql.release, self.id, gone, again=True)

    # --- heartbeats and fencing ----------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(self.lease / 3)
            state = "draining" if self._stopping else "running"
            before = set(self._live)  # activated later: not in this heartbeat's answer
            try:
                mine = await self._db.run(
                    _sql.heartbeat, self.id, time.time(), len(self._live), state, again=True
                )
            except StoreError as exc:
                log.warning("worker %s: heartbeat failed: %s", self.id, exc)
                continue
            for sid in [s for s in before if s in self._live and s not in mine]:
                await self._drop(
                    sid,
                    "another worker took it over (this one was paused past"
                    " its lease); its stale writes are fenced",
                    taken=True,
                )

    # --- stopping ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Drain (see the module docstring); shielded and bounded by the drain timeout."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        with trio.CancelScope(shield=True):
            try:
                log.info("worker %s draining (%d live agents)", self.id, len(self._live))
                with trio.move_on_after(self.options.drain_timeout_s):
                    while any(_busy(live) for live in self._live.values()):
                        await trio.sleep(0.05)
                live, self._live = self._live, {}
                async with trio.open_nursery() as nursery:
                    for entry in live.values():
                        nursery.start_soon(_dispose, entry.handle)
                with trio.move_on_after(10):
                    await self._settle()
                    await self._db.run(_sql.unregister, self.id, again=True)
                log.info("worker %s stopped", self.id)
            finally:
                if self._cancel is not None:
                    self._cancel.cancel()
                self._stopped.set()


def _busy(live: _Live) -> bool:
    actor = actor_of(live.handle.agent)
    return not actor.closed and (actor.status_now != "idle" or actor.has_work())


async def _dispose(handle: AgentHandle) -> None:
    try:
        await handle.dispose()
    except Exception as exc:  # a fenced session cannot store its closers: logged, not raised
        log.warning("disposing %s: %s", handle.session_id, exc)


async def _dispose_many(handles: list[AgentHandle]) -> None:
    """Dispose idle agents in one ``QuietTeardown``; any other one on its own."""
    if not handles:
        return
    batch = QuietTeardown.begin(handles)
    try:
        await batch.finish()
    except Exception as exc:  # logged, as ``_dispose`` does: the others are gone all the same
        log.warning("unloading %d agents: %r", len(handles), exc)
    for handle in handles:
        if not batch.holds(handle):
            await _dispose(handle)


def _options_of(record: Any) -> AgentOptions:
    """The options a ``create`` command carries (the header record a resume reads)."""
    header = {"agent_id": record["agent_id"], "options": record.get("options") or {}}
    if record.get("cwd") is not None:
        header["cwd"] = record["cwd"]
    return remembered_options(header, (), None)


def _inserted_ids(handle: AgentHandle) -> set[str]:
    """Ids of every message a splice of the session's log inserted."""
    ids: set[str] = set()
    for event in handle.agent.session.events:
        if event.type == INBOX_SPLICED:
            for message in event.data.get("inserted", ()):
                mid = message.get("id")
                if isinstance(mid, str):
                    ids.add(mid)
    return ids


def _put(agent: Any, item: _sql.Item) -> None:
    """Insert one message into the agent's inbox (a duplicate id pending: already there).

    A message no inbox can take (content of a shape a message cannot have, a structured-output
    schema that does not compile) is logged and counted delivered: retrying it could only fail
    again and hold up every message behind it.
    """
    body = item.body
    mid, content = body["message_id"], body["content"]
    output = body.get("output")
    actor = actor_of(agent)
    if output is not None and item.kind == "followup":
        if actor.outputs is None:
            actor.outputs = OutputRegistry()
        schema = SchemaOutput(output["schema"], bool(output["wrapped"]))
        try:
            actor.outputs.expect(mid, schema, int(output.get("retries", 2)))
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("message %s: its output schema is unusable (%r)", mid, exc)
            return
    try:
        if item.kind == "followup":
            agent.followup(content, message_id=mid)
        elif item.kind == "steer":
            agent.steer(content, message_id=mid)
        else:
            agent.inject(content, message_id=mid)
    except ValueError as exc:
        if not agent.inbox.find(mid):
            log.warning("message %s of %s cannot be inserted: %s", mid, item.session_id, exc)
    except (AgentClosedError, StoreError):
        raise
    except Exception as exc:
        log.warning("message %s of %s cannot be inserted: %r", mid, item.session_id, exc)


def _apply(agent: Any, item: _sql.Item) -> str | None:
    """Apply one command; return the error it met (text), or None."""
    body = item.body
    try:
        if item.kind == "cancel":
            agent.cancel(keep_inbox=bool(body.get("keep_inbox")))
        elif item.kind == "approve":
            agent.approve(body["call_id"], always=bool(body.get("always")))
        elif item.kind == "deny":
            agent.deny(body["call_id"], body.get("message"))
        elif item.kind == "withdraw":
            turn = body.get("turn")
            if not agent.inbox.remove(body["message_id"]) and turn is not None:
                actor_of(agent).abort_turn(int(turn))
        # ``create`` was applied by the activation
    except (AgentClosedError, StoreError):
        raise
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
