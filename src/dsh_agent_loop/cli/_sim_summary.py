"""The figures ``dsh-agent simulate`` reports: its summary record, table, exit code and JSON.

One summary whatever ran the agents: the verb's own process, or ``--workers N`` processes whose
shard records ``_sim_workers.py`` merges. What a merge needs is kept mergeable: counts add up,
step latencies and turn durations go into ``LatencyHistogram``s (buckets 1% wide, so a shard's
record stays small at any number of agents), and the conversations are summed into
``replies_digest`` (a sum of per-session digests, so the order in which shards or sessions are
added does not matter). ``summary_rows`` and ``summary_line`` are the table and closing line
both the terminal (``print_summary``) and the HTML report (``_sim_report.py``) show.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, final

import attrs
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._setup import EXIT_FAILED, EXIT_OK
from ._terminal import redact_url

__all__ = [
    "DEFAULT_CONCURRENCY",
    "LatencyHistogram",
    "SimSummary",
    "exit_code",
    "latency_fields",
    "percentile",
    "print_summary",
    "run_fields",
    "summary_line",
    "summary_rows",
    "write_json",
]

#: Agents running a turn at the same time unless ``--concurrency`` says otherwise.
DEFAULT_CONCURRENCY: Final = 256
#: Digests are summed modulo this (``replies_digest``).
DIGEST_MODULUS: Final = 2**64
#: Smallest latency a histogram tells apart (seconds); below it, one bucket.
_FLOOR_S: Final = 1e-6
#: Width of a histogram bucket: each is 1% wider than the one below it.
_GROWTH: Final = math.log(1.01)


@final
@attrs.frozen
class SimSummary:
    """The figures ``simulate`` reports (also its ``--json`` record)."""

    store: str
    """The store URL, its password shown as ``***``."""
    agents: int
    turns_total: int
    turns_completed: int
    turn_ends: Mapping[str, int]
    events: int
    steps: int
    wall_s: float
    """Seconds from prompting every agent to all of them idle."""
    create_s: float
    """Seconds spent creating the agents (before prompting)."""
    close_s: float
    """Seconds spent closing the runtime (disposing the idle agents, closing the store)."""
    check_s: float
    """Seconds spent reading every session back and checking it."""
    steps_per_s: float
    step_p50_ms: float
    step_p99_ms: float
    turn_p50_ms: float = attrs.field(default=0.0, kw_only=True)
    """Turn duration (``turn/start`` to ``turn/end`` in the stored log), median."""
    turn_p90_ms: float = attrs.field(default=0.0, kw_only=True)
    turn_p99_ms: float = attrs.field(default=0.0, kw_only=True)
    mb_per_agent: float
    """Resident memory growth per live agent."""
    violations: int
    violation_samples: tuple[str, ...]
    seed: int
    tools: int
    latency_ms: float
    concurrency: int = DEFAULT_CONCURRENCY
    """Agents running a turn at the same time (0: every agent at once), in each worker."""
    workers: int = 1
    """Processes the agents ran in (``--workers``)."""
    activations: tuple[int, ...] = ()
    """Sessions each fleet worker activated (a run on a shared store; empty otherwise)."""
    worker_peak_mb: tuple[float, ...] = ()
    """Peak resident memory of each fleet worker, MB (a run on a shared store)."""
    replies_digest: str = ""
    """A digest of every session's prompts, replies and tool-call arguments, whatever the order
    the sessions ran in: two seeded runs (with any number of workers) that held the same
    conversations show the same digest."""

    def to_json(self) -> dict[str, Any]:
        """The JSON record."""
        return attrs.asdict(self, recurse=True)

    @property
    def ok(self) -> bool:
        """Every turn completed and no invariant was violated."""
        return self.violations == 0 and self.turns_completed == self.turns_total


class RunShape(Protocol):
    """What ``run_fields`` reads of a run's options (``SimOptions``)."""

    @property
    def agents(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def tools(self) -> int: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def workers(self) -> int: ...


def run_fields(
    options: RunShape, url: str, turn_ends: Mapping[str, int], steps: int, wall_s: float
) -> dict[str, Any]:
    """The ``SimSummary`` fields every way of running fills alike, as keyword arguments.

    The options the run was asked for, the store (its password hidden), the turn ends and the
    step rate; each runner adds its own timings, latencies, memory and digest.
    """
    return {
        "store": redact_url(url),
        "agents": options.agents,
        "turns_total": options.agents * options.turns,
        "turns_completed": turn_ends.get("completed", 0),
        "turn_ends": dict(sorted(turn_ends.items())),
        "steps": steps,
        "wall_s": wall_s,
        "steps_per_s": steps / wall_s if wall_s > 0 else 0.0,
        "seed": options.seed,
        "tools": options.tools,
        "latency_ms": options.latency_ms,
        "concurrency": options.concurrency,
        "workers": options.workers,
    }


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """The value at ``fraction`` of the sorted ``ordered`` (nearest rank); 0 when empty."""
    if not ordered:
        return 0.0
    return ordered[_rank(len(ordered), fraction)]


def latency_fields(
    step: Callable[[float], float], turn: Callable[[float], float]
) -> dict[str, Any]:
    """The ``SimSummary`` latency fields (ms), as keyword arguments.

    Args:
        step: the seconds at a fraction of the step latencies (``percentile`` of the sorted
            latencies, or a ``LatencyHistogram``'s ``percentile``).
        turn: the same of the turn durations.
    """
    return {
        "step_p50_ms": step(0.50) * 1000,
        "step_p99_ms": step(0.99) * 1000,
        "turn_p50_ms": turn(0.50) * 1000,
        "turn_p90_ms": turn(0.90) * 1000,
        "turn_p99_ms": turn(0.99) * 1000,
    }


def _rank(count: int, fraction: float) -> int:
    return min(count - 1, max(0, round(fraction * count) - 1))


@final
@attrs.define
class LatencyHistogram:
    """Step latencies in buckets 1% wide: a shard's record whatever its number of steps.

    A percentile read from it is within 1% of the exact one (the bucket's geometric middle).
    """

    counts: dict[int, int] = attrs.field(factory=dict)

    @classmethod
    def of(cls, seconds: Iterable[float]) -> LatencyHistogram:
        """The histogram of ``seconds``."""
        histogram = cls()
        counts = histogram.counts
        for value in seconds:
            bucket = int(math.log(value / _FLOOR_S) / _GROWTH) if value > _FLOOR_S else 0
            counts[bucket] = counts.get(bucket, 0) + 1
        return histogram

    def merge(self, other: Mapping[int, int]) -> None:
        """Add the bucket counts ``other``."""
        for bucket, count in other.items():
            self.counts[bucket] = self.counts.get(bucket, 0) + count

    @staticmethod
    def value(bucket: int) -> float:
        """The seconds bucket ``bucket`` stands for: its geometric middle."""
        return _FLOOR_S * math.exp((bucket + 0.5) * _GROWTH) if bucket else _FLOOR_S

    def percentile(self, fraction: float) -> float:
        """Seconds at ``fraction`` of the values, ranked as ``percentile`` ranks them."""
        total = sum(self.counts.values())
        if not total:
            return 0.0
        rank = _rank(total, fraction)
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen > rank:
                return self.value(bucket)
        raise AssertionError("unreachable: the rank is below the total")


def summary_rows(summary: SimSummary) -> tuple[tuple[str, str], ...]:
    """The summary table's rows, ``(name, value)``, as the terminal and the report show them."""
    return (
        ("agents", f"{summary.agents:,}"),
        ("turns completed", f"{summary.turns_completed:,} / {summary.turns_total:,}"),
        ("events", f"{summary.events:,}"),
        ("steps", f"{summary.steps:,} in {summary.wall_s:.2f} s"),
        ("steps/s", f"{summary.steps_per_s:,.0f}"),
        ("step latency p50", f"{summary.step_p50_ms:.1f} ms"),
        ("step latency p99", f"{summary.step_p99_ms:.1f} ms"),
        (
            "turn p50 / p90 / p99",
            f"{summary.turn_p50_ms:.1f} / {summary.turn_p90_ms:.1f} / {summary.turn_p99_ms:.1f} ms",
        ),
        ("RSS per live agent", f"{summary.mb_per_agent:.3f} MB"),
        ("violations", str(summary.violations)),
    )


def summary_line(summary: SimSummary) -> str:
    """The line under the table: the other phases' seconds and what the run was asked for."""
    workers = f", {summary.workers} workers" if summary.workers > 1 else ""
    return (
        f"agents created in {summary.create_s:.2f} s, runtime closed in {summary.close_s:.2f} s, "
        f"logs read back and checked in {summary.check_s:.2f} s; seed {summary.seed}, "
        f"{summary.tools} tool steps per turn, {summary.latency_ms:g} ms per chunk, "
        f"{_width(summary)} in a turn at once{workers}"
    )


def print_summary(summary: SimSummary, console: Console) -> None:
    """The summary table, then any violation samples and unfinished turns."""
    # The store URL on a line of its own: a table title would wrap it at the table's width.
    console.print(Text(f"simulate on {summary.store}", style="bold"), soft_wrap=True)
    table = Table()
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("", justify="right", overflow="fold")
    table.show_header = False
    for name, value in summary_rows(summary):
        table.add_row(name, value)
    console.print(table)
    console.print(summary_line(summary), soft_wrap=True, highlight=False)
    if summary.activations:
        each = ", ".join(
            f"{n:,} ({mb:,.0f} MB peak)"
            for n, mb in zip(summary.activations, summary.worker_peak_mb, strict=False)
        )
        console.print(f"fleet workers activated sessions: {each}", soft_wrap=True, highlight=False)
    for sample in summary.violation_samples:
        console.print(f"violation: {sample}", soft_wrap=True, markup=False, highlight=False)
    if summary.turns_completed != summary.turns_total:
        ends = ", ".join(f"{kind} {count}" for kind, count in summary.turn_ends.items())
        console.print(f"not every turn completed: {ends}", soft_wrap=True, markup=False)


def _width(summary: SimSummary) -> str:
    each = " per worker" if summary.workers > 1 else ""
    if summary.concurrency and summary.concurrency * summary.workers < summary.agents:
        return f"at most {summary.concurrency:,} agents{each}"
    return "every agent"


def exit_code(summary: SimSummary) -> int:
    """1 only on invariant violations; turns that did not complete are reported.

    See docs/design.md#exit-codes.
    """
    return EXIT_FAILED if summary.violations else EXIT_OK


def write_json(summary: SimSummary, path: str) -> None:
    """Write the summary as JSON to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary.to_json(), f, indent=2)
        f.write("\n")
