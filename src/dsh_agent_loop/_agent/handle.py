"""``AgentHandle``: owns one live agent and tears it down exactly once (docs/design.md#teardown).

Teardown is memoised and exact: stop the agent taking work and cancel its running turn
(``disposed``; its sub-agents' running turns abort with cause ``parent``), dispose its live
sub-agents — so their logs close before its own — wait for its driver, close its scope, close
its writer and the writer's handle, then detach the agent and the session from the registries
(``_agent/lifecycle.py``), each detach bound to the exact entry that was entered, so a stale
disposer cannot remove a newer agent with the same id. Closing the writer is bounded
(``WRITER_CLOSE_TIMEOUT``), so a hung store cannot hang a teardown. A teardown asked for from
inside the agent's own task tree (its tool or hook) cannot wait for the driver that waits for
it: it runs in a task of the runtime's nursery instead (see ``AgentHandle.dispose``).

The dependency is one-way: the registry (``Agents``) makes each handle with the few operations
its teardown needs of it (``Teardown``: start a task, detach, report, dispose the children),
and this module knows nothing of the registry.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from .._errors import StoreError
from .._session.writer import CLOSE_TIMEOUT, SessionWriter
from ..events import AGENT_DISPOSED, SESSION_DISPOSED

if TYPE_CHECKING:
    from ._actor import AgentActor
    from .agent import Agent

__all__ = ["WRITER_CLOSE_TIMEOUT", "AgentHandle", "QuietTeardown", "Teardown"]

#: Seconds a teardown waits for the session writer to commit what is left and close its handle
#: (the writer bounds its final commit by ``CLOSE_TIMEOUT``; a commit in flight may precede it).
WRITER_CLOSE_TIMEOUT = 2 * CLOSE_TIMEOUT

_log = logging.getLogger("dsh_agent_loop.lifecycle")


@final
@attrs.frozen
class Teardown:
    """What a teardown needs of the registry that made the handle (one record per registry)."""

    spawn: Callable[[Callable[[], Awaitable[None]]], None]
    """Start a task in the runtime's nursery (a teardown asked for from inside the agent)."""
    detach: Callable[[AgentHandle], None]
    """Remove the handle's agent and session from the registries (the exact entries)."""
    emit: Callable[[str, dict[str, Any]], None]
    """Report a lifecycle notification to ``on`` observers."""
    dispose_children: Callable[[AgentActor[Agent]], Awaitable[None]]
    """Dispose an agent's live sub-agents (each disposes its own first)."""


@final
class AgentHandle:
    """Owns one live agent; ``dispose()`` tears it down exactly once.

    It is an async context manager: ``async with handle:`` (or ``async with await
    rt.agents.create(...) as handle:``) disposes the agent when the block ends, however it ends.
    """

    __slots__ = (
        "_actor",
        "_done",
        "_error",
        "_ops",
        "_writer",
    )

    def __init__(self, actor: AgentActor[Agent], writer: SessionWriter, ops: Teardown) -> None:
        self._actor = actor
        self._writer = writer
        self._ops = ops
        self._done: trio.Event | None = None
        self._error: BaseException | None = None

    @property
    def agent(self) -> Agent:
        """The live agent this handle owns."""
        return self._actor.facade

    @property
    def session_id(self) -> str:
        """The agent's session id."""
        return self._actor.session_id

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
        if self._actor.in_driver_tree():
            self._actor.begin_stop("disposed")
            if self._done is None:
                self._done = trio.Event()
                self._ops.spawn(self._detached_teardown)
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
            _log.exception("disposing agent %r failed", self._actor.id)

    async def _teardown(self) -> None:
        errors: list[Exception] = []
        agent = self._actor
        for step in (self._stop_driver, self._close_scope, self._close_writer):
            try:
                await step()
            except Exception as exc:
                errors.append(exc)
        self._report_detached()
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup(f"disposing agent {agent.id!r} failed", errors)

    def _report_detached(self) -> None:
        """Leave the registries, then report the session and the agent disposed."""
        agent = self._actor
        ops = self._ops
        ops.detach(self)
        ops.emit(SESSION_DISPOSED, {"session_id": agent.session_id, "agent_id": agent.id})
        ops.emit(AGENT_DISPOSED, {"agent_id": agent.id, "session_id": agent.session_id})

    async def _stop_driver(self) -> None:
        agent = self._actor
        agent.begin_stop("disposed")  # no new turn; the running one and the children's abort
        try:
            await self._ops.dispose_children(agent)  # their logs close before this one's
        finally:
            await agent.stop("disposed")

    async def _close_scope(self) -> None:
        self._actor.scope.close()

    async def _close_writer(self) -> None:
        with trio.move_on_after(WRITER_CLOSE_TIMEOUT):
            await self._writer.aclose()
        self._check_writer_closed()

    def _check_writer_closed(self) -> None:
        """Raise what closing the writer left: it overran its bound, or the store failed."""
        if not self._writer.stopped:
            # The agent's task lingers until the runtime ends and cancels it (a bounded commit).
            raise StoreError(
                f"the session writer of agent {self._actor.id!r} did not close within"
                f" {WRITER_CLOSE_TIMEOUT:g} s"
            )
        if self._writer.failure is not None and self._actor.store_failure is None:
            raise self._writer.failure

    def _finish_quiet(self, found: list[Exception]) -> Exception | None:
        """The end of a ``QuietTeardown``: detach, report, release waiters; the error, if any."""
        agent = self._actor
        try:
            self._check_writer_closed()
        except Exception as exc:
            found.append(exc)
        self._report_detached()
        error: Exception | None = None
        if len(found) == 1:
            error = found[0]
        elif found:
            error = ExceptionGroup(f"disposing agent {agent.id!r} failed", found)
        self._error = error
        assert self._done is not None
        self._done.set()
        return error

    @property
    def quiet(self) -> bool:
        """True when a teardown would wait for nothing but the writer's final commit.

        No teardown has begun, no driver runs (so nothing of the agent's task tree can be the
        caller), no sub-agent is live and the store has not failed: a ``QuietTeardown`` may
        tear such agents down in one batch.
        """
        agent = self._actor
        return (
            self._done is None
            and not agent.driving
            and not agent.children
            and agent.store_failure is None
        )


@final
class QuietTeardown:
    """Many ``quiet`` agents torn down in one batch: ``dispose()``'s steps, with shared waits.

    Made by ``begin`` — synchronously, so no task runs between choosing the agents and stopping
    them: each stops taking work (nothing of it runs, so it is stopped at once), closes its scope,
    and its writer is asked to close. ``finish`` then waits once, shielded and bounded by
    ``WRITER_CLOSE_TIMEOUT`` as a whole, for the writers to commit what is left and close their
    handles, and detaches each agent and reports it disposed exactly as its own teardown would.
    A concurrent ``dispose()`` of one of them waits for the batch and sees the same error; one
    whose teardown had begun is left to it. No task, cancel scope or timeout per agent: at
    100,000 agents those were most of the runtime's exit.
    """

    __slots__ = ("_errors", "_handles", "_members")

    def __init__(self, handles: Sequence[AgentHandle]) -> None:
        self._handles = [h for h in handles if h.quiet]  # else another teardown owns it
        self._members = {id(h) for h in self._handles}
        self._errors: list[list[Exception]] = []

    @classmethod
    def begin(cls, handles: Sequence[AgentHandle]) -> QuietTeardown:
        """Stop the agents and ask their writers to close; never waits."""
        batch = cls(handles)
        for handle in batch._handles:
            handle._done = trio.Event()
            found: list[Exception] = []
            batch._errors.append(found)
            handle._actor.begin_stop("disposed")  # not driving: stopped at once
            try:
                handle._actor.scope.close()
            except Exception as exc:
                found.append(exc)
            handle._writer.request_close()
        return batch

    def holds(self, handle: AgentHandle) -> bool:
        """True when ``handle`` is torn down by this batch."""
        return id(handle) in self._members

    async def finish(self) -> None:
        """Wait for the writers, then detach and report every agent.

        Raises:
            Exception: the one agent whose teardown failed. ExceptionGroup: several did.
        """
        with trio.CancelScope(shield=True) as wait:
            wait.deadline = trio.current_time() + WRITER_CLOSE_TIMEOUT
            for handle in self._handles:
                if not handle._writer.stopped:
                    await handle._writer.aclose()
        failed: list[Exception] = []
        for handle, found in zip(self._handles, self._errors, strict=True):
            error = handle._finish_quiet(found)
            if error is not None:
                failed.append(error)
        if len(failed) == 1:
            raise failed[0]
        if failed:
            raise ExceptionGroup(f"disposing {len(failed)} agents failed", failed)
