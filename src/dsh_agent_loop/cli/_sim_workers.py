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
  of agents (latencies as a ``LatencyHistogram``, at most 5 violation samples).

Its environment names its shard in ``$DSH_AGENT_SIM_SHARD`` (``0`` … ``N-1``), for its tools.

The parent reads every worker's lines as they come and draws one set of bars: a bar starts
when the first worker begins its phase and stops when the last one ends it, so the merged
summary's seconds are the phases' spans across workers, read from the same clock as the bars.
A worker's stderr is kept (its last ``STDERR_TAIL`` lines) and shown after the bars, each line
after ``shard I:``. A worker that exits non-zero or without its summary fails the run: the
parent says which shard and prints the worker's last stderr lines, and the other workers are
cancelled (``trio.run_process`` terminates and reaps them); Ctrl-C cancels them the same way.
Workers run in sessions of their own, so a terminal's Ctrl-C reaches the parent only, which
ends them: nothing is left behind.

A store shared by the workers (SQLite, PostgreSQL) needs the fleet, which is not built yet:
such a run is refused as bad usage before any process starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final, TextIO, final

import attrs
import trio
from rich.console import Console
from rich.progress import Progress

from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ..stores import parse_store_url
from ._setup import EXIT_OK, CliError
from ._sim_summary import DIGEST_MODULUS, LatencyHistogram, SimSummary
from ._simulate import CHECKING, CREATING, RUNNING, Counts, SimOptions, refresh, sim_bars, simulate
from ._terminal import redact_url

__all__ = [
    "MAX_WORKERS",
    "SHARD_VARIABLE",
    "parse_shard",
    "run_shard",
    "run_workers",
    "shard_count",
]

#: The most worker processes ``--workers`` takes.
MAX_WORKERS: Final = 64
#: The environment variable holding a worker's shard index (``0`` … ``N-1``), for its tools.
SHARD_VARIABLE: Final = "DSH_AGENT_SIM_SHARD"
#: Stderr lines of a worker kept to show when it fails.
STDERR_TAIL: Final = 20
#: The longest report line a worker may write (bytes); a longer one fails the worker.
_MAX_LINE: Final = 1 << 20
#: Characters kept of one stderr line.
_MAX_STDERR_LINE: Final = 500


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
        CliError: more than one worker on a store that is not ``memory:`` (exit 2).
    """
    count = min(workers or os.cpu_count() or 1, MAX_WORKERS, agents)
    if count > 1 and parse_store_url(url).scheme != "memory":
        raise CliError(
            f"simulate: --workers {count} on {redact_url(url)}: sharing a SQLite or PostgreSQL "
            "store across simulation workers needs the fleet, which is not built yet; use "
            "--store memory: or --workers 1"
        )
    return count


# -- the worker side --------------------------------------------------------------------------


@final
class _Reporting(Counts):
    """``Counts`` that report to the parent as JSON lines instead of drawing bars."""

    __slots__ = ("out", "sent")

    def __init__(self, out: TextIO) -> None:
        progress = Progress(disable=True, auto_refresh=False, get_time=time.perf_counter)
        super().__init__(progress, [progress.add_task("", start=False) for _ in range(3)])
        self.out = out
        self.sent = [0, 0, 0]

    def emit(self, record: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.out.flush()

    def begin(self, index: int) -> None:
        super().begin(index)
        self.emit({"sim": "begin", "phase": index})

    def end(self, index: int) -> float:
        self.sync()  # the counts first: the parent's bar is full when it stops
        elapsed = super().end(index)
        self.emit({"sim": "end", "phase": index})
        return elapsed

    def sync(self) -> None:
        counts = [done - sent for done, sent in zip(self.done, self.sent, strict=True)]
        if any(counts):
            self.sent = list(self.done)
            self.emit({"sim": "done", "counts": counts})


def run_shard(
    shard: tuple[int, int],
    options: SimOptions,
    store: SessionStore,
    settings: Mapping[str, Any],
    config: RuntimeConfig | None,
    tools: Sequence[Tool],
    out: TextIO = sys.stdout,
) -> int:
    """Run shard ``shard`` (``(I, N)``) of ``options``' agents, reporting on ``out``; exit 0."""
    options = attrs.evolve(options, shard=shard[0], workers=shard[1])
    counts = _Reporting(out)
    run, tally = trio.run(partial(simulate, options, store, settings, counts, config, tools))
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
            "violations": tally.violations,
            "samples": tally.samples,
            "digest": tally.digest,
        }
    )
    return EXIT_OK


# -- the parent side --------------------------------------------------------------------------


@attrs.define
class _Worker:
    """One worker process as the parent sees it."""

    shard: int
    record: dict[str, Any] | None = None
    stderr: deque[str] = attrs.field(factory=lambda: deque(maxlen=STDERR_TAIL))
    failure: str = ""


@final
class _WorkerFailed(Exception):
    def __init__(self, worker: _Worker, why: str) -> None:
        super().__init__(why)
        self.worker = worker
        self.why = why


@attrs.define
class _Phases:
    """The merged bars: begun by the first worker, ended by the last."""

    counts: Counts
    workers: int
    begun: list[bool] = attrs.field(factory=lambda: [False] * 3)
    ended: list[int] = attrs.field(factory=lambda: [0] * 3)
    seconds: list[float] = attrs.field(factory=lambda: [0.0] * 3)

    def take(self, record: Mapping[str, Any], worker: _Worker) -> None:
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


@final
class _Lines:
    """The lines of a byte stream, fed its chunks; one longer than ``limit`` is cut there."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = b""

    def feed(self, chunk: bytes | bytearray) -> list[bytes]:
        """The lines ``chunk`` completes (without their newline)."""
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        if len(self.pending) > self.limit:
            lines.append(self.pending)
            self.pending = b""
        return lines

    def end(self) -> list[bytes]:
        """The last line, had it no newline."""
        rest, self.pending = self.pending, b""
        return [rest] if rest else []


async def _read_reports(stream: trio.abc.ReceiveStream, worker: _Worker, phases: _Phases) -> None:
    lines = _Lines(_MAX_LINE)
    async for chunk in stream:
        for line in lines.feed(chunk):
            _take(line, worker, phases)
    for line in lines.end():
        _take(line, worker, phases)


def _take(line: bytes, worker: _Worker, phases: _Phases) -> None:
    if len(line) > _MAX_LINE:
        raise _WorkerFailed(worker, f"wrote a report line longer than {_MAX_LINE:,} bytes")
    try:
        record = json.loads(line)
    except ValueError:
        return  # not a report (a tool printing on stdout): not ours to read
    if isinstance(record, dict) and "sim" in record:
        try:
            phases.take(record, worker)
        except (LookupError, TypeError, ValueError):
            raise _WorkerFailed(worker, f"wrote a malformed report: {line[:200]!r}") from None


async def _keep_tail(stream: trio.abc.ReceiveStream, worker: _Worker) -> None:
    lines = _Lines(_MAX_STDERR_LINE)
    async for chunk in stream:
        for line in lines.feed(chunk):
            worker.stderr.append(line[:_MAX_STDERR_LINE].decode(errors="replace"))
    for line in lines.end():
        worker.stderr.append(line[:_MAX_STDERR_LINE].decode(errors="replace"))


async def _watch(command: Sequence[str], worker: _Worker, phases: _Phases) -> None:
    """Run one worker to its end; ``_WorkerFailed`` when it fails."""
    env = {**os.environ, SHARD_VARIABLE: str(worker.shard)}
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C is the parent's to handle
            )
        )
        assert process.stdout is not None
        assert process.stderr is not None
        nursery.start_soon(_keep_tail, process.stderr, worker)
        await _read_reports(process.stdout, worker, phases)
    if process.returncode != 0:
        raise _WorkerFailed(worker, f"exited with code {process.returncode}")
    if worker.record is None:
        raise _WorkerFailed(worker, "exited without its summary")


def run_workers(
    options: SimOptions, url: str, command: Sequence[str], console: Console, errors: Console
) -> SimSummary | None:
    """Run ``options.workers`` workers (``command`` plus ``--shard I/N``); the merged summary.

    None when a worker failed: which one and its last stderr lines are on ``errors``.
    """
    counts = sim_bars(console, options)
    phases = _Phases(counts, options.workers)
    workers = [_Worker(shard) for shard in range(options.workers)]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refresh, counts)
            async with trio.open_nursery() as running:
                for worker in workers:
                    shard = ["--shard", f"{worker.shard}/{options.workers}"]
                    running.start_soon(_watch, [*command, *shard], worker, phases)
            nursery.cancel_scope.cancel()

    failed: _WorkerFailed | None = None
    try:
        with counts.progress:
            trio.run(main)
    except* _WorkerFailed as group:
        failed = _first_failure(group)
    if failed is not None:
        _report_failure(failed, options.workers, errors)
        return None
    for worker in workers:  # what they logged (warnings), after the bars
        for line in worker.stderr:
            errors.print(f"shard {worker.shard}: {line}", soft_wrap=True, markup=False)
    return _merge(options, url, workers, phases)


def _first_failure(group: BaseExceptionGroup[_WorkerFailed]) -> _WorkerFailed:
    leaves: list[_WorkerFailed] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        elif isinstance(error, _WorkerFailed):
            leaves.append(error)
    return min(leaves, key=lambda error: error.worker.shard)


def _report_failure(failed: _WorkerFailed, workers: int, errors: Console) -> None:
    worker = failed.worker
    tail = list(worker.stderr)
    said = f"; its last {len(tail)} stderr lines:" if tail else " (nothing on stderr)"
    lines = [f"simulate: the worker of shard {worker.shard} of {workers} {failed.why}{said}"]
    lines.extend(f"  {line}" for line in tail)
    for line in lines:
        errors.print(line, soft_wrap=True, markup=False, highlight=False)


def _merge(
    options: SimOptions, url: str, workers: Sequence[_Worker], phases: _Phases
) -> SimSummary:
    """One summary of the shards' records: sums, merged latencies, the phases' spans."""
    records = [worker.record for worker in workers if worker.record is not None]
    turn_ends: dict[str, int] = {}
    histogram = LatencyHistogram()
    samples: list[str] = []
    for record in records:
        for kind, count in record["turn_ends"].items():
            turn_ends[kind] = turn_ends.get(kind, 0) + count
        histogram.merge({int(bucket): count for bucket, count in record["latency"].items()})
        samples.extend(record["samples"][: max(0, 5 - len(samples))])
    steps = sum(record["steps"] for record in records)
    wall_s = phases.seconds[RUNNING]
    return SimSummary(
        store=redact_url(url),
        agents=options.agents,
        turns_total=options.agents * options.turns,
        turns_completed=turn_ends.get("completed", 0),
        turn_ends=dict(sorted(turn_ends.items())),
        events=sum(record["events"] for record in records),
        steps=steps,
        wall_s=wall_s,
        create_s=phases.seconds[CREATING],
        close_s=max(record["close_s"] for record in records),
        check_s=phases.seconds[CHECKING],
        steps_per_s=steps / wall_s if wall_s > 0 else 0.0,
        step_p50_ms=histogram.percentile(0.50) * 1000,
        step_p99_ms=histogram.percentile(0.99) * 1000,
        mb_per_agent=sum(record["rss_growth"] for record in records) / options.agents / 1e6,
        violations=sum(record["violations"] for record in records),
        violation_samples=tuple(samples),
        seed=options.seed,
        tools=options.tools,
        latency_ms=options.latency_ms,
        concurrency=options.concurrency,
        workers=options.workers,
        replies_digest=f"{sum(r['digest'] for r in records) % DIGEST_MODULUS:016x}",
    )
