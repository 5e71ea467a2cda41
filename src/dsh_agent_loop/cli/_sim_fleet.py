"""``dsh-agent simulate --workers N`` on a shared store: the simulation run on the fleet.

See docs/scale.md#simulate-on-a-shared-store and docs/design.md#fleet-workers. With a SQLite or
PostgreSQL store the N worker processes are fleet workers on that store and the parent is a
fleet client; no worker owns a fixed share of the agents, the fleet spreads them:

- **Workers.** Each child is ``dsh-agent simulate ... --shard I/N`` (the command line of the
  memory shards, so the same options reach it): ``run_fleet_worker`` opens a runtime with
  ``fleet=FleetOptions(...)``, the simulation's seeded scripted model, tools and settings, and
  serves until ``SIGTERM``, then drains (running turns finish) and writes its summary. At most
  ``--concurrency`` agents are live in a worker at once (``max_agents``; 0: no bound), and an
  agent idle for ``IDLE_UNLOAD_S`` is unloaded, so a worker's memory is bounded by its live
  agents, not by the run's: a million agents go through a few hundred live ones.
- **Parent.** It starts the workers, then creates agents ``sim-0 … sim-<N-1>`` with
  ``client.create`` and prompts each with ``client.send`` (its ``--turns`` prompts, one turn
  each), ``CREATORS`` clients at a time. Replies are a pure function of ``(seed, prompt,
  step)``, so every agent holds the conversation it holds in one process (the same
  ``replies_digest``), whichever worker ran it.
- **Progress.** Workers report on stdout in the memory shards' JSON lines: ``done`` (turns that
  reached ``agent/turn-stopping``), ``live`` (live agents and activations, when they change) and
  ``summary`` last. The turns end when every turn completed, or when the fleet is quiet (no
  undelivered message, no live agent in any worker, ``QUIET_LOOKS`` looks in a row): a turn
  that failed never reaches ``agent/turn-stopping``.
- **Stop and check.** The parent sends ``SIGTERM`` to every worker and waits for their
  summaries, then reads every session back from the store and checks it
  (``invariants.check``); the summary is the memory run's, with the activations of each worker.
- **Series.** Each worker samples itself from its start to the end of its drain (its steps,
  turns, memory and collector, which runs in a fleet worker) and reports the series with its
  summary; the parent samples itself (no steps: it runs no agent) and places the workers'
  series on its time line (``_sim_series.py``).

The bars: ``creating agents`` counts agents created and prompted, ``turns`` runs from the first
prompt to the last turn's end (the two overlap: workers start on the first agents while the
parent creates the rest), ``checking logs`` is the read-back. A worker that fails, or exits
without its summary, fails the run as a memory shard does.
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final, TextIO

import attrs
import trio
from rich.console import Console

from .._agent.options import AgentOptions
from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ..fleet import FleetClient, FleetOptions
from ..llm import ScriptedModel
from ._setup import EXIT_OK, make_store
from ._sim_procs import (
    Reporting,
    Worker,
    run_watched,
    watch,
)
from ._sim_script import SimScript
from ._sim_series import ProcessSeries, RunFigures, Sampler, SimResult, phases_of
from ._sim_summary import (
    DIGEST_MODULUS,
    LatencyHistogram,
    SimSummary,
    latency_fields,
    percentile,
    run_fields,
)
from ._sim_tally import Tally
from ._simulate import (
    CHECKING,
    CREATING,
    REFRESH_INTERVAL,
    RUNNING,
    SIM_PROVIDER,
    Counts,
    SimOptions,
    open_sim_runtime,
    read_back,
    refresh,
    sim_bars,
)

__all__ = ["CREATORS", "IDLE_UNLOAD_S", "run_fleet", "run_fleet_worker"]

#: Fleet clients creating and prompting agents at once (each its own connection).
CREATORS: Final = 4
#: Agents one ``create_many`` (and their prompts one ``send_many``) carries.
CREATE_BATCH: Final = 500
#: Seconds an idle agent stays live in a simulation worker before it is unloaded.
IDLE_UNLOAD_S: Final = 0.05
#: How often an idle simulation worker looks for work (seconds; SQLite polls).
POLL_S: Final = 0.01
#: Seconds running turns get to finish when a worker is told to stop.
DRAIN_S: Final = 30.0
#: Seconds between looks at whether the fleet is quiet, and the looks in a row that end the run.
QUIET_EVERY_S: Final = 0.5
QUIET_LOOKS: Final = 3


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# -- the worker side --------------------------------------------------------------------------


def run_fleet_worker(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    out: TextIO = sys.stdout,
) -> int:
    """Serve as fleet worker ``options.shard`` until ``SIGTERM``, reporting on ``out``; exit 0.

    The collector runs: unlike a memory shard, a worker unloads its agents as it goes, and
    their reference cycles are garbage the run must get back.
    """
    reporting = Reporting(out)
    gc.enable()
    try:
        figures = trio.run(partial(_serve, options, store, settings, config, tools, reporting))
    finally:
        gc.disable()  # the verb's policy for a process about to exit (skip_exit_collection)
    reporting.emit({"sim": "summary", "shard": options.shard, **figures})
    return EXIT_OK


async def _serve(
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    reporting: Reporting,
) -> dict[str, Any]:
    done = reporting.done
    sampler = Sampler(turns=lambda: done[RUNNING])
    reply = sampler.counted(SimScript(options.seed, options.tools).reply)
    model = ScriptedModel([reply], loop=True, latency=options.latency_ms / 1000.0, record=False)
    fleet = FleetOptions(
        worker_id=f"simulate-{options.shard}-of-{options.workers}-{os.getpid()}",
        max_agents=options.concurrency or 10_000_000,
        idle_unload_s=IDLE_UNLOAD_S,
        drain_timeout_s=DRAIN_S,
        poll_interval_s=POLL_S,
    )
    rss_before = _peak_rss()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as sampling:
            await sampling.start(sampler.run)
            async with open_sim_runtime(
                options, store, settings, model, config, tools, done, fleet
            ) as rt:
                worker = rt.worker
                assert worker is not None
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_report, worker, reporting)
                    async for _ in signals:
                        break
                    nursery.cancel_scope.cancel()
                stopping = time.perf_counter()
            reporting.sync()
            sampling.cancel_scope.cancel()
    return {
        "worker_id": worker.id,
        "activations": worker.activations,
        "unloads": worker.unloads,
        "delivered": worker.delivered,
        "takeovers": worker.takeovers,
        "turns": done[RUNNING],
        "drain_s": time.perf_counter() - stopping,
        "rss_growth": max(0, _peak_rss() - rss_before),
        "peak_rss": _peak_rss(),
        "series": sampler.series(f"worker {options.shard}").to_record(),
    }


async def _report(worker: Any, reporting: Reporting) -> None:
    """Report the turns done and, when they change, the live agents and activations."""
    last: tuple[int, int] | None = None
    while True:
        reporting.sync()
        now = (worker.live_agents, worker.activations)
        if now != last:
            last = now
            reporting.emit({"sim": "live", "live": now[0], "activations": now[1]})
        await trio.sleep(REFRESH_INTERVAL)


# -- the parent side --------------------------------------------------------------------------


@attrs.define
class _FleetReports:
    """Takes the workers' records: turn counts into the bars, each worker's live agents."""

    counts: Counts
    live: dict[int, int] = attrs.field(factory=dict)

    def take(self, record: Mapping[str, Any], worker: Worker) -> None:
        kind = record.get("sim")
        if kind == "done":
            self.counts.done[RUNNING] += int(record["counts"][RUNNING])
        elif kind == "live":
            self.live[worker.shard] = int(record["live"])
        elif kind == "summary":
            worker.record = dict(record)
            worker.record["series"] = ProcessSeries.of_record(
                record["series"], f"worker {worker.shard}"
            )


@attrs.define
class _Spans:
    create_s: float = 0.0
    wall_s: float = 0.0
    close_s: float = 0.0
    check_s: float = 0.0


def run_fleet(
    options: SimOptions, url: str, command: Sequence[str], console: Console, errors: Console
) -> SimResult | None:
    """Run the simulation on ``options.workers`` fleet workers (``command`` + ``--shard I/N``).

    Returns the merged result, or None when a worker failed (said on ``errors``).
    """
    counts = sim_bars(console, options)
    reports = _FleetReports(counts)
    workers = [Worker(shard) for shard in range(options.workers)]
    spans = _Spans()
    tally: list[Tally] = []
    store = make_store(url)
    sampler = Sampler()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refresh, counts)
            await nursery.start(sampler.run)
            sids = await _live(options, store, command, workers, reports, spans)
            counts.begin(CHECKING)
            tally.append(await read_back(store, sids, counts))
            spans.check_s = counts.end(CHECKING)
            counts.sync()
            nursery.cancel_scope.cancel()

    if not run_watched(main, counts.progress, workers, errors, "worker"):
        return None
    records = [worker.record or {} for worker in workers]
    figures = RunFigures(
        mode="fleet",
        start=sampler.start,
        processes=(
            sampler.series("parent", runs_agents=False),
            *(record["series"] for record in records if "series" in record),
        ),
        phases=phases_of(counts.spans(), sampler.perf0),
        turn_histogram=LatencyHistogram.of(tally[0].turn_times).counts,
        agent_steps=dict(sorted(tally[0].agent_steps.items())),
    )
    return SimResult(_summary(options, url, records, spans, tally[0]), figures)


async def _live(
    options: SimOptions,
    store: SessionStore,
    command: Sequence[str],
    workers: Sequence[Worker],
    reports: _FleetReports,
    spans: _Spans,
) -> list[str]:
    """Start the workers, create and prompt the agents, wait for the turns, stop the workers."""
    counts = reports.counts
    clients = [FleetClient(store) for _ in range(CREATORS)]
    try:
        # The tables first, from one process: workers creating them at once can race
        # (PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a concurrent twin).
        await clients[0].status()
        await store.stat(f"sim-{os.getpid()}")
        async with trio.open_nursery() as running:
            processes: list[trio.Process] = []
            for worker in workers:
                shard = ["--shard", f"{worker.shard}/{options.workers}"]
                processes.append(await running.start(watch, [*command, *shard], worker, reports))
            while len(reports.live) < len(workers):  # every worker registered: all take work
                await trio.sleep(POLL_S)
            counts.begin(CREATING)
            counts.begin(RUNNING)
            sids = await _create_and_prompt(clients, options, counts.done)
            spans.create_s = counts.end(CREATING)
            await _wait_for_turns(clients[0], options, reports)
            spans.wall_s = counts.end(RUNNING)
            stopping = time.perf_counter()
            for process in processes:
                process.terminate()  # SIGTERM: the worker drains and writes its summary
        spans.close_s = time.perf_counter() - stopping
    finally:
        with trio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()
    return sids


async def _create_and_prompt(
    clients: Sequence[FleetClient], options: SimOptions, done: list[int]
) -> list[str]:
    """Create agents ``sim-<n>`` and send each its prompts, in batches (one commit each)."""
    sids: list[str] = [""] * options.agents
    batches = iter(range(0, options.agents, CREATE_BATCH))
    turns = range(1, options.turns + 1)

    async def creator(client: FleetClient) -> None:
        for start in batches:
            numbers = range(start, min(start + CREATE_BATCH, options.agents))
            agents = [
                AgentOptions(id=f"sim-{n}", provider=SIM_PROVIDER, model="sim") for n in numbers
            ]
            made = await client.create_many(agents)
            prompts: list[tuple[str, str]] = []
            for n, sid in zip(numbers, made, strict=True):
                sids[n] = sid
                prompts.extend((sid, f"sim-{n} turn {t}") for t in turns)
            await client.send_many(prompts)
            done[CREATING] += len(made)

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(creator, client)
    return sids


async def _wait_for_turns(client: FleetClient, options: SimOptions, reports: _FleetReports) -> None:
    """Until every turn completed, or the fleet is quiet (a turn that failed ends too)."""
    total = options.agents * options.turns
    quiet = 0
    while reports.counts.done[RUNNING] < total:
        await trio.sleep(QUIET_EVERY_S)
        status = await client.status()
        idle = not any(reports.live.values())
        if idle and status.undelivered == 0 and status.sessions_waiting == 0:
            quiet += 1
            if quiet >= QUIET_LOOKS:
                return
        else:
            quiet = 0


def _summary(
    options: SimOptions,
    url: str,
    records: Sequence[Mapping[str, Any]],
    spans: _Spans,
    tally: Tally,
) -> SimSummary:
    return SimSummary(
        **run_fields(options, url, tally.turn_ends, tally.steps, spans.wall_s),
        events=tally.events,
        create_s=spans.create_s,
        close_s=spans.close_s,
        check_s=spans.check_s,
        **latency_fields(
            partial(percentile, sorted(tally.step_times)),
            partial(percentile, sorted(tally.turn_times)),
        ),
        mb_per_agent=sum(r.get("rss_growth", 0) for r in records) / options.agents / 1e6,
        violations=tally.violations,
        violation_samples=tuple(tally.samples),
        replies_digest=f"{tally.digest % DIGEST_MODULUS:016x}",
        activations=tuple(int(r.get("activations", 0)) for r in records),
        worker_peak_mb=tuple(round(r.get("peak_rss", 0) / 1e6, 1) for r in records),
    )
