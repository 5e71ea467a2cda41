"""``explore_cancellation``: cancel a scenario at every checkpoint its agents execute, and check.

How it enumerates (docs/reliability.md#cancellation-exploration): trio delivers cancellation only at
checkpoints, and
``Instrument.after_task_step`` fires after each step of each task — right after the task
yielded at a checkpoint. A dry run records the steps of the tasks in the agents' task trees (a
driver and every task spawned under it): there are K. Then, for n in 1..K, the scenario runs
again in a fresh ``trio.run`` under ``MockClock(autojump_threshold=0)``, and when the n-th
recorded step comes the instrument calls ``agent.cancel()`` on the agent that stepped. If the
step ended at a cancellable wait, ``Cancelled`` arrives exactly there; otherwise at the next
cancel point — so 1..K covers every checkpoint the turns execute.

Trio runs the tasks that are ready at once in an order it picks at random, from a private
random source no public API seeds. So a step is not named by when it happens but by who takes
it: the task's place in its agent's tree (the driver by the agent's id, every other task by
its parent and its spawn order there) and how many steps that task took before. That name does
not depend on how trio interleaves the tasks, so run n cancels at the same checkpoint of the
same task every time.

After each run it checks ``invariants.check`` on every stored session (no open turn may remain)
and the guarantees of docs/design.md#guarantees it can observe: a turn open when the cancel fired
ends ``aborted`` with
the first cause, every committed ``assistant/message`` holds exactly the text its stream
delivered, and every agent is idle when the scenario returns. The dry run is repeated to check
that the K steps are the same ones (a non-deterministic scenario cannot be explored), and a run
whose chosen step never comes is a failure too.

A tool that swallows ``Cancelled`` is a failure too. Each tool passed in ``tools`` is awaited
through a relay that passes every value and exception on unchanged and so sees ``Cancelled``
thrown into the tool; when that happened after the cancel fired and the tool nonetheless
returns normally while its scope is still cancelled, it caught the cancellation and did not
re-raise it.

The instrument's own failures are recorded, never raised (trio silently removes an instrument
that raises), so a harness bug shows up as a failure, not as a quietly shorter run.

Each run is its own ``trio.run``, and trio cannot nest runs in one thread: called from inside a
run (an ``async def`` test), ``explore_cancellation`` runs the exploration in a worker thread
and blocks until it is done; ``await explore_cancellation_async(...)`` does the same without
blocking the caller's event loop.
"""

from __future__ import annotations

import functools
import math
import queue
import random
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import Any, final

import attrs
import outcome
import trio
import trio.testing

from .. import invariants
from .._agent.agent import Agent, actor_of
from .._runtime import Runtime, open_runtime
from .._session.store import SessionStore
from .._tools.base import Tool
from ..events import ASSISTANT_ATTEMPT, ASSISTANT_MESSAGE, ASSISTANT_STREAM, TURN_END, Event
from ..llm import ModelAdapter, TextDelta
from ..stores import MemoryStore

__all__ = ["CancellationReport", "explore_cancellation", "explore_cancellation_async"]

Scenario = Callable[[Runtime], Awaitable[None]]
#: Virtual seconds a scenario may take before it is reported as hung.
HANG_LIMIT = 24 * 3600.0


@final
@attrs.frozen
class CancellationReport:
    """What ``explore_cancellation`` found."""

    checkpoints: int
    """K: steps of the agents' task trees in the dry run."""
    runs: int
    """Scenario runs with a cancel injected."""
    failures: list[tuple[int, str]]
    """``(checkpoint, problem)`` for every problem found (empty: all good)."""
    sites: int = 0
    """Distinct code locations where a cancel was injected."""

    @property
    def ok(self) -> bool:
        """True when no run failed."""
        return not self.failures


#: A task's place in its agent's tree: the agent's id and how many drivers had that id before,
#: then, for each task below the driver, its spawn order among its parent's children.
TaskKey = tuple[Any, ...]
#: One checkpoint: the task that reached it and how many steps that task had taken then.
Point = tuple[TaskKey, int]


class _Probe(trio.abc.Instrument):
    """Records the steps of agent-tree tasks; cancels the stepping agent at ``cancel_at``."""

    def __init__(self, cancel_at: Point | None) -> None:
        self.cancel_at = cancel_at
        self.points: list[Point] = []
        self.errors: list[str] = []
        self.fired: tuple[Agent, int | None, int] | None = None
        """(agent, turn open at the cancel or None, log length then)."""
        self.site: str | None = None
        self._keys: dict[trio.lowlevel.Task, TaskKey] = {}
        self._agents: dict[TaskKey, Agent] = {}
        self._steps: dict[trio.lowlevel.Task, int] = {}
        self._spawned: dict[trio.lowlevel.Task, int] = {}
        self._drivers: dict[str, int] = {}

    def register(self, agent: Agent, task: trio.lowlevel.Task) -> None:
        """``task`` is ``agent``'s driver (the actor's ``on_driver_start``)."""
        nth = self._drivers.get(agent.id, 0)
        self._drivers[agent.id] = nth + 1
        key = (agent.id, nth)
        self._keys[task] = key
        self._agents[key] = agent

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        try:
            nursery = task.parent_nursery
            parent = nursery.parent_task if nursery is not None else None
            parent_key = self._keys.get(parent) if parent is not None else None
            if parent is None or parent_key is None:
                return
            nth = self._spawned.get(parent, 0)
            self._spawned[parent] = nth + 1
            self._keys[task] = (*parent_key, nth)
        except Exception as exc:  # an instrument that raises is silently removed: record instead
            self.errors.append(f"instrument failed: {exc!r}")

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        try:
            key = self._keys.get(task)
            if key is None:
                return
            step = self._steps.get(task, 0)
            self._steps[task] = step + 1
            point = (key, step)
            self.points.append(point)
            if point == self.cancel_at:
                agent = self._agents[key[:2]]
                log = actor_of(agent).log
                state = log.state
                self.fired = (agent, state.turn if state.open_turn else None, len(log))
                self.site = _site(task)
                agent.cancel(cause="user")
        except Exception as exc:  # an instrument that raises is silently removed: record instead
            self.errors.append(f"instrument failed: {exc!r}")


class _Relay:
    """Awaits a tool's coroutine, passing every value and exception through unchanged.

    trio wakes a waiting task with the ``outcome`` given to ``trio.lowlevel.reschedule``: it
    sends that outcome down the task's chain of awaits to the innermost
    ``wait_task_rescheduled``, which unwraps it there — a cancel arrives as
    ``outcome.Error(Cancelled)``. This relay sits in that chain around the tool, so it sees a
    ``Cancelled`` go into the tool (an exception thrown in is watched too).
    """

    def __init__(self, coro: Any, probe: _Probe) -> None:
        self._coro = coro
        self._probe = probe
        self.cancelled = False
        """A ``Cancelled`` went into the tool after the explorer's cancel fired."""

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        send: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = coro.send(send) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            send, error = None, None
            try:
                send = yield yielded
            except BaseException as exc:  # re-delivered to the tool on the next pass
                error = exc
            if error is None and isinstance(send, outcome.Error):
                delivered: BaseException | None = send.error
            else:
                delivered = error
            if (
                isinstance(delivered, trio.Cancelled)
                and self._probe.fired is not None
                # trio.sleep and move_on_after end by their own deadline: not the turn's cancel.
                and getattr(delivered, "source", None) != "deadline"
            ):
                self.cancelled = True


def _watched(tool: Tool, probe: _Probe) -> Tool:
    """``tool`` with a handler that reports a swallowed ``Cancelled`` to ``probe``."""
    inner = tool.handler

    async def handler(arguments: Any, context: Any) -> Any:
        relay = _Relay(inner(arguments, context), probe)
        result = await relay
        # Cancelled went in after the turn was cancelled, the scope is still cancelled, and the
        # tool returned a value: it caught the cancellation. (The Cancelled that ends a sleep or
        # an inner timeout of the tool's own comes from a deadline and is not counted.)
        if relay.cancelled and trio.current_effective_deadline() == -math.inf:
            probe.errors.append(
                f"tool {tool.name!r} returned normally after the cancel reached it: it swallowed"
                " trio.Cancelled (re-raise it, or use a finally block for cleanup)"
            )
        return result

    return attrs.evolve(tool, handler=handler)


def _site(task: trio.lowlevel.Task) -> str:
    """Where the task waits: its innermost frame outside trio (file:line)."""
    coro: Any = task.coro
    site = "?"
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            path = frame.f_code.co_filename
            if "/trio/" not in path and "/outcome/" not in path:
                site = f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return site


@attrs.define
class _Run:
    points: list[Point]
    logs: dict[str, list[Event]]
    problems: list[str]
    site: str | None


def _streams(
    frames: list[Event],
) -> tuple[dict[tuple[Any, int], str], list[tuple[Any, ...]], list[str]]:
    """Fold stream frames: delivered text per committed seq, abandoned streams, problems."""
    open_: dict[tuple[Any, ...], list[str]] = {}
    committed: dict[tuple[Any, int], str] = {}
    abandoned: list[tuple[Any, ...]] = []
    problems: list[str] = []
    for frame in frames:
        data = frame.data
        key = (data.get("agent_id"), data["turn"], data["step"], data["attempt"])
        kind = data["frame"]
        if kind == "start":
            if key in open_:
                problems.append(f"stream {key} started twice")
            open_[key] = []
        elif kind == "chunk" and isinstance(data["chunk"], TextDelta):
            open_.setdefault(key, []).append(data["chunk"].text)
        elif kind == "end":
            if key not in open_:
                problems.append(f"stream {key} ended without a start, or twice")
            text = "".join(open_.pop(key, []))
            if data.get("outcome") == "committed":
                committed[(data.get("agent_id"), data["seq"])] = text
            else:
                abandoned.append((*key, text))
    problems.extend(f"stream {key} has no end frame" for key in open_)
    return committed, abandoned, problems


async def _run_scenario(
    scenario: Scenario,
    probe: _Probe,
    providers: Callable[[], Mapping[str, ModelAdapter]],
    tools: Iterable[Tool],
    store: SessionStore,
    seed: int,
) -> _Run:
    problems: list[str] = []
    frames: list[Event] = []
    agents: list[Agent] = []
    watched = [_watched(t, probe) for t in tools]
    async with open_runtime(
        store=store, providers=providers(), tools=watched, seed=seed, clock=trio.current_time
    ) as rt:
        rt.hooks.on(ASSISTANT_STREAM, frames.append)
        rt.hooks.on("agent/created", lambda e: _track(rt, e, probe, agents))
        with trio.move_on_after(HANG_LIMIT) as guard:
            await scenario(rt)
        if guard.cancelled_caught:
            problems.append("the scenario hung")
        for agent in rt.agents.list():
            if agent.status.value != "idle":
                problems.append(f"agent {agent.id!r} is not idle when the scenario returned")
    logs: dict[str, list[Event]] = {}
    for info in await store.list():
        handle = await store.open(info.session_id, "read")
        logs[info.session_id] = await handle.read()
        await handle.close()
    problems.extend(_check_logs(logs, frames, probe, agents))
    if probe.cancel_at is not None and probe.fired is None:
        problems.append(f"the checkpoint {probe.cancel_at} never came (non-deterministic scenario)")
    return _Run(probe.points, logs, problems + probe.errors, probe.site)


def _track(rt: Runtime, event: Event, probe: _Probe, agents: list[Agent]) -> None:
    agent = rt.agents.get(event.data["agent_id"])
    if agent is not None:
        agents.append(agent)
        actor_of(agent).on_driver_start = probe.register


def _check_logs(
    logs: dict[str, list[Event]], frames: list[Event], probe: _Probe, agents: list[Agent]
) -> list[str]:
    problems = []
    for sid, events in logs.items():
        for violation in invariants.check(events, allow_open_turn=False):
            problems.append(f"{sid}: {violation}")
    problems.extend(_check_streams(logs, frames, agents))
    if probe.fired is not None:
        agent, open_turn, _ = probe.fired
        if open_turn is not None:
            ends = [
                e
                for e in logs.get(agent.session_id, [])
                if e.type == TURN_END and e.data["turn"] == open_turn
            ]
            if not ends:
                problems.append(f"turn {open_turn} open at the cancel has no turn/end")
            elif (
                ends[0].data["reason"].get("kind") != "aborted"
                or ends[0].data["reason"].get("cause") != "user"
            ):
                problems.append(
                    f"turn {open_turn} open at the cancel ended {dict(ends[0].data['reason'])}"
                )
    return problems


def _check_streams(
    logs: dict[str, list[Event]], frames: list[Event], agents: list[Agent]
) -> list[str]:
    """Delivered text is kept: in its committed message, or in a failed attempt's record."""
    problems: list[str] = []
    committed, abandoned, stream_problems = _streams(frames)
    problems.extend(stream_problems)
    by_agent = {a.id: a for a in agents}
    for (agent_id, seq), text in committed.items():
        agent = by_agent.get(agent_id)
        if agent is None:
            continue
        stored = logs.get(agent.session_id, [])
        if seq >= len(stored) or stored[seq].type != ASSISTANT_MESSAGE:
            problems.append(
                f"{agent.session_id}: committed frame names seq {seq}, not an assistant/message"
            )
            continue
        content = stored[seq].data["message"]["content"]
        kept = "".join(b["text"] for b in content if b["type"] == "text")
        if kept != text:
            problems.append(
                f"{agent.session_id}: seq {seq} keeps {kept!r} but the stream delivered {text!r}"
            )
    for agent_id, turn, step, attempt, text in abandoned:
        agent = by_agent.get(agent_id)
        if agent is None or not text:
            continue
        attempts = [
            e
            for e in logs.get(agent.session_id, [])
            if e.type == ASSISTANT_ATTEMPT
            and (e.data["turn"], e.data["step"], e.data["stream"]["attempt"])
            == (turn, step, attempt)
        ]
        if (
            not attempts
            or attempts[0].data["failure"]["code"] == "ABORTED"
            or attempts[0].data["stream"].get("text") != text
        ):
            where = f"{agent.session_id}: turn {turn} step {step}"
            problems.append(f"{where}: delivered text {text!r} was not kept")
    return problems


def _one_run(
    scenario: Scenario,
    providers: Callable[[], Mapping[str, ModelAdapter]],
    tools: Iterable[Tool],
    store_factory: Callable[[], SessionStore],
    seed: int,
    cancel_at: Point | None,
) -> _Run:
    probe = _Probe(cancel_at)
    random_state = random.getstate()
    random.seed(seed)
    try:
        return trio.run(
            _run_scenario,
            scenario,
            probe,
            providers,
            tuple(tools),
            store_factory(),
            seed,
            clock=trio.testing.MockClock(autojump_threshold=0),
            instruments=[probe],
        )
    finally:
        random.setstate(random_state)


def _explore(
    scenario: Scenario,
    providers: Callable[[], Mapping[str, ModelAdapter]],
    tools: tuple[Tool, ...],
    store_factory: Callable[[], SessionStore],
    seed: int,
    max_checkpoints: int | None,
) -> CancellationReport:
    """The exploration, in the calling thread (which must not be running trio)."""
    dry = _one_run(scenario, providers, tools, store_factory, seed, None)
    failures = [(0, problem) for problem in dry.problems]
    again = _one_run(scenario, providers, tools, store_factory, seed, None)
    if sorted(again.points) != sorted(dry.points):
        failures.append(
            (
                0,
                f"K is not stable: {len(dry.points)} then {len(again.points)} checkpoints, or"
                " other ones (non-deterministic scenario)",
            )
        )
    ordered = sorted(dry.points)
    k = len(ordered)
    points = list(range(1, k + 1))
    if max_checkpoints is not None and k > max_checkpoints:
        stride = k / max_checkpoints
        points = sorted({1 + int(i * stride) for i in range(max_checkpoints)})
    sites: set[str] = set()
    for n in points:
        run = _one_run(scenario, providers, tools, store_factory, seed, ordered[n - 1])
        if run.site is not None:
            sites.add(run.site)
        failures.extend((n, problem) for problem in run.problems)
    return CancellationReport(checkpoints=k, runs=len(points), failures=failures, sites=len(sites))


def explore_cancellation(
    scenario: Scenario,
    *,
    providers: Callable[[], Mapping[str, ModelAdapter]],
    tools: Iterable[Tool] = (),
    store_factory: Callable[[], SessionStore] = MemoryStore,
    seed: int = 0,
    max_checkpoints: int | None = None,
) -> CancellationReport:
    """Run ``scenario`` once per reachable checkpoint, cancelling the active turn there.

    Each run is a fresh ``trio.run``. Called from inside a trio run (an ``async def`` test),
    the exploration runs in a worker thread and this call blocks the caller's event loop until
    it is done; ``await explore_cancellation_async(...)`` does not block it.

    Args:
        scenario: ``async def scenario(rt)``: create agents, prompt them, wait for them.
        providers: A zero-argument factory of the providers mapping (fresh models per run).
        tools: Runtime tools (each is watched for a swallowed ``Cancelled``).
        store_factory: Makes a fresh store per run; it must not use threads (use memory).
        seed: Seeds the runtime's random source and ``random``.
        max_checkpoints: Explore at most this many checkpoints (spread evenly), or all.

    Returns:
        The report: ``checkpoints`` (K), ``runs`` and ``failures``.
    """
    run = functools.partial(
        _explore, scenario, providers, tuple(tools), store_factory, seed, max_checkpoints
    )
    if not trio.lowlevel.in_trio_run():
        return run()
    done: queue.SimpleQueue[outcome.Outcome[CancellationReport]] = queue.SimpleQueue()
    trio.lowlevel.start_thread_soon(run, done.put)
    return done.get().unwrap()


async def explore_cancellation_async(
    scenario: Scenario,
    *,
    providers: Callable[[], Mapping[str, ModelAdapter]],
    tools: Iterable[Tool] = (),
    store_factory: Callable[[], SessionStore] = MemoryStore,
    seed: int = 0,
    max_checkpoints: int | None = None,
) -> CancellationReport:
    """``explore_cancellation`` for async code: the runs go to a worker thread, awaited.

    Every run still gets its own ``trio.run`` and ``MockClock``; the caller's event loop keeps
    running meanwhile (its clock may be a ``MockClock`` too). The arguments are those of
    ``explore_cancellation``.
    """
    run = functools.partial(
        _explore, scenario, providers, tuple(tools), store_factory, seed, max_checkpoints
    )
    return await trio.to_thread.run_sync(run)
