"""Create, resume and teardown of agents (SPEC §13), and the runtime's agent registry.

Create is one rollback-protected transaction: take write ownership (``store.create``), build the
session, agent and scope, append the seed and ``session/end-seed``, await ``setup``, emit
``session/created`` (a raising listener vetoes), hand the unstored suffix to the write handle,
enter the registries, emit ``agent/created`` — publication — then ``agent/session-start``, and
start the writer and the driver. Before publication nothing is flushed; any failure up to it
aborts the handle (unflushed events dropped, ownership released, no trace of a never-flushed
session), so the same id can be retried.

Resume opens the session for write, replays its log, appends the crash-repair closers, and
continues on the same path; options it is not given are the ones the log remembers
(``agent/remember.py``). Teardown is memoised and exact: cancel (``disposed``), wait for the
driver, close the scope, close the writer and its handle, then detach the agent and the session
— each detach bound to the exact entry that was entered, so a stale disposer cannot remove a
newer agent with the same id. Closing the writer is bounded (``WRITER_CLOSE_TIMEOUT``), so a hung
store cannot hang a teardown. A teardown asked for from inside the agent's own task tree (its
tool or hook) cannot wait for the driver that waits for it: it runs in a task of the runtime's
nursery instead (see ``AgentHandle.dispose``).

Lifecycle notifications (``agent/created``, ``agent/disposed``, ...) go to ``on`` observers that
cannot break what they observe: a raising observer is logged and ignored. The one exception is
``session/created``, whose raising listener vetoes the creation (SPEC §13).
"""

from __future__ import annotations

import builtins
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, final

import trio

from .._frozen import FrozenDict, freeze
from ..errors import AgentAlreadyExistsError, SessionNotFoundError, StoreError
from ..events import (
    AGENT_CREATED,
    AGENT_DISPOSED,
    AGENT_SESSION_START,
    SESSION_CREATED,
    SESSION_DISPOSED,
    SESSION_END_SEED,
    Event,
    make_event,
)
from ..hooks import call_observer
from ..session.log import Session
from ..session.repair import repair_events
from ..session.store import FORMAT_VERSION, SessionStore, WriteHandle
from ..session.writer import CLOSE_TIMEOUT, CommitTimer, SessionWriter
from . import approvals
from .driver import Agent, AgentScope, Services
from .options import AgentOptions
from .remember import HEADER_OPTIONS, header_options, remembered_options

if TYPE_CHECKING:
    from ..hooks import HookBus

__all__ = ["AgentHandle", "Agents"]

Setup = Callable[[AgentScope, Agent], Awaitable[None]]

#: Seconds a teardown waits for the session writer to commit what is left and close its handle
#: (the writer bounds its final commit by ``CLOSE_TIMEOUT``; a commit in flight may precede it).
WRITER_CLOSE_TIMEOUT = 2 * CLOSE_TIMEOUT
_SHARED_RECORDS = 256  # distinct header option records kept for sharing

_log = logging.getLogger("dsh_agent_loop.lifecycle")


@final
class AgentHandle:
    """Owns one live agent; ``dispose()`` tears it down exactly once.

    It is an async context manager: ``async with handle:`` (or ``async with await
    rt.agents.create(...) as handle:``) disposes the agent when the block ends, however it ends.
    """

    __slots__ = (
        "_agents",
        "_done",
        "_error",
        "_writer",
        "agent",
    )

    def __init__(self, agents: Agents, agent: Agent, writer: SessionWriter) -> None:
        self.agent = agent
        self._agents = agents
        self._writer = writer
        self._done: trio.Event | None = None
        self._error: BaseException | None = None

    @property
    def session_id(self) -> str:
        """The agent's session id."""
        return self.agent.session_id

    async def __aenter__(self) -> AgentHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Dispose the agent (shielded, like ``dispose()``), on an exception or cancel too."""
        await self.dispose()

    async def dispose(self) -> None:
        """Tear the agent down (idempotent; concurrent callers wait for the first).

        The teardown is shielded: a caller cancelled while it waits still leaves the agent fully
        torn down. From the moment it starts the agent takes no messages (``AgentClosedError``).

        Called from inside the agent's own task tree — one of its tools, one of its hooks, or a
        task they started — the teardown cannot be awaited there: it waits for the driver, which
        waits for that very caller. ``dispose`` then aborts the running turn (``aborted {cause:
        disposed}``), starts the teardown in a task of the runtime's nursery and returns through a
        checkpoint; as the caller runs inside the cancelled turn, that checkpoint normally raises
        ``trio.Cancelled`` (a tool then ends ``ABORTED``; let it propagate). A teardown failure is
        then logged and raised to later ``dispose()`` callers. The agent leaves ``rt.agents`` when
        the teardown completes, shortly after the turn has ended.

        Raises:
            BaseExceptionGroup: several teardown steps failed (each is in the group).
        """
        if self.agent.in_driver_tree():
            self.agent.begin_stop("disposed")
            if self._done is None:
                self._done = trio.Event()
                self._agents._start_detached_teardown(self)
            await trio.lowlevel.checkpoint()
            return
        if self._done is not None:
            await self._done.wait()
            if self._error is not None:
                raise self._error
            return
        self._done = trio.Event()
        await self._run_teardown()

    async def _run_teardown(self) -> None:
        assert self._done is not None
        try:
            with trio.CancelScope(shield=True):
                await self._teardown()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._done.set()

    async def _detached_teardown(self) -> None:
        """The teardown of a ``dispose()`` called from the agent's own task tree."""
        try:
            await self._run_teardown()
        except Exception:  # kept in _error for later dispose() callers; nobody awaits this task
            _log.exception("disposing agent %r failed", self.agent.id)

    async def _teardown(self) -> None:
        errors: list[Exception] = []
        agent = self.agent
        for step in (self._stop_driver, self._close_scope, self._close_writer):
            try:
                await step()
            except Exception as exc:
                errors.append(exc)
        self._agents._detach(self)
        self._agents._emit(SESSION_DISPOSED, {"session_id": agent.session_id, "agent_id": agent.id})
        self._agents._emit(AGENT_DISPOSED, {"agent_id": agent.id, "session_id": agent.session_id})
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup(f"disposing agent {agent.id!r} failed", errors)

    async def _stop_driver(self) -> None:
        await self.agent.stop("disposed")

    async def _close_scope(self) -> None:
        self.agent.scope.close()

    async def _close_writer(self) -> None:
        with trio.move_on_after(WRITER_CLOSE_TIMEOUT):
            await self._writer.aclose()
        if not self._writer.stopped:
            # The agent's task lingers until the runtime ends and cancels it (a bounded commit).
            raise StoreError(
                f"the session writer of agent {self.agent.id!r} did not close within"
                f" {WRITER_CLOSE_TIMEOUT:g} s"
            )
        if self._writer.failure is not None and self.agent.store_failure is None:
            raise self._writer.failure


@final
class Agents:
    """``rt.agents``: create, resume, look up and list live agents."""

    def __init__(
        self,
        *,
        store: SessionStore,
        services: Services,
        hooks: HookBus,
        nursery: trio.Nursery,
        initiator: Agent | None = None,
        shared: dict[str, Any] | None = None,
        timer: CommitTimer | None = None,
    ) -> None:
        """Make the registry.

        Args:
            store: Where sessions live.
            services: What the runtime lends its agents.
            hooks: The runtime's hook bus.
            nursery: Runs the agents' tasks (and teardowns asked for from inside an agent).
            initiator: Parent of the agents this view creates by default.
            shared: The registries, shared with the views ``with_initiator`` makes.
            timer: The runtime's group-commit timer.
        """
        self._store = store
        self._services = services
        self._hooks = hooks
        self._nursery = nursery
        self._initiator = initiator
        self._timer = timer
        # The registries are shared with views made by with_initiator().
        self._shared = (
            shared
            if shared is not None
            else {"agents": {}, "sessions": {}, "reserved": set(), "running": set(), "records": {}}
        )

    @property
    def _live(self) -> dict[str, AgentHandle]:
        return self._shared["agents"]  # type: ignore[no-any-return]

    @property
    def _running(self) -> set[trio.CancelScope]:
        return self._shared["running"]  # type: ignore[no-any-return]

    @property
    def _sessions(self) -> dict[str, AgentHandle]:
        return self._shared["sessions"]  # type: ignore[no-any-return]

    def with_initiator(self, agent: Agent) -> Agents:
        """A view whose ``create``/``resume`` make sub-agents of ``agent`` by default."""
        return Agents(
            store=self._store,
            services=self._services,
            hooks=self._hooks,
            nursery=self._nursery,
            initiator=agent,
            shared=self._shared,
            timer=self._timer,
        )

    def get(self, agent_id: str) -> Agent | None:
        """The live agent with this id, or None."""
        handle = self._live.get(agent_id)
        return None if handle is None else handle.agent

    def handle(self, agent_id: str) -> AgentHandle | None:
        """The handle of the live agent with this id, or None."""
        return self._live.get(agent_id)

    def list(self) -> builtins.list[Agent]:
        """Live agents in creation order."""
        return [h.agent for h in self._live.values()]

    def handles(self) -> builtins.list[AgentHandle]:
        """Handles of live agents in creation order."""
        return list(self._live.values())

    def session_count(self) -> int:
        """How many sessions live agents write."""
        return len(self._sessions)

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self._hooks.has("on", name):
            event = make_event(name, None, self._services.clock(), FrozenDict(data))
            if name == SESSION_CREATED:
                for fn in self._hooks.listeners("on", name):
                    fn(event)  # a raising listener vetoes the creation
            else:
                for fn in self._hooks.listeners("on", name):
                    call_observer(fn, name, event)

    # -- create / resume ----------------------------------------------------------------------
    async def create(
        self,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        parent_agent: Agent | None = None,
        *,
        inherited_events: Sequence[Event] = (),
    ) -> AgentHandle:
        """Create an agent on a new session (see the module docstring for the transaction).

        Raises:
            InvalidOptionError: bad options. AgentAlreadyExistsError: the id is live.
            SessionAlreadyExistsError: the session id is taken. Anything ``setup`` or a
            ``session/created`` listener raised (the creation is rolled back).
        """
        if options is None:
            raise TypeError("create() needs options=AgentOptions(id=...)")
        options.validate()
        parent = parent_agent or self._initiator
        sid = session_id or f"{options.id}-session-{uuid.uuid4()}"
        header: dict[str, Any] = {
            "session_id": sid,
            "agent_id": options.id,
            "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "format_version": FORMAT_VERSION,
        }
        if options.cwd is not None:
            header["cwd"] = options.cwd
        remembered = header_options(options)
        if remembered:
            # what a resume without options restores; one shared record per distinct set of
            # options (thousands of simulated agents share theirs)
            header[HEADER_OPTIONS] = self._shared_record(freeze(remembered))
        if parent is not None:
            header["parent_session_id"] = parent.session_id
        frozen = freeze(header)  # one frozen header, shared by the store's record and the session
        with self._reserve(options.id):
            handle = await self._store.create(frozen, inherited_events=inherited_events)
            seed_data = FrozenDict(inherited=True) if inherited_events else FrozenDict()

            def build() -> tuple[Session, int]:
                session = Session(frozen, clock=self._services.clock, events=inherited_events)
                session.add(SESSION_END_SEED, seed_data)
                return session, -1

            return await self._publish(handle, build, options, setup, parent, "create")

    async def resume(
        self,
        session_id: str,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        parent_agent: Agent | None = None,
        *,
        create_if_missing: bool = False,
    ) -> AgentHandle:
        """Resume a stored session (crash repair included); optionally create it if missing.

        Without ``options`` the agent resumes as it last ran: its id, provider, model, reasoning
        effort, max tokens, cwd, persona, tools and turn budget come from the log
        (``agent/remember.py``). Each field set in ``options`` overrides the remembered one.

        Raises:
            SessionNotFoundError: absent and not ``create_if_missing``.
            SessionAlreadyOwnedError: another live writer owns it.
            InvalidOptionError: ``options.id`` is not the session's agent id, or a bad option.
            AgentAlreadyExistsError: the agent id is live.
        """
        if options is not None:
            options.validate()
        elif create_if_missing:
            raise TypeError("resume(create_if_missing=True) needs options=AgentOptions(id=...)")
        parent = parent_agent or self._initiator
        with self._reserve(options.id) if options is not None else nullcontext():
            try:
                handle = await self._store.open(session_id, "write")
            except SessionNotFoundError:
                if not create_if_missing:
                    raise
            else:
                return await self._resume_open(handle, options, setup, parent)
        assert options is not None
        return await self.create(session_id, options, setup, parent)

    async def _resume_open(
        self,
        handle: WriteHandle,
        options: AgentOptions | None,
        setup: Setup | None,
        parent: Agent | None,
    ) -> AgentHandle:
        try:
            stored = await handle.read()
            resolved = remembered_options(handle.header, stored, options)
            # Given options reserved their id already; remembered ones learn it from the header.
            reservation: AbstractContextManager[None] = (
                nullcontext() if options is not None else self._reserve(resolved.id)
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await handle.abort()
            raise

        def build() -> tuple[Session, int]:
            session = Session(handle.header, clock=self._services.clock, events=stored)
            closers = repair_events(stored, self._services.clock())
            if closers:
                session.append(*closers)
            session.add(SESSION_END_SEED, FrozenDict())
            return session, len(stored) - 1

        with reservation:
            return await self._publish(handle, build, resolved, setup, parent, "resume")

    def _reserve(self, agent_id: str) -> _Reservation:
        if agent_id in self._live or agent_id in self._shared["reserved"]:
            raise AgentAlreadyExistsError(f"agent {agent_id!r} already exists")
        return _Reservation(self._shared["reserved"], agent_id)

    async def _publish(
        self,
        handle: WriteHandle,
        build: Callable[[], tuple[Session, int]],
        options: AgentOptions,
        setup: Setup | None,
        parent: Agent | None,
        source: str,
    ) -> AgentHandle:
        entered: AgentHandle | None = None
        try:
            session, durable_seq = build()
            agent = Agent(options=options, session=session, services=self._services, parent=parent)
            _check_tools(agent)
            if setup is not None:
                await setup(agent.scope, agent)
            self._emit(
                SESSION_CREATED, {"session_id": session.id, "agent_id": agent.id, "source": source}
            )
            await handle.append(session.take_pending())  # the unstored suffix, not yet flushed
            writer = SessionWriter(
                session,
                handle,
                durable_seq=durable_seq,
                on_commit=agent.on_commit,
                on_failure=agent.on_store_failure,
                timer=self._timer,
            )
            agent.writer = writer
            entered = AgentHandle(self, agent, writer)
            self._live[agent.id] = entered
            self._sessions[session.id] = entered
            self._emit(AGENT_CREATED, {"agent_id": agent.id, "session_id": session.id})
        except BaseException:
            with trio.CancelScope(shield=True):
                if entered is not None:
                    self._detach(entered)
                await handle.abort()
            raise
        self._emit(
            AGENT_SESSION_START, {"agent_id": agent.id, "session_id": session.id, "source": source}
        )
        if source == "resume" and (agent.inbox.next_turn or approvals.ready(agent)):
            agent._wake()  # queued work survives a crash and goes on: the driver starts at once
        # start_soon, not start: the agent is driven by level-triggered flags, so nothing has to
        # wait for its task to be running, and a started-handshake would keep a temporary
        # nursery's cancel status alive per agent (thousands of agents live in one process).
        self._nursery.start_soon(self._run_agent, entered)
        return entered

    async def _run_agent(self, handle: AgentHandle) -> None:
        """The agent's task: it runs the session writer until the agent is disposed.

        Its nursery holds the agent's driver (while there is work) and the tool workers under it.

        The nursery's scope is shielded, so cancelling the runtime reaches no agent directly:
        the runtime disposes each agent (its turn ends ``aborted {cause: disposed}`` and the
        writer commits it), then cancels the scopes of any agent whose teardown overran.
        """
        agent = handle.agent
        async with trio.open_nursery() as nursery:
            scope = nursery.cancel_scope
            scope.shield = True
            running = self._running
            running.add(scope)
            try:
                agent.attach(nursery, handle.dispose)
                await handle._writer.run()
            finally:
                agent.detach()
                running.discard(scope)

    def _shared_record(self, record: FrozenDict) -> FrozenDict:
        records: dict[FrozenDict, FrozenDict] = self._shared["records"]
        shared = records.get(record)
        if shared is None:
            if len(records) >= _SHARED_RECORDS:
                records.clear()
            shared = records[record] = record
        return shared

    def cancel_remaining(self) -> None:
        """Cancel every agent task still running (runtime shutdown, after every teardown)."""
        for scope in list(self._running):
            scope.cancel()

    def _start_detached_teardown(self, handle: AgentHandle) -> None:
        self._nursery.start_soon(handle._detached_teardown)

    def _detach(self, handle: AgentHandle) -> None:
        agent = handle.agent
        if self._live.get(agent.id) is handle:
            del self._live[agent.id]
        if self._sessions.get(agent.session_id) is handle:
            del self._sessions[agent.session_id]

    async def dispose_all(self) -> None:
        """Dispose every live agent concurrently (runtime shutdown)."""
        handles = list(self._live.values())
        if not handles:
            return
        async with trio.open_nursery() as nursery:
            for handle in handles:
                nursery.start_soon(handle.dispose)


def _check_tools(agent: Agent) -> None:
    names = agent.options.tools
    if names is None:
        return
    runtime = agent.services.tools()
    unknown = [n for n in names if n not in runtime and agent.services.builtin(n) is None]
    if unknown:
        from ..errors import InvalidOptionError

        raise InvalidOptionError(f"unknown tool name(s) in options.tools: {', '.join(unknown)}")


class _Reservation:
    def __init__(self, reserved: set[str], agent_id: str) -> None:
        self._reserved = reserved
        self._id = agent_id

    def __enter__(self) -> None:
        self._reserved.add(self._id)

    def __exit__(self, *exc: object) -> None:
        self._reserved.discard(self._id)
