"""The scale benchmark: per-step cost against the number of agents, beside the pure-trio reference.

Run ``python -m dsh_agent_loop.bench.scale [--full] [--sizes N,N,...] [--gc-freeze] [--json
PATH]`` (in a source checkout, ``scripts/bench/scale.py`` is a wrapper around it); ``dsh-agent
bench`` without ``--quick`` runs its default sizes too.

For each size N (default 100, 1,000, 2,000 and 10,000; ``--full`` adds 100,000), N agents are
created first (untimed), then all are prompted at once and each runs one turn of 5 steps (4
steps calling a trivial tool, then a text reply) on the scripted model and a memory store, with
the collector at its default settings. The reference is ``bench.loop.reference_loop`` at the same
counts: N concurrent pure-trio loops of 5 steps with one trivial tool each. Every figure comes
from the same run of this benchmark: each (size, side) runs in a child process of its own
(``python -m dsh_agent_loop.bench.scale --child ...``), so its peak RSS (``ru_maxrss``) is that
size's, and the two sides alternate so that load on the machine hits both. Small sizes are
repeated (best of up to 5) because one run lasts milliseconds.

Reported per size and side: steps/s, µs per step (wall time / steps, all agents running at
once), the share of the timed wall time spent in the cyclic collector (``gc.callbacks`` start
to stop), collections run, and peak RSS. Then the growth of µs/step from 100 to 10,000 agents
for both sides and ours against the reference's. Targets (benchmarks, not tests): our growth
≤ 1.3× the reference's; throughput ≥ 25% of the reference at 2,000 and 10,000 agents; GC share
≤ 10%. ``--gc-freeze`` calls ``Runtime.gc_freeze()`` after creating the agents (the policy
``docs/scale.md`` describes), to measure what it buys; ``--gc-threshold N`` sets the collector's
young-generation threshold to N in both sides' processes (what an application may choose).
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from dsh_agent_loop import AgentOptions, open_runtime, tool
from dsh_agent_loop.bench.loop import reference_loop, report
from dsh_agent_loop.llm import ModelRequest, Reply, ScriptedModel
from dsh_agent_loop.stores import MemoryStore

__all__ = ["TARGETS", "GcClock", "measure", "run_scale_bench", "scale_rows"]

#: Steps per agent: 4 tool steps, then text (``dsh-agent simulate --tools 4``).
STEPS = 5
#: Sizes measured by default, and with ``--full``.
SIZES = (100, 1_000, 2_000, 10_000)
FULL_SIZES = (*SIZES, 100_000)
#: The sizes whose µs/step the growth ratio compares.
GROWTH_FROM, GROWTH_TO = 100, 10_000
#: The sizes the throughput target applies to.
SHARE_SIZES = (2_000, 10_000)
#: The scale benchmark's targets (docs/scale.md#the-scale-benchmark), ``dsh-agent bench`` row key →
#: bound.
TARGETS = {"scale_growth": 1.3, "scale_share": 0.25, "scale_gc": 0.10}
#: What a child process runs (``python -m``): this module, from the same package as its parent.
MODULE = "dsh_agent_loop.bench.scale"
#: Steps a size's runs should add up to at least (small sizes are repeated, at most 5 times).
MIN_STEPS = 50_000


@tool
async def noop(n: int = 0) -> str:
    """Do nothing and say so."""
    return "ok"


class GcClock:
    """Wall time the cyclic collector spends while ``running`` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.running = False
        self._start = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self.running:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1


class _Model:
    """Per agent: ``STEPS - 1`` tool steps, then text; decided by the request, no request log."""

    def __init__(self) -> None:
        self._call = Reply.tool_calls(("noop", {}))
        self._done = Reply.text("done")
        self._inner = ScriptedModel([self._reply], loop=True, record=False)

    def _reply(self, request: ModelRequest) -> Reply:
        assistant = sum(1 for m in request.messages if m["role"] == "assistant")
        return self._call if assistant % STEPS < STEPS - 1 else self._done

    async def prepare_call(self, config: Any) -> Any:
        return await self._inner.prepare_call(config)

    async def aclose(self) -> None:
        pass


def ours(agents: int, clock: GcClock, freeze: bool = False) -> float:
    """Seconds for ``agents`` agents, created first (untimed), to run one 5-step turn each."""

    async def main() -> float:
        async with open_runtime(store=MemoryStore(), providers={"s": _Model()}, tools=[noop]) as rt:
            handles = [
                await rt.agents.create(options=AgentOptions(id=f"a{i}", provider="s", model="m"))
                for i in range(agents)
            ]
            if freeze:
                rt.gc_freeze()
            clock.running = True
            start = time.perf_counter()
            for h in handles:
                h.agent.followup("go")
            for h in handles:
                await h.agent.wait_idle()
            elapsed = time.perf_counter() - start
            clock.running = False
            steps = sum(h.agent.statistics().steps for h in handles)
            assert steps == agents * STEPS, (steps, agents * STEPS)
        return elapsed

    return trio.run(main)


def reference(agents: int, clock: GcClock, freeze: bool = False) -> float:
    """Seconds for ``agents`` concurrent pure-trio reference loops of 5 steps, 1 tool each.

    ``freeze`` is ignored: the reference has nothing of ours to freeze.
    """
    clock.running = True
    try:
        return reference_loop(STEPS, agents=agents)
    finally:
        clock.running = False


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure(side: str, agents: int, freeze: bool = False) -> dict[str, Any]:
    """Best of the repeated runs of one side at one size, in this process."""
    repeat = max(1, min(5, MIN_STEPS // (agents * STEPS)))
    best: tuple[float, GcClock] | None = None
    for _ in range(repeat):
        gc.collect()
        with GcClock() as clock:
            run = ours if side == "ours" else reference
            seconds = run(agents, clock, freeze)
        if best is None or seconds < best[0]:
            best = (seconds, clock)
    assert best is not None
    seconds, clock = best
    steps = agents * STEPS
    return {
        "side": side,
        "agents": agents,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "us_per_step": seconds / steps * 1e6,
        "gc_s": clock.seconds,
        "gc_share": clock.seconds / seconds,
        "gc_collections": clock.collections,
        "peak_rss_mb": _peak_rss_mb(),
        "runs": repeat,
    }


def _child(side: str, agents: int, freeze: bool, threshold: int | None) -> dict[str, Any]:
    """``measure`` in a fresh interpreter (so its peak RSS is this size's alone)."""
    command = [sys.executable, "-m", MODULE, "--child", side, str(agents)]
    if freeze:
        command.append("--gc-freeze")
    if threshold is not None:
        command += ["--gc-threshold", str(threshold)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scale bench child {side} {agents} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def run_scale_bench(
    quick: bool = False,
    sizes: Sequence[int] | None = None,
    freeze: bool = False,
    progress: Callable[[str], None] | None = None,
    threshold: int | None = None,
) -> dict[str, Any]:
    """Measure every size (``quick``: up to 2,000 agents); returns the JSON record."""
    chosen = tuple(sizes or ((100, 1_000, 2_000) if quick else SIZES))
    result: dict[str, Any] = {
        "steps_per_agent": STEPS,
        "gc_freeze": freeze,
        "gc_threshold": threshold or gc.get_threshold()[0],
        "sizes": [],
    }
    for n in chosen:
        ref = _child("ref", n, False, threshold)
        mine = _child("ours", n, freeze, threshold)
        row = {
            "agents": n,
            "ours": mine,
            "ref": ref,
            "share": mine["steps_per_s"] / ref["steps_per_s"],
        }
        result["sizes"].append(row)
        if progress is not None:
            progress(_size_line(row))
    by_size = {row["agents"]: row for row in result["sizes"]}
    if GROWTH_FROM in by_size and GROWTH_TO in by_size:
        low, high = by_size[GROWTH_FROM], by_size[GROWTH_TO]
        growth = high["ours"]["us_per_step"] / low["ours"]["us_per_step"]
        ref_growth = high["ref"]["us_per_step"] / low["ref"]["us_per_step"]
        result["growth"] = {"ours": growth, "ref": ref_growth, "ratio": growth / ref_growth}
    return result


def _size_line(row: dict[str, Any]) -> str:
    o, r = row["ours"], row["ref"]
    return (
        f"{row['agents']:>7,} agents: ours {o['us_per_step']:7.1f} µs/step"
        f" (GC {o['gc_share']:4.0%}, {o['peak_rss_mb']:6.0f} MB)"
        f"  ref {r['us_per_step']:6.1f} µs/step"
        f" (GC {r['gc_share']:4.0%}, {r['peak_rss_mb']:5.0f} MB)"
        f"  {row['share']:4.0%} of ref"
    )


def scale_rows(result: dict[str, Any]) -> Iterator[tuple[str, str, str, str, str]]:
    """Table rows: workload, ours, reference, ratio, target."""
    for row in result["sizes"]:
        n, o, r = row["agents"], row["ours"], row["ref"]
        target = f"≥ {TARGETS['scale_share']:.0%}" if n in SHARE_SIZES else ""
        yield (
            f"{n:,} agents: steps/s (µs/step)",
            f"{o['steps_per_s']:,.0f} ({o['us_per_step']:.1f})",
            f"{r['steps_per_s']:,.0f} ({r['us_per_step']:.1f})",
            f"{row['share']:.0%} of ref",
            target,
        )
        yield (
            f"{n:,} agents: GC share, collections",
            f"{o['gc_share']:.1%}, {o['gc_collections']}",
            f"{r['gc_share']:.1%}, {r['gc_collections']}",
            "",
            f"≤ {TARGETS['scale_gc']:.0%}",
        )
        yield (
            f"{n:,} agents: peak RSS",
            f"{o['peak_rss_mb']:,.0f} MB",
            f"{r['peak_rss_mb']:,.0f} MB",
            f"{o['peak_rss_mb'] / r['peak_rss_mb']:.1f}×",
            "",
        )
    growth = result.get("growth")
    if growth is not None:
        yield (
            f"µs/step growth, {GROWTH_FROM:,} → {GROWTH_TO:,} agents",
            f"{growth['ours']:.2f}×",
            f"{growth['ref']:.2f}×",
            f"{growth['ratio']:.2f}× ref's",
            f"≤ {TARGETS['scale_growth']}× ref's",
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m dsh_agent_loop.bench.scale [options]`` (``--help``); returns the exit code."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--full", action="store_true", help="add 100,000 agents (minutes)")
    parser.add_argument("--quick", action="store_true", help="up to 2,000 agents")
    parser.add_argument("--sizes", help="comma-separated agent counts (overrides the defaults)")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="rt.gc_freeze() after creating the agents"
    )
    parser.add_argument(
        "--gc-threshold", type=int, metavar="N", help="gc.set_threshold(N, ...) in both sides"
    )
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gc_threshold is not None:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    if args.child:
        side, n = args.child
        print(json.dumps(measure(side, int(n), args.gc_freeze)))
        return 0
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")] if args.sizes else None
    if sizes is None and args.full:
        sizes = list(FULL_SIZES)
    result = run_scale_bench(
        quick=args.quick,
        sizes=sizes,
        freeze=args.gc_freeze,
        progress=lambda s: print(s, flush=True),
        threshold=args.gc_threshold,
    )
    title = "scale benchmark: one 5-step turn per agent, all at once (reference in the same run)"
    if args.gc_freeze:
        title += ", rt.gc_freeze() after creation"
    if args.gc_threshold is not None:
        title += f", gen-0 threshold {args.gc_threshold:,}"
    report(title, list(scale_rows(result)), result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
