"""What ``dsh-agent simulate`` measures over time, per process, for its ``--report``.

A ``Sampler`` runs as a trio task beside the run and takes one ``Point`` every ``SAMPLE_S``
seconds (and one as it starts and one as it stops): seconds since it started, steps begun so
far (model calls answered: ``Sampler.counted`` wraps the scripted model's reply function),
turns done so far (the run's own ``agent/turn-stopping`` counter), resident memory, and the
seconds spent in and the collections made by the cyclic garbage collector (timed by a
``gc.callbacks`` hook while the sampler runs) with whether the collector is enabled. Every
figure but memory is a running total, so dropping points loses resolution, never a count: past
``MAX_POINTS`` points every other one is dropped and the interval doubled, which bounds a
process's series (and its report line) at any run length. A sample is a few reads and one
``/proc`` read (tens of µs); the counter adds one increment to each step.

Each process of a ``--workers`` run samples its own series and reports it with its summary; the
parent places them on its own time line by their wall-clock anchors (``time.time()`` at each
sampler's start: ``perf_counter``'s reference point is the process's own). Steps and turns of
the processes that run agents are summed per time bucket (``throughput``); memory and the
collector are kept per process (a sum of resident sets counts shared pages twice).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar, final

import attrs
import trio

from ._sim_summary import SimSummary

__all__ = [
    "MAX_POINTS",
    "SAMPLE_S",
    "Phase",
    "Point",
    "ProcessSeries",
    "RunFigures",
    "Sampler",
    "SimResult",
    "Throughput",
    "phases_of",
    "rss_bytes",
    "throughput",
]

#: Seconds between samples at first (doubled each time the series is thinned).
SAMPLE_S: Final = 0.1
#: Points a series holds before every other one is dropped.
MAX_POINTS: Final = 2000
#: Buckets ``throughput`` splits a run into, at most (fewer when samples are further apart).
RATE_BUCKETS: Final = 100
#: Points a reported series may carry (a worker's report is outside input).
_MAX_RECORD_POINTS: Final = MAX_POINTS + 2
#: Characters kept of a label or a phase name.
_MAX_LABEL: Final = 100

_Request = TypeVar("_Request")
_Reply = TypeVar("_Reply")


def rss_bytes() -> int:
    """Resident memory of this process now (on Linux; its peak elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best available figure
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


@final
@attrs.frozen
class Point:
    """One sample; every figure but ``rss`` is a running total since the sampler started."""

    t: float
    """Seconds since the sampler started."""
    steps: int
    turns: int
    rss: int
    """Resident bytes."""
    gc_s: float
    """Seconds spent in the cyclic collector."""
    gc_n: int
    """Collections made."""
    gc_on: bool
    """The collector was enabled at this sample."""

    def to_list(self) -> list[float | int]:
        """The point as a JSON list (a report line holds up to ``MAX_POINTS`` of them)."""
        gc_s = round(self.gc_s, 6)
        return [round(self.t, 4), self.steps, self.turns, self.rss, gc_s, self.gc_n, +self.gc_on]

    @classmethod
    def of_list(cls, raw: Any) -> Point:
        """The point of ``to_list``'s list ``raw``.

        Raises:
            ValueError: ``raw`` is not such a list.
        """
        if not isinstance(raw, list) or len(raw) != 7:
            raise ValueError(f"bad sample {raw!r:.80}")
        if not all(type(n) in (int, float) and math.isfinite(n) for n in raw):
            raise ValueError(f"bad sample {raw!r:.80}")
        t, steps, turns, rss, gc_s, gc_n, gc_on = raw
        return cls(float(t), int(steps), int(turns), int(rss), float(gc_s), int(gc_n), bool(gc_on))


@final
@attrs.frozen
class ProcessSeries:
    """One process's samples, and where its time line starts on the wall clock."""

    label: str
    """What the report calls the process (``this process``, ``shard 1``, ``parent``)."""
    start: float
    """``time.time()`` at the sampler's start: ``t = 0`` of its points."""
    interval_s: float
    """Seconds between its samples when it stopped."""
    points: tuple[Point, ...]
    runs_agents: bool = True
    """Its steps and turns count (a parent that only starts workers runs none)."""

    def to_record(self) -> dict[str, Any]:
        """The series as a worker reports it (its label is the parent's to give)."""
        points = [point.to_list() for point in self.points]
        return {"start": self.start, "interval_s": self.interval_s, "points": points}

    @classmethod
    def of_record(cls, record: Any, label: str) -> ProcessSeries:
        """The series a worker reported as ``record``, named ``label``.

        Raises:
            ValueError: ``record`` is not a series ``to_record`` could have written.
        """
        if not isinstance(record, dict) or not isinstance(record.get("points"), list):
            raise ValueError("a series without points")
        if len(record["points"]) > _MAX_RECORD_POINTS:
            raise ValueError(f"a series of more than {_MAX_RECORD_POINTS} points")
        start, interval = _number(record.get("start")), _number(record.get("interval_s"))
        if interval <= 0:
            raise ValueError(f"a series sampled every {interval} s")
        points = tuple(Point.of_list(raw) for raw in record["points"])
        return cls(label[:_MAX_LABEL], start, interval, points)


def _number(raw: Any) -> float:
    """``raw`` as a finite number.

    Raises:
        ValueError: it is not one.
    """
    if type(raw) not in (int, float) or not math.isfinite(raw):
        raise ValueError(f"not a number: {raw!r:.40}")
    return float(raw)


@final
@attrs.define(eq=False)
class Sampler:
    """Samples this process every ``interval_s`` while ``run`` runs (see the module docstring)."""

    turns: Callable[[], int] = attrs.field(default=lambda: 0)
    """The run's count of turns done so far."""
    interval_s: float = SAMPLE_S
    steps: int = 0
    """Model calls answered so far: bumped by the function ``counted`` returns."""
    points: list[Point] = attrs.field(factory=list)
    start: float = 0.0
    """``time.time()`` when ``run`` started."""
    perf0: float = 0.0
    """``time.perf_counter()`` when ``run`` started: the run's bars read the same clock."""
    gc_s: float = 0.0
    gc_n: int = 0
    _gc_began: float = 0.0
    _collecting: bool = False

    def counted(self, reply: Callable[[_Request], _Reply]) -> Callable[[_Request], _Reply]:
        """``reply``, counting each call in ``steps`` (one call a step)."""

        def counting(request: _Request) -> _Reply:
            self.steps += 1
            return reply(request)

        return counting

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Sample at once (then ``started``), every ``interval_s``, and once more when cancelled."""
        self.start, self.perf0 = time.time(), time.perf_counter()
        on_gc = self._on_gc
        gc.callbacks.append(on_gc)
        try:
            self.sample()
            task_status.started()
            while True:
                await trio.sleep(self.interval_s)
                self.sample()
        finally:
            gc.callbacks.remove(on_gc)
            self.sample()

    def _on_gc(self, phase: str, info: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_began = now
            self._collecting = True
        else:
            self.gc_s += now - self._gc_began
            self.gc_n += 1
            self._collecting = False

    def sample(self) -> None:
        """Take one point now; thin the series when it is over ``MAX_POINTS``."""
        now = time.perf_counter()
        if self._collecting:
            # A collection started in another thread (a store's worker thread) that let this
            # one run: its time so far belongs to the intervals it has already spanned.
            self.gc_s += now - self._gc_began
            self._gc_began = now
        point = Point(
            now - self.perf0,
            self.steps,
            self.turns(),
            rss_bytes(),
            self.gc_s,
            self.gc_n,
            gc.isenabled(),
        )
        self.points.append(point)
        if len(self.points) > MAX_POINTS:
            del self.points[1::2]
            self.interval_s *= 2

    def series(self, label: str, *, runs_agents: bool = True) -> ProcessSeries:
        """The samples so far, as ``label``'s series."""
        return ProcessSeries(label, self.start, self.interval_s, tuple(self.points), runs_agents)


@final
@attrs.frozen
class Phase:
    """A phase of the run (a bar of the progress display) on the run's time line."""

    name: str
    begin_s: float
    end_s: float


def phases_of(
    spans: Sequence[tuple[str, float | None, float | None]], perf0: float
) -> tuple[Phase, ...]:
    """The phases of ``spans`` (name, ``perf_counter`` start and stop) that ran, from ``perf0``."""
    return tuple(
        Phase(name[:_MAX_LABEL], begin - perf0, end - perf0)
        for name, begin, end in spans
        if begin is not None and end is not None
    )


@final
@attrs.frozen
class RunFigures:
    """What a run measured besides its summary: the report's charts are drawn from it."""

    mode: str
    """How the agents ran: ``one process``, ``memory shards`` or ``fleet``."""
    start: float
    """Wall-clock time of the time line's 0 (the sampler of the process that drew the bars)."""
    processes: tuple[ProcessSeries, ...]
    phases: tuple[Phase, ...]
    turn_histogram: Mapping[int, int]
    """Turn durations, as ``LatencyHistogram`` bucket counts."""
    agent_steps: Mapping[int, int]
    """Agents by the steps their session holds."""


@final
@attrs.frozen
class SimResult:
    """A finished run: its summary and the figures its report draws."""

    summary: SimSummary
    figures: RunFigures


@final
@attrs.frozen
class Throughput:
    """Steps and turns per second of every process that runs agents, summed per bucket."""

    bucket_s: float
    steps: tuple[tuple[float, float], ...]
    """``(middle of the bucket, steps/s)`` on the run's time line."""
    turns: tuple[tuple[float, float], ...]


def throughput(processes: Sequence[ProcessSeries], origin: float) -> Throughput:
    """The summed rates of ``processes`` (those that run agents), ``origin`` their time 0.

    Each process's running totals are interpolated linearly at the bucket edges, summed, and
    differenced: a process that started late counts nothing before its first sample.
    """
    tracks = [p for p in processes if p.runs_agents and len(p.points) > 1]
    if not tracks:
        return Throughput(SAMPLE_S, (), ())
    offsets = [p.start - origin for p in tracks]
    times = [
        [point.t + offset for point in p.points] for p, offset in zip(tracks, offsets, strict=True)
    ]
    end = max(t[-1] for t in times)
    bucket = max(max(p.interval_s for p in tracks), end / RATE_BUCKETS, 1e-3)
    edges = [i * bucket for i in range(math.ceil(end / bucket) + 1)]
    middles = [(a + b) / 2 for a, b in itertools.pairwise(edges)]

    def rates(figure: Callable[[Point], int]) -> tuple[tuple[float, float], ...]:
        values = [[figure(point) for point in p.points] for p in tracks]
        totals = [
            sum(_at(t, v, edge) for t, v in zip(times, values, strict=True)) for edge in edges
        ]
        pairs = zip(middles, itertools.pairwise(totals), strict=True)
        return tuple((middle, (b - a) / bucket) for middle, (a, b) in pairs)

    return Throughput(bucket, rates(lambda p: p.steps), rates(lambda p: p.turns))


def _at(times: Sequence[float], values: Sequence[int], t: float) -> float:
    """The running total ``values`` (sampled at ``times``) at ``t``, interpolated linearly."""
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0.0
    if i == len(times):
        return float(values[-1])
    t0, t1 = times[i - 1], times[i]
    share = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
    return values[i - 1] + (values[i] - values[i - 1]) * share
