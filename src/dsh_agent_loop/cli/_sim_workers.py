"""``dsh-agent simulate --workers N``: one simulation on N worker processes, one summary.

With ``--store memory:`` each worker is a ``dsh-agent simulate`` child process given the same
options and a hidden ``--shard I/N``: it runs agents ``sim-k`` with ``k % N == I`` (the same ids
and prompts, so the same seeded replies, as in one process) on its own memory store, reads its
sessions back and checks them before it exits (the store dies with it), and reports on its
stdout in JSON lines, each an object whose ``sim`` key names it (other lines are ignored):

- ``begin`` / ``end`` with ``phase`` (0 creating, 1 turns, 2 checking): a phase began or ended;
- ``done`` with ``counts``: the agents created, turns ended and logs checked since the last
  ``done`` (at most one every ``REFRESH_INTERVAL``, and one as a phase ends);
- ``summary``, once, last: the shard's raw figures (``run_shard``), small whatever the number
  of agents (step latencies and turn durations as ``LatencyHistogram``s, sessions by their
  steps, at most 5 violation samples, and its sampled series: at most ``MAX_POINTS`` points,
  ``_sim_series.py``).

Its environment names its shard in ``$DSH_AGENT_SIM_SHARD`` (``0`` … ``N-1``), for its tools.

The parent reads every worker's lines as they come and draws one set of bars: a bar starts
when the first worker begins its phase and stops when the last one ends it, so the merged
summary's seconds are the phases' spans across workers, read from the same clock as the bars.
The parent samples itself too (its memory and collector; it runs no agents): the report's
time line is the parent's, the shards' series placed on it by their wall-clock starts.
A worker's stderr is kept (its last ``STDERR_TAIL`` lines) and shown after the bars, each line
after ``shard I:``. A worker that exits non-zero or without its summary fails the run: the
parent says which shard and prints the worker's last stderr lines, and the other workers are
cancelled (``trio.run_process`` terminates and reaps them); Ctrl-C cancels them the same way.
Workers run in sessions of their own, so a terminal's Ctrl-C reaches the parent only, which
ends them: nothing is left behind.

A store the workers share (SQLite, PostgreSQL) runs the simulation on the fleet instead
(``_sim_fleet.py``): the same hidden ``--shard I/N`` makes a child a fleet worker, and the
parent creates and prompts the agents through a fleet client. Any other store (``jsonl:``)
cannot carry a fleet: more than one worker on it is refused as bad usage before any process
starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final, TextIO

import attrs
import trio
from rich.console import Console

from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ..stores import parse_store_url
from ._setup import EXIT_OK, CliError
from ._sim_procs import (
    SHARD_VARIABLE,
    Reporting,
    Reports,
    Worker,
    WorkerFailed,
    first_failure,
    report_failure,
    run_watched,
    watch,
)
from ._sim_series import ProcessSeries, RunFigures, Sampler, SimResult, phases_of
from ._sim_summary import (
    DIGEST_MODULUS,
    LatencyHistogram,
    SimSummary,
    latency_fields,
    run_fields,
)
from ._simulate import CHECKING, CREATING, RUNNING, Counts, SimOptions, refresh, sim_bars, simulate
from ._terminal import redact_url

__all__ = [
    "FLEET_SCHEMES",
    "MAX_WORKERS",
    "SHARD_VARIABLE",
    "Reporting",
    "Reports",
    "Worker",
    "WorkerFailed",
    "first_failure",
    "on_fleet",
    "parse_shard",
    "report_failure",
    "run_shard",
    "run_workers",
    "shard_count",
    "watch",
]

#: The most worker processes ``--workers`` takes.
MAX_WORKERS: Final = 64
#: Store schemes whose simulation workers share the store through the fleet.
FLEET_SCHEMES: Final = frozenset({"sqlite", "postgresql", "postgres"})


def on_fleet(url: str) -> bool:
    """True when ``--workers`` on ``url`` runs on the fleet (a store every worker can reach)."""
    return parse_store_url(url).scheme in FLEET_SCHEMES


def parse_shard(text: str) -> tuple[int, int]:
    """The hidden ``--shard I/N`` option: shard ``I`` of ``N``.

    Raises:
        ValueError: not ``I/N`` with ``0 <= I < N <= MAX_WORKERS``.
    """
    index, _, count = text.partition("/")
    shard, workers = int(index), int(count)
    if not 0 <= shard < workers <= MAX_WORKERS:
        raise ValueError(f"bad shard {text!r}")
    return shard, workers


def shard_count(workers: int, agents: int, url: str) -> int:
    """The worker processes ``--workers`` asks for: ``0`` is one per CPU, never more than agents.

    Raises:
        CliError: more than one worker on a store that is neither ``memory:`` (a store per
            worker) nor one the fleet can share (SQLite, PostgreSQL) (exit 2).
    """
    count = min(workers or os.cpu_count() or 1, MAX_WORKERS, agents)
    scheme = parse_store_url(url).scheme
    if count > 1 and scheme != "memory" and scheme not in FLEET_SCHEMES:
        raise CliError(
            f"simulate: --workers {count} on {redact_url(url)}: workers share a store through "
            "the fleet, which needs SQLite (sqlite:///PATH) or PostgreSQL (postgresql://...); "
            "use one of those, --store memory: (a store per worker) or --workers 1"
        )
    return count


# -- the worker side --------------------------------------------------------------------------


def run_shard(
    shard: tuple[int, int],
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    out: TextIO = sys.stdout,
) -> int:
    """Run shard ``shard`` (``(I, N)``) of ``options``' agents, reporting on ``out``; exit 0.

    On a store the fleet shares, the shard is a fleet worker instead (``_sim_fleet``).
    """
    options = attrs.evolve(options, shard=shard[0], workers=shard[1])
    if not _is_memory(store):
        from ._sim_fleet import run_fleet_worker

        return run_fleet_worker(options, store, settings, config, tools, out)
    counts = Reporting(out)
    sampler = Sampler()
    run, tally = trio.run(
        partial(simulate, options, store, settings, counts, config, tools, sampler)
    )
    counts.emit(
        {
            "sim": "summary",
            "shard": options.shard,
            "agents": len(options.numbers),
            "turn_ends": tally.turn_ends,
            "events": tally.events,
            "steps": tally.steps,
            "close_s": run.close_s,
            "rss_growth": run.rss_growth,
            "latency": LatencyHistogram.of(tally.step_times).counts,
            "turn_latency": LatencyHistogram.of(tally.turn_times).counts,
            "agent_steps": tally.agent_steps,
            "violations": tally.violations,
            "samples": tally.samples,
            "digest": tally.digest,
            "series": sampler.series(f"shard {options.shard}").to_record(),
        }
    )
    return EXIT_OK


def _is_memory(store: SessionStore) -> bool:
    from ..stores import MemoryStore

    return isinstance(store, MemoryStore)


# -- the parent side --------------------------------------------------------------------------


@attrs.define
class _Phases:
    """The merged bars: begun by the first worker, ended by the last."""

    counts: Counts
    workers: int
    begun: list[bool] = attrs.field(factory=lambda: [False] * 3)
    ended: list[int] = attrs.field(factory=lambda: [0] * 3)
    seconds: list[float] = attrs.field(factory=lambda: [0.0] * 3)

    def take(self, record: Mapping[str, Any], worker: Worker) -> None:
        kind = record.get("sim")
        if kind == "done":
            for index, count in enumerate(record["counts"]):
                self.counts.done[index] += count
        elif kind == "begin" and not self.begun[record["phase"]]:
            self.begun[record["phase"]] = True
            self.counts.begin(record["phase"])
        elif kind == "end":
            phase = record["phase"]
            self.ended[phase] += 1
            if self.ended[phase] == self.workers:
                self.counts.sync()
                self.seconds[phase] = self.counts.end(phase)
        elif kind == "summary":
            worker.record = dict(record)
            worker.record["series"] = ProcessSeries.of_record(
                record["series"], f"shard {worker.shard}"
            )


def run_workers(
    options: SimOptions, url: str, command: Sequence[str], console: Console, errors: Console
) -> SimResult | None:
    """Run ``options.workers`` workers (``command`` plus ``--shard I/N``); the merged result.

    None when a worker failed: which one and its last stderr lines are on ``errors``. On a store
    the fleet shares, the workers are fleet workers (``_sim_fleet.run_fleet``).
    """
    if on_fleet(url):
        from ._sim_fleet import run_fleet

        return run_fleet(options, url, command, console, errors)
    counts = sim_bars(console, options)
    phases = _Phases(counts, options.workers)
    workers = [Worker(shard) for shard in range(options.workers)]
    sampler = Sampler()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refresh, counts)
            await nursery.start(sampler.run)
            async with trio.open_nursery() as running:
                for worker in workers:
                    shard = ["--shard", f"{worker.shard}/{options.workers}"]
                    running.start_soon(watch, [*command, *shard], worker, phases)
            nursery.cancel_scope.cancel()

    if not run_watched(main, counts.progress, workers, errors, "shard"):
        return None
    summary, figures = _merge(options, url, workers, phases)
    return SimResult(
        summary,
        attrs.evolve(
            figures,
            start=sampler.start,
            processes=(sampler.series("parent", runs_agents=False), *figures.processes),
            phases=phases_of(counts.spans(), sampler.perf0),
        ),
    )


def _merge(
    options: SimOptions, url: str, workers: Sequence[Worker], phases: _Phases
) -> tuple[SimSummary, RunFigures]:
    """One summary of the shards' records: sums, merged latencies, the phases' spans.

    The figures hold the shards' series, turn durations and sessions by steps; the parent's
    series, time line and phases are the caller's to add.
    """
    records = [worker.record for worker in workers if worker.record is not None]
    turn_ends: dict[str, int] = {}
    histogram, turns = LatencyHistogram(), LatencyHistogram()
    agent_steps: dict[int, int] = {}
    samples: list[str] = []
    for record in records:
        for kind, count in record["turn_ends"].items():
            turn_ends[kind] = turn_ends.get(kind, 0) + count
        histogram.merge({int(bucket): count for bucket, count in record["latency"].items()})
        turns.merge({int(bucket): count for bucket, count in record["turn_latency"].items()})
        for steps_held, count in record["agent_steps"].items():
            agent_steps[int(steps_held)] = agent_steps.get(int(steps_held), 0) + int(count)
        samples.extend(record["samples"][: max(0, 5 - len(samples))])
    steps = sum(record["steps"] for record in records)
    wall_s = phases.seconds[RUNNING]
    summary = SimSummary(
        **run_fields(options, url, turn_ends, steps, wall_s),
        events=sum(record["events"] for record in records),
        create_s=phases.seconds[CREATING],
        close_s=max(record["close_s"] for record in records),
        check_s=phases.seconds[CHECKING],
        **latency_fields(histogram.percentile, turns.percentile),
        mb_per_agent=sum(record["rss_growth"] for record in records) / options.agents / 1e6,
        violations=sum(record["violations"] for record in records),
        violation_samples=tuple(samples),
        replies_digest=f"{sum(r['digest'] for r in records) % DIGEST_MODULUS:016x}",
    )
    figures = RunFigures(
        mode="memory shards",
        start=0.0,
        processes=tuple(record["series"] for record in records),
        phases=(),
        turn_histogram=turns.counts,
        agent_steps=dict(sorted(agent_steps.items())),
    )
    return summary, figures
