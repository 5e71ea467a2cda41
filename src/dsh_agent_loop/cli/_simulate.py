"""``dsh-agent simulate``: many agents against a seeded scripted model, on a real store.

Agents ``sim-0 … sim-<N-1>`` are created on default session ids, 64 at a time (a store may share
work between concurrent creations: SQLite takes their ownership in one transaction), then they are
prompted: at most ``--concurrency`` agents run their turns at the same time (each is given all its
prompts at once, one queued prompt per turn, and the next agent is prompted when one goes idle;
``--concurrency 0`` prompts every agent at once). All agents stay alive until every one is idle.
A run may be one shard of a larger one (``SimOptions.workers`` > 1): agents ``sim-k`` with
``k % workers == shard`` only, with the same ids and prompts (``_sim_workers.py`` runs the
shards in worker processes and merges their figures); on a store the workers share, the fleet
runs them instead (``_sim_fleet.py``).
Each turn is ``--tools`` steps that call the built-in ``sim_tool`` and a final text step.
Replies are a pure function of ``(seed, prompt, step)``, never of scheduling, so a seeded run
repeats everything but session ids and times. The progress bar counts turns as they reach
``agent/turn-stopping`` (a completed turn, just before its ``turn/end``).

Each bar's time is its phase's, on the one clock the summary reads (``time.perf_counter``): a bar
starts when its phase does and stops when it ends, and the summary's seconds are the stopped
bars' own elapsed times. So ``creating agents``, ``turns`` and ``checking logs`` show, to the
hundredth of a second, the summary's ``agents created in``, ``steps ... in`` and ``logs read back
and checked in``.

Bounding the agents in a turn bounds what the run holds at once besides the agents themselves:
the frames, requests and stream state of a turn in progress. With every agent mid-turn at once,
those temporaries (several KB an agent) all exist together, and the allocator keeps their space
once they are gone: at 100,000 agents that is about a quarter of the peak RSS.

With ``--config`` the runtime is opened on that config minus its agents and providers: the
simulated agents use its store, settings (``maxParallelToolCalls``, ``persona``, ``turnBudget``)
and tools, beside ``sim_tool`` and any ``--tool``; its declared agents are not started (the verb
says so on stderr) and no provider of it is contacted.

When every agent is idle the resident memory is sampled (agents still alive); after the
runtime has closed, every session is read back from the store and checked with
``invariants.check``. Step latency is ``step/end.time - step/start.time`` and a turn's duration
``turn/end.time - turn/start.time``, from the stored log. A ``Sampler`` (``_sim_series.py``)
records the run's steps, turns, memory and collector time over time for ``--report``.

The verb is an application, so it sets a garbage-collector policy for its own run (the library
sets none; ``docs/scale.md``): the collector is paused from the first agent's creation until
every log has been read back and checked, and restored afterwards. Everything the run builds
lives until its end, so a collection during it could only walk live objects.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, Final, final

import attrs
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
)
from rich.text import Text

from .._agent.handle import AgentHandle
from .._agent.options import AgentOptions
from .._runtime import Runtime, open_runtime
from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ..events import (
    HOOK_TURN_STOPPING,
)
from ..fleet import FleetOptions
from ..llm import ScriptedModel
from ._sim_script import SimScript, sim_tool
from ._sim_series import RunFigures, Sampler, SimResult, phases_of, rss_bytes
from ._sim_summary import (
    DEFAULT_CONCURRENCY,
    LatencyHistogram,
    SimSummary,
    exit_code,
    latency_fields,
    percentile,
    print_summary,
    run_fields,
    write_json,
)
from ._sim_tally import Tally

__all__ = [
    "CHECKING",
    "CREATING",
    "DEFAULT_CONCURRENCY",
    "RUNNING",
    "Counts",
    "LiveRun",
    "SimOptions",
    "SimScript",
    "SimSummary",
    "Tally",
    "exit_code",
    "measure_simulation",
    "open_sim_runtime",
    "print_summary",
    "read_back",
    "refresh",
    "sim_bars",
    "sim_config",
    "sim_tool",
    "simulate",
    "skip_exit_collection",
    "write_json",
]

#: Provider name of the simulated model.
SIM_PROVIDER: Final = "sim"
#: Seconds between progress redraws.
REFRESH_INTERVAL: Final = 0.1
#: Agents created at the same time.
_CREATORS: Final = 64


@final
@attrs.frozen
class SimOptions:
    """What ``simulate`` was asked for."""

    agents: int
    turns: int = 1
    tools: int = 1
    latency_ms: float = 0.0
    seed: int = 0
    concurrency: int = DEFAULT_CONCURRENCY
    """Agents running a turn at the same time (0: every agent at once)."""
    shard: int = 0
    """The shard this process runs: agents ``sim-k`` with ``k % workers == shard``."""
    workers: int = 1
    """Shards the agents are split into, one worker process each (``--workers``)."""

    @property
    def numbers(self) -> range:
        """The numbers ``k`` of this shard's agents ``sim-k``."""
        return range(self.shard, self.agents, self.workers)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic collector from the first agent's creation until the logs are checked.

    A simulation is a batch job whose objects all live until its end: every collection during
    it walks agents that are never garbage (at 50,000 agents a quarter of the turns' wall time,
    and a full collection of 100,000 idle agents takes seconds). A turn leaves about 3 objects
    per agent in reference cycles whether the collector runs or not; they are left to the end of
    the run, like the agents. A collector the caller disabled stays disabled.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Counts:
    """Progress as plain counters: the run bumps an int, the redraw task copies them over.

    A ``Progress.advance`` per agent and per turn (a lock and a clock read each) is 300,000
    calls at 100,000 agents; the bar only needs the counts ten times a second.
    """

    __slots__ = ("done", "progress", "tasks")

    def __init__(self, progress: Progress, tasks: Sequence[TaskID]) -> None:
        self.progress = progress
        self.tasks = tuple(tasks)
        self.done = [0] * len(self.tasks)

    def begin(self, index: int) -> None:
        """Start the clock of bar ``index``: its phase begins."""
        self.progress.start_task(self.tasks[index])

    def end(self, index: int) -> float:
        """Stop the clock of bar ``index``; the seconds it shows, which the summary reports."""
        task_id = self.tasks[index]
        self.progress.stop_task(task_id)
        task = next(task for task in self.progress.tasks if task.id == task_id)
        return task.elapsed or 0.0

    def sync(self) -> None:
        """Copy the counts into the bar and redraw it."""
        for task, done in zip(self.tasks, self.done, strict=True):
            self.progress.update(task, completed=done)
        self.progress.refresh()

    def spans(self) -> list[tuple[str, float | None, float | None]]:
        """Each bar's name and the ``perf_counter`` times it started and stopped (None: not)."""
        tasks = {task.id: task for task in self.progress.tasks}
        return [(tasks[i].description, tasks[i].start_time, tasks[i].stop_time) for i in self.tasks]


#: Index of each bar in ``Counts.done``.
CREATING, RUNNING, CHECKING = 0, 1, 2


async def refresh(counts: Counts) -> None:
    """Redraw ``counts`` every ``REFRESH_INTERVAL`` seconds until cancelled."""
    while True:
        counts.sync()
        await trio.sleep(REFRESH_INTERVAL)


#: Sessions read back at once (SQLite takes up to 64 concurrent reads a worker hop).
_READERS: Final = 64


async def _read_back(store: SessionStore, session_ids: Sequence[str], counts: Counts) -> Tally:
    """Read every session back and check it (``CHECKING`` counts them); closes ``store``.

    ``read_back`` calls it at call time, so a test that replaces it here reaches every run.
    """
    tally = Tally()
    done = counts.done
    remaining = iter(session_ids)

    async def reader() -> None:
        for session_id in remaining:
            handle = await store.open(session_id, "read")
            try:
                tally.add(session_id, await handle.read())
            finally:
                await handle.close()
            done[CHECKING] += 1

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(_READERS):
                nursery.start_soon(reader)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
    return tally


async def read_back(store: SessionStore, session_ids: Sequence[str], counts: Counts) -> Tally:
    """``_read_back`` for another simulation module (the fleet's parent)."""
    return await _read_back(store, session_ids, counts)


class _PhaseSeconds(ProgressColumn):
    """A bar's elapsed time as the summary prints it (``0.34 s``); blank before its phase."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        return Text("" if elapsed is None else f"{elapsed:.2f} s", style="progress.elapsed")


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        _PhaseSeconds(),
        console=console,
        auto_refresh=False,  # redrawn by a trio task: no refresh thread
        get_time=time.perf_counter,  # the summary's clock: the bars' times are its figures
    )


@attrs.define
class LiveRun:
    """What the live part of the run measured."""

    session_ids: list[str]
    create_s: float
    wall_s: float
    rss_growth: int
    """Bytes of resident memory the run added, its agents alive and idle."""
    close_s: float = 0.0
    check_s: float = 0.0


def sim_config(config: RuntimeConfig | None) -> RuntimeConfig | None:
    """``config`` without its agents and providers: what the simulated runtime is opened on."""
    if config is None:
        return None
    plugin = attrs.evolve(config.plugin, agents=())
    return attrs.evolve(config, plugin=plugin, providers={})


@asynccontextmanager
async def open_sim_runtime(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    model: ScriptedModel,
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    done: list[int],
    fleet: FleetOptions | None = None,
) -> AsyncIterator[Runtime]:
    """The runtime a simulation (or one fleet worker of it) runs its agents in.

    Opened on ``sim_config(config)`` with the scripted model, ``sim_tool`` and ``tools``; every
    turn that reaches ``agent/turn-stopping`` adds one to ``done[RUNNING]`` (the ``turns`` bar).
    """

    async def on_turn_stopping(payload: object) -> None:
        done[RUNNING] += 1

    async with open_runtime(
        sim_config(config),
        store=store,
        providers={SIM_PROVIDER: model},
        tools=[sim_tool, *tools],
        settings=settings,
        seed=options.seed,
        fleet=fleet,
    ) as rt:
        rt.hooks.serial(HOOK_TURN_STOPPING, on_turn_stopping)
        yield rt


async def _run_agents(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    counts: Counts,
    config: RuntimeConfig | None = None,
    tools: Sequence[Tool] = (),
    sampler: Sampler | None = None,
) -> LiveRun:
    """Create the agents, run their turns, wait until all are idle, close the runtime.

    ``sampler`` counts the model's replies (the steps begun).
    """
    reply = SimScript(options.seed, options.tools).reply
    model = ScriptedModel(
        [reply if sampler is None else sampler.counted(reply)],
        loop=True,
        latency=options.latency_ms / 1000.0,
        record=False,  # the simulation reads the sessions, not a request log
    )

    rss_before = rss_bytes()
    return await _live_run(options, store, settings, counts, model, config, tools, rss_before)


async def _live_run(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    counts: Counts,
    model: ScriptedModel,
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    rss_before: int,
) -> LiveRun:
    """The live part of ``_run_agents``: create, prompt, wait until idle, close."""
    done = counts.done
    async with open_sim_runtime(options, store, settings, model, config, tools, done) as rt:
        counts.begin(CREATING)
        handles = await _create_agents(rt.agents.create, options.numbers, done)
        create_s = counts.end(CREATING)
        counts.begin(RUNNING)
        await _run_turns(handles, options)
        wall_s = counts.end(RUNNING)
        rss_growth = rss_bytes() - rss_before
        run = LiveRun([h.session_id for h in handles], create_s, wall_s, rss_growth)
        del handles
        closing = time.perf_counter()
    run.close_s = time.perf_counter() - closing
    return run


async def _create_agents(
    create: Callable[..., Awaitable[AgentHandle]], numbers: range, done: list[int]
) -> list[AgentHandle]:
    """Create agents ``sim-<n>`` for ``n`` in ``numbers``, ``_CREATORS`` at a time, in order.

    Creations made concurrently let a store share its work between them (SQLite takes the
    ownership of the sessions queued meanwhile in one transaction).
    """
    handles: list[AgentHandle | None] = [None] * len(numbers)
    pending = iter(enumerate(numbers))

    async def creator() -> None:
        for i, n in pending:
            agent_options = AgentOptions(id=f"sim-{n}", provider=SIM_PROVIDER, model="sim")
            handles[i] = await create(options=agent_options)
            done[CREATING] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(min(_CREATORS, len(numbers))):
            nursery.start_soon(creator)
    return [handle for handle in handles if handle is not None]


async def _run_turns(handles: Sequence[AgentHandle], options: SimOptions) -> None:
    """Prompt every agent, at most ``options.concurrency`` in a turn at once; wait until idle."""
    turns = range(1, options.turns + 1)
    pending = iter(zip(options.numbers, handles, strict=True))

    async def prompter() -> None:
        for n, handle in pending:
            agent = handle.agent
            for turn in turns:
                agent.followup(f"sim-{n} turn {turn}")
            await agent.wait_idle()

    width = options.concurrency or len(handles)
    async with trio.open_nursery() as nursery:
        for _ in range(min(width, len(handles))):
            nursery.start_soon(prompter)


def sim_bars(console: Console, options: SimOptions) -> Counts:
    """The three bars of a run of every agent of ``options``, not started, on ``console``."""
    progress = _progress(console)
    return Counts(
        progress,
        (
            progress.add_task("creating agents", total=options.agents, start=False),
            progress.add_task("turns", total=options.agents * options.turns, start=False),
            progress.add_task("checking logs", total=options.agents, start=False),
        ),
    )


async def simulate(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    counts: Counts,
    config: RuntimeConfig | None = None,
    tools: Sequence[Tool] = (),
    sampler: Sampler | None = None,
) -> tuple[LiveRun, Tally]:
    """Run this shard's agents, then read their sessions back, the collector paused throughout.

    ``counts`` is redrawn meanwhile; its bars are begun and ended with their phases.
    ``sampler`` (a fresh one if None) samples the run from before the first creation until
    the logs are checked; its turns are the ``turns`` bar's.
    """
    if sampler is None:
        sampler = Sampler()
    sampler.turns = lambda: counts.done[RUNNING]
    with _collector_paused():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refresh, counts)
            await nursery.start(sampler.run)
            run = await _run_agents(options, store, settings, counts, config, tools, sampler)
            counts.begin(CHECKING)
            tally = await _read_back(store, run.session_ids, counts)
            run.check_s = counts.end(CHECKING)
            counts.sync()
            nursery.cancel_scope.cancel()
    return run, tally


async def measure_simulation(
    options: SimOptions,
    store: SessionStore,
    url: str,
    settings: Mapping[str, Any],
    console: Console,
    *,
    config: RuntimeConfig | None = None,
    tools: Sequence[Tool] = (),
) -> SimResult:
    """Run the simulation in this process and read every session back; summary and figures.

    The figures are what ``--report`` draws.
    """
    counts = sim_bars(console, options)
    sampler = Sampler()
    with counts.progress:
        run, tally = await simulate(options, store, settings, counts, config, tools, sampler)
    summary = SimSummary(
        **run_fields(options, url, tally.turn_ends, tally.steps, run.wall_s),
        events=tally.events,
        create_s=run.create_s,
        close_s=run.close_s,
        check_s=run.check_s,
        **latency_fields(
            partial(percentile, sorted(tally.step_times)),
            partial(percentile, sorted(tally.turn_times)),
        ),
        mb_per_agent=run.rss_growth / options.agents / 1e6,
        violations=tally.violations,
        violation_samples=tuple(tally.samples),
        replies_digest=f"{tally.digest:016x}",
    )
    figures = RunFigures(
        mode="one process",
        start=sampler.start,
        processes=(sampler.series("this process"),),
        phases=phases_of(counts.spans(), sampler.perf0),
        turn_histogram=LatencyHistogram.of(tally.turn_times).counts,
        agent_steps=dict(sorted(tally.agent_steps.items())),
    )
    return SimResult(summary, figures)


@contextmanager
def skip_exit_collection() -> Iterator[None]:
    """Keep the collector away from a finished run's dead agents, for a process about to exit.

    The agents of a run are reference cycles (agent, session, writer, handle) that hold their
    events. Once the runtime has closed they wait for the collector: with the collector paused
    for the run, everything the run allocated is still in the youngest generation, so the first
    collection after it walks and frees all of it (about 90 µs per agent, nine seconds at
    100,000 agents) to give back memory that the process's exit gives back at once. Inside this
    context the collector stays paused; on the way out ``gc.freeze()`` moves what is left out of
    every collection, the one at exit included, before the collector's state is restored.
    Nothing frozen holds an open resource (the runtime and the store are closed). Only for the
    CLI verb, around its run: a process that goes on would keep the garbage.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
