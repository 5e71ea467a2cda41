"""Create, resume and fork agents (docs/design.md#lifecycle), and the runtime's agent registry.

Create is one rollback-protected transaction: take write ownership (``store.create``), build the
session, agent and scope, append the seed and ``session/end-seed``, await ``setup``, emit
``session/created`` (a raising listener vetoes), hand the unstored suffix to the write handle,
enter the registries, emit ``agent/created`` — publication — then ``agent/session-start``, and
start the writer and the driver. Before publication nothing is flushed; any failure up to it
aborts the handle (unflushed events dropped, ownership released, no trace of a never-flushed
session), so the same id can be retried.

Resume opens the session for write, replays its log, appends the crash-repair closers, and
continues on the same path; options it is not given are the ones the log remembers
(``_agent/remember.py``). A fork starts a new session from a prefix of another's log
(``_agent/subagents.py``). A resumed or forked agent whose inbox holds queued messages (or
decided approvals) starts on them at once. Teardown is ``AgentHandle``'s (``_agent/handle.py``);
an agent created with a parent holds a place of the runtime's sub-agent bounds from its
creation's first step and is listed in the parent's ``children`` from publication, both until
its teardown detaches it (or the creation fails); a parent disposes its children before itself.

Lifecycle notifications (``agent/created``, ``agent/disposed``, ...) go to ``on`` observers that
cannot break what they observe: a raising observer is logged and ignored. The one exception is
``session/created``, whose raising listener vetoes the creation (docs/design.md#create).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, final

import trio

from .._errors import (
    AgentAlreadyExistsError,
    AgentClosedError,
    InvalidOptionError,
    SessionNotFoundError,
)
from .._frozen import FrozenDict, freeze, frozen
from .._hooks import call_observer
from .._session.log import Session
from .._session.repair import repair_events
from .._session.store import FORMAT_VERSION, SessionStore, WriteHandle
from .._session.writer import CommitTimer, SessionWriter
from ..events import (
    AGENT_CREATED,
    AGENT_SESSION_START,
    SESSION_CREATED,
    SESSION_END_SEED,
    Event,
    make_event,
)
from . import approvals
from ._stamps import Stamps, shared_record, uuid4_text
from .agent import Agent, actor_of
from .handle import AgentHandle, QuietTeardown, Teardown
from .options import AgentOptions, check_provider
from .remember import HEADER_OPTIONS, header_options, remembered_options
from .services import AgentScope, Services
from .step_inputs import check_tools
from .subagents import (
    FORKED_FROM,
    PARENT_SESSION_ID,
    SubagentCount,
    fork_closers,
    fork_prefix,
    fork_record,
)

if TYPE_CHECKING:
    from .._hooks import HookBus
    from ._actor import AgentActor

__all__ = ["AgentHandle", "Agents"]

Setup = Callable[[AgentScope, Agent], Awaitable[None]]


#: The name of every agent's task (what trio would derive from ``Agents._run_agent``, given).
_AGENT_TASK = f"{__name__}.Agents._run_agent"

# ``session/end-seed`` payloads, the same objects for every session (frozen: nothing can change)
_SEED_DATA = FrozenDict()
_INHERITED_SEED_DATA = FrozenDict(inherited=True)


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
        # what each handle's teardown needs of this registry (handle.py knows nothing of it)
        self._teardown = Teardown(
            nursery.start_soon, self._detach, self._emit, self._dispose_children
        )
        # The registries are shared with views made by with_initiator().
        self._shared: dict[str, Any] = (
            shared
            if shared is not None
            else {
                "agents": {},
                "sessions": {},
                "reserved": set(),
                "running": set(),
                "records": {},
                "stamps": Stamps(),
                "subagents": SubagentCount(),
            }
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

    @property
    def _subagents(self) -> SubagentCount:
        return self._shared["subagents"]  # type: ignore[no-any-return]

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

    def apart(self) -> Agents:
        """A registry of its own (agent ids are unique per registry) sharing everything else.

        A fleet worker activates each session in one, so sessions of one agent id can be live
        together (docs/design.md#fleet-workers); ``cancel_remaining`` here reaches its agents.
        """
        shared = {**self._shared, "agents": {}, "sessions": {}, "reserved": set()}
        return Agents(
            store=self._store,
            services=self._services,
            hooks=self._hooks,
            nursery=self._nursery,
            shared=shared,
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
            InvalidOptionError: bad options, or a provider nobody registered.
            AgentAlreadyExistsError: the id is live.
            SessionAlreadyExistsError: the session id is taken. Anything ``setup`` or a
            ``session/created`` listener raised (the creation is rolled back).
        """
        if options is None:
            raise TypeError("create() needs options=AgentOptions(id=...)")
        options.validate()
        check_provider(options, self._services.router.names)
        parent = parent_agent or self._initiator
        frozen = self._new_header(session_id, options, parent)
        with self._reserve(options.id):
            handle = await self._store.create(frozen, inherited_events=inherited_events)
            seed_data = _INHERITED_SEED_DATA if inherited_events else _SEED_DATA

            def build() -> tuple[Session, int]:
                session = Session(
                    frozen,
                    clock=self._services.clock,
                    events=inherited_events,
                    records=self._services.records,
                )
                session.add(SESSION_END_SEED, seed_data)
                return session, -1

            return await self._publish(handle, build, options, setup, parent, "create")

    def _new_header(
        self,
        session_id: str | None,
        options: AgentOptions,
        parent: Agent | None,
        forked_from: FrozenDict | None = None,
    ) -> FrozenDict:
        """One frozen header, shared by the store's record and the session."""
        sid = session_id or f"{options.id}-session-{uuid4_text()}"
        header: dict[str, Any] = {
            "session_id": sid,
            "agent_id": options.id,
            "created_at": self._shared["stamps"].now(),
            "format_version": FORMAT_VERSION,
        }
        if options.cwd is not None:
            header["cwd"] = freeze(options.cwd)  # a str (anything else raises, as before)
        remembered = header_options(options)
        if remembered:
            # what a resume without options restores; one shared record per distinct set of
            # options (thousands of simulated agents share theirs)
            header[HEADER_OPTIONS] = self._shared_record(remembered)
        if parent is not None:
            header[PARENT_SESSION_ID] = parent.session_id
        if forked_from is not None:
            header[FORKED_FROM] = forked_from
        return frozen(header)  # every value is an atom or frozen already

    async def fork(
        self,
        session_id: str,
        at_seq: int | None = None,
        options: AgentOptions | None = None,
        setup: Setup | None = None,
        parent_agent: Agent | None = None,
        *,
        new_session_id: str | None = None,
    ) -> AgentHandle:
        """Start an agent on a new session that inherits a prefix of ``session_id``'s log.

        The new session's events are the source's stored events with ``seq < at_seq`` (every
        stored one when None; a live source is read from what it has committed), kept at seqs
        ``0..at_seq-1``, then ``session/end-seed {inherited: true}`` (docs/design.md#forks). A cut
        inside an
        open turn is closed after the seed as crash repair closes it (``_agent/subagents.py``).
        The header records ``forked_from: {session_id, at_seq}`` (``at_seq`` the number of
        inherited events) and, for a sub-agent, ``parent_session_id``. Options not given are
        the ones the source remembers; ``options.id`` may differ from the source's agent id
        (it must, while the source is live).

        Raises:
            SessionNotFoundError: no such session. InvalidOptionError: ``at_seq`` is out of
            range, or a bad option. AgentAlreadyExistsError: the agent id is live.
            SessionAlreadyExistsError: ``new_session_id`` is taken.
        """
        if options is not None:
            options.validate()
        parent = parent_agent or self._initiator
        reader = await self._store.open(session_id, "read")
        try:
            source, stored = reader.header, await reader.read()
        finally:
            with trio.CancelScope(shield=True):
                await reader.close()
        inherited = fork_prefix(stored, at_seq)
        named = source if options is None else {**source, "agent_id": options.id}
        resolved = remembered_options(named, inherited, options)
        frozen = self._new_header(
            new_session_id, resolved, parent, fork_record(session_id, inherited)
        )
        with self._reserve(resolved.id):
            handle = await self._store.create(frozen, inherited_events=inherited)

            def build() -> tuple[Session, int]:
                session = Session(
                    frozen,
                    clock=self._services.clock,
                    events=inherited,
                    records=self._services.records,
                )
                seed = session.add(SESSION_END_SEED, _INHERITED_SEED_DATA)
                closers = fork_closers([*inherited, seed], self._services.clock())
                if closers:
                    session.append(*closers)
                return session, -1

            return await self._publish(handle, build, resolved, setup, parent, "fork")

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
        (``_agent/remember.py``). Each field set in ``options`` overrides the remembered one.

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
            parent = self._resumed_parent(handle.header, parent)
            # Given options reserved their id already; remembered ones learn it from the header.
            reservation: AbstractContextManager[None] = (
                nullcontext() if options is not None else self._reserve(resolved.id)
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await handle.abort()
            raise

        def build() -> tuple[Session, int]:
            session = Session(
                handle.header,
                clock=self._services.clock,
                events=stored,
                records=self._services.records,
            )
            closers = repair_events(stored, self._services.clock())
            if closers:
                session.append(*closers)
            session.add(SESSION_END_SEED, _SEED_DATA)
            return session, len(stored) - 1

        with reservation:
            return await self._publish(handle, build, resolved, setup, parent, "resume")

    def _resumed_parent(self, header: Mapping[str, Any], given: Agent | None) -> Agent | None:
        """The parent a resumed session is linked to: the one its header names, if live.

        Raises:
            InvalidOptionError: ``given`` is not the agent of the session the header names.
        """
        recorded = header.get(PARENT_SESSION_ID)
        if given is None:
            live = self._sessions.get(recorded) if isinstance(recorded, str) else None
            return None if live is None else live.agent
        if given.session_id != recorded:
            was = f"of session {recorded!r}" if recorded else "of no agent"
            raise InvalidOptionError(
                f"session {header.get('session_id')!r} was created as a sub-agent {was}, not of"
                f" agent {given.id!r} (session {given.session_id!r})"
            )
        return given

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
        claimed = False
        try:
            claimed = self._admit(parent)
            session, durable_seq = build()
            agent = Agent(options=options, session=session, services=self._services, parent=parent)
            actor = actor_of(agent)
            check_tools(actor)
            if setup is not None:
                await setup(actor.scope, agent)
            self._emit(
                SESSION_CREATED, {"session_id": session.id, "agent_id": agent.id, "source": source}
            )
            await handle.append(session.take_pending())  # the unstored suffix, not yet flushed
            writer = SessionWriter(
                session,
                handle,
                durable_seq=durable_seq,
                owner=actor,
                timer=self._timer,
            )
            actor.writer = writer
            entered = AgentHandle(actor, writer, self._teardown)
            self._live[agent.id] = entered
            claimed = False  # the registry's entry holds the place now (``_detach`` gives it back)
            self._sessions[session.id] = entered
            if actor.parent is not None:
                actor.parent.children = (*actor.parent.children, actor)
            self._emit(AGENT_CREATED, {"agent_id": agent.id, "session_id": session.id})
        except BaseException:
            with trio.CancelScope(shield=True):
                if entered is not None:
                    self._detach(entered)
                if claimed:
                    self._subagents.release()
                await handle.abort()
            raise
        self._emit(
            AGENT_SESSION_START, {"agent_id": agent.id, "session_id": session.id, "source": source}
        )
        if source != "create" and (actor.inbox.next_turn or approvals.ready(actor)):
            actor.wake()  # queued work (resumed, or inherited by a fork) goes on at once
        # start_soon, not start: the agent is driven by level-triggered flags, so nothing has to
        # wait for its task to be running, and a started-handshake would keep a temporary
        # nursery's cancel status alive per agent (thousands of agents live in one process).
        self._nursery.start_soon(self._run_agent, entered, actor, writer, name=_AGENT_TASK)
        return entered

    def _admit(self, parent: Agent | None) -> bool:
        """Hold a place for a sub-agent of ``parent`` (False: no parent, no place taken).

        Raises:
            AgentClosedError: ``parent`` is disposed. LimitExceededError: a sub-agent bound of
            ``Limits`` is reached (``_agent/subagents.py``).
        """
        if parent is None:
            return False
        if parent.closed:
            raise AgentClosedError(f"agent {parent.id!r} is disposed; it takes no sub-agents")
        self._subagents.claim(actor_of(parent), self._services.limits)
        return True

    async def _run_agent(
        self, handle: AgentHandle, agent: AgentActor[Agent], writer: SessionWriter
    ) -> None:
        """The agent's task: it runs the session writer until the agent is disposed.

        Its nursery holds the agent's driver (while there is work) and the tool workers under it.

        The nursery's scope is shielded, so cancelling the runtime reaches no agent directly:
        the runtime disposes each agent (its turn ends ``aborted {cause: disposed}`` and the
        writer commits it), then cancels the scopes of any agent whose teardown overran.
        """
        async with trio.open_nursery() as nursery:
            scope = nursery.cancel_scope
            scope.shield = True
            running = self._running
            running.add(scope)
            try:
                agent.attach(nursery, handle)
                await writer.run()
            finally:
                agent.detach()
                running.discard(scope)

    def _shared_record(self, record: dict[str, Any]) -> FrozenDict:
        """``record`` frozen, one object per distinct record (``_stamps.shared_record``)."""
        return shared_record(self._shared["records"], record)

    def cancel_remaining(self) -> None:
        """Cancel every agent task still running (runtime shutdown, after every teardown)."""
        for scope in list(self._running):
            scope.cancel()

    def _detach(self, handle: AgentHandle) -> None:
        agent = actor_of(handle.agent)
        if self._live.get(agent.id) is handle:
            del self._live[agent.id]
            if agent.parent is not None:
                self._subagents.release()
        if self._sessions.get(agent.session_id) is handle:
            del self._sessions[agent.session_id]
        parent = agent.parent
        if parent is not None and agent in parent.children:
            parent.children = tuple(c for c in parent.children if c is not agent)

    async def _dispose_children(self, parent: AgentActor[Agent]) -> None:
        """Dispose ``parent``'s live children concurrently (each disposes its own first)."""
        sessions = self._sessions
        children = [
            handle
            for child in tuple(parent.children)
            if (handle := sessions.get(child.session_id)) is not None
            and handle.agent is child.facade
        ]
        if not children:
            return
        async with trio.open_nursery() as nursery:
            for child in children:
                nursery.start_soon(child.dispose)

    async def dispose_all(self) -> None:
        """Dispose every live agent concurrently (runtime shutdown).

        Agents with nothing running (``AgentHandle.quiet``: idle, no sub-agents) are torn down
        in one batch (``QuietTeardown``); each other agent in a task of its own, its sub-agents
        first, as ``dispose()`` does.
        """
        handles = list(self._live.values())
        if not handles:
            return
        async with trio.open_nursery() as nursery:
            # begun before any teardown task runs: no agent changes between choosing and stopping
            quiet = QuietTeardown.begin(handles)
            for handle in handles:
                if not quiet.holds(handle):
                    nursery.start_soon(handle.dispose)
            nursery.start_soon(quiet.finish)


class _Reservation:
    def __init__(self, reserved: set[str], agent_id: str) -> None:
        self._reserved = reserved
        self._id = agent_id

    def __enter__(self) -> None:
        self._reserved.add(self._id)

    def __exit__(self, *exc: object) -> None:
        self._reserved.discard(self._id)
