"""The loop benchmark: the real driver on the scripted model and a memory store.

Run ``python -m dsh_agent_loop.bench.loop [--quick] [--json PATH]`` (in a source checkout,
``scripts/bench/loop.py`` is a wrapper around it), or ``dsh-agent bench``.

- W1: one agent, 1,000 steps in one turn, one trivial tool call per step; best of 5; µs/step.
- W1 growth: µs/step over steps 900–1,000 divided by µs/step over steps 1–100, each window the
  best of three runs (must stay ~1: per-step cost may not grow with history).
- W2: as W1 with 8 parallel trivial tool calls per step.
- W3: N agents created first (untimed), then all prompted at once, 5 steps each, no latency;
  steps/s, and MB per live agent (RSS growth / N while the agents are alive).

The reference loop does what one step minimally must, in plain trio: build a dict message,
append it to a list, send it on a memory channel to a consumer task, await a trivial async tool,
checkpoint. With several tools per step (W2) the reference runs them the way trio runs parallel
work, one task each in a nursery opened for the step (``w2_ref_us_per_step``, the figure W2 is
compared with); the same loop awaiting them one after another, which runs nothing in
parallel, is reported beside it (``w2_ref_sequential_us_per_step``).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from dsh_agent_loop import AgentOptions, open_runtime, tool
from dsh_agent_loop.llm import ModelRequest, Reply, ScriptedModel
from dsh_agent_loop.stores import MemoryStore, SessionStore

__all__ = [
    "main",
    "noop",
    "print_table",
    "reference_loop",
    "report",
    "rows",
    "run_loop_bench",
    "w1",
    "w3",
]


@tool
async def noop(n: int = 0) -> str:
    """Do nothing and say so."""
    return "ok"


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- reference -------------------------------------------------------------------------------
async def _ref_tool(args: dict[str, Any]) -> str:
    return "ok"


async def _reference_agent(steps: int, calls: int, log: list[Any], parallel: bool) -> None:
    send, recv = trio.open_memory_channel[dict[str, Any]](0)

    async def consumer() -> None:
        async with recv:
            async for message in recv:
                log.append(message)

    async def run_tool(results: list[Any], j: int, i: int) -> None:
        results[j] = await _ref_tool({"n": i})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        async with send:
            for i in range(steps):
                message = {
                    "role": "assistant",
                    "step": i,
                    "content": [{"type": "text", "text": "x"}],
                }
                log.append(message)
                await send.send(message)
                if parallel:
                    results: list[Any] = [None] * calls
                    async with trio.open_nursery() as tools:
                        for j in range(calls):
                            tools.start_soon(run_tool, results, j, i)
                else:
                    for _ in range(calls):
                        await _ref_tool({"n": i})
                await trio.lowlevel.checkpoint()


def reference_loop(
    steps: int, calls: int = 1, agents: int = 1, *, parallel: bool | None = None
) -> float:
    """Seconds for ``agents`` reference loops of ``steps`` steps, run concurrently.

    ``parallel`` (default: ``calls > 1``) runs a step's tools as tasks of a per-step nursery;
    otherwise they are awaited one after another.
    """
    tasks = calls > 1 if parallel is None else parallel

    async def main() -> float:
        logs: list[list[Any]] = [[] for _ in range(agents)]
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for log in logs:
                nursery.start_soon(_reference_agent, steps, calls, log, tasks)
        return time.perf_counter() - start

    return trio.run(main)


# -- the real loop ---------------------------------------------------------------------------
def _script(steps: int, calls: int, marks: list[float] | None) -> Callable[[ModelRequest], Reply]:
    count = 0
    reply_calls = Reply.tool_calls(*[("noop", {"n": i}) for i in range(calls)])
    done = Reply.text("done")

    def reply(request: ModelRequest) -> Reply:
        nonlocal count
        count += 1
        if marks is not None:
            marks.append(time.perf_counter())
        return reply_calls if count < steps else done

    return reply


def w1(
    steps: int = 1000,
    calls: int = 1,
    store_factory: Callable[[], SessionStore] = MemoryStore,
    marks: list[float] | None = None,
    tracer_provider: Any = None,
) -> float:
    """Seconds for one agent to run one turn of ``steps`` steps with ``calls`` tools each."""

    async def main() -> float:
        model = ScriptedModel([_script(steps, calls, marks)], loop=True)
        store = store_factory()
        async with open_runtime(
            store=store, providers={"s": model}, tools=[noop], tracer_provider=tracer_provider
        ) as rt:
            h = await rt.agents.create(options=AgentOptions(id="w1", provider="s", model="m"))
            start = time.perf_counter()
            h.agent.followup("go")
            await h.agent.wait_idle()
            elapsed = time.perf_counter() - start
            assert len(model.requests) == steps, (len(model.requests), steps)
        return elapsed

    return trio.run(main)


def w3(
    agents: int, steps: int = 5, store_factory: Callable[[], SessionStore] = MemoryStore
) -> tuple[float, float]:
    """(seconds for all agents' turns, MB per live agent)."""

    async def main() -> tuple[float, float]:
        store = store_factory()
        gc.collect()
        before = _rss_bytes()
        async with open_runtime(
            store=store, providers={"s": _PerAgentModel(steps)}, tools=[noop]
        ) as rt:
            handles = [
                await rt.agents.create(options=AgentOptions(id=f"sim-{i}", provider="s", model="m"))
                for i in range(agents)
            ]
            start = time.perf_counter()
            for h in handles:
                h.agent.followup("go")
            for h in handles:
                await h.agent.wait_idle()
            elapsed = time.perf_counter() - start
            gc.collect()
            per_agent = (_rss_bytes() - before) / agents / 1e6
        return elapsed, per_agent

    return trio.run(main)


class _PerAgentModel:
    """Scripted replies per agent: ``steps - 1`` tool steps, then text."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._call = Reply.tool_calls(("noop", {}))
        self._done = Reply.text("done")
        # A simulation's model keeps no request log (real adapters keep none either).
        self._inner = ScriptedModel([self._reply], loop=True, record=False)

    def _reply(self, request: ModelRequest) -> Reply:
        assistant = sum(1 for m in request.messages if m["role"] == "assistant")
        return self._call if assistant % self.steps < self.steps - 1 else self._done

    async def prepare_call(self, config: Any) -> Any:
        return await self._inner.prepare_call(config)

    async def aclose(self) -> None:
        pass


def _traced_w1(steps: int) -> tuple[float, float] | None:
    """Best of 5 W1 runs traced to an SDK ``TracerProvider`` without processors (extra ``otel``).

    Returns the traced best and the best of 5 untraced runs alternated with them (so load on
    the machine hits both); None when ``opentelemetry-sdk`` is not installed.
    """
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    traced, plain = [], []
    for _ in range(5):
        traced.append(w1(steps, tracer_provider=TracerProvider()))
        plain.append(w1(steps))
    return min(traced), min(plain)


def run_loop_bench(quick: bool = False) -> dict[str, Any]:
    """Run W1, W1 growth, W2 and W3 (and their references); returns the JSON record."""
    # Ours and the reference alternate, so a burst of load on this shared machine hits both;
    # each figure is the best of its runs.
    steps = 1000
    w1_runs, ref1_runs = [], []
    for _ in range(5):
        w1_runs.append(w1(steps))
        ref1_runs.append(reference_loop(steps))
    ref1 = min(ref1_runs)
    traced = _traced_w1(steps)
    # Growth: the best 100-step window at the start against the best at the end, over three
    # marked runs (one run's 6 ms windows are at the mercy of a single hiccup on this machine).
    firsts, lasts = [], []
    for _ in range(3):
        marks: list[float] = []
        w1(steps, marks=marks)
        firsts.append((marks[100] - marks[0]) / 100)
        lasts.append((marks[-1] - marks[-101]) / 100)
    first, last = min(firsts), min(lasts)
    w2_steps = 500
    w2_runs, ref2_runs, ref2_seq_runs = [], [], []
    for _ in range(3):
        w2_runs.append(w1(w2_steps, calls=8))
        ref2_runs.append(reference_loop(w2_steps, calls=8))
        ref2_seq_runs.append(reference_loop(w2_steps, calls=8, parallel=False))
    ref2, ref2_seq = min(ref2_runs), min(ref2_seq_runs)
    result: dict[str, Any] = {
        "w1_us_per_step": min(w1_runs) / steps * 1e6,
        "w1_ref_us_per_step": ref1 / steps * 1e6,
        "w1_growth_100_vs_10": last / first,
        "w2_us_per_step": min(w2_runs) / w2_steps * 1e6,
        "w2_ref_us_per_step": ref2 / w2_steps * 1e6,
        "w2_ref_sequential_us_per_step": ref2_seq / w2_steps * 1e6,
        "w3": [],
    }
    if traced is not None:
        result["w1_traced_us_per_step"] = traced[0] / steps * 1e6
        result["w1_traced_baseline_us_per_step"] = traced[1] / steps * 1e6
    for n in (1000,) if quick else (1000, 10000):
        elapsed, mb = w3(n)
        ref = reference_loop(5, agents=n)
        result["w3"].append(
            {
                "agents": n,
                "steps_per_s": n * 5 / elapsed,
                "ref_steps_per_s": n * 5 / ref,
                "mb_per_agent": mb,
            }
        )
    return result


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Table rows: workload, ours, reference, ratio, target."""
    out = [
        (
            "W1 µs/step (1 tool/step)",
            f"{result['w1_us_per_step']:.1f}",
            f"{result['w1_ref_us_per_step']:.1f}",
            f"{result['w1_us_per_step'] / result['w1_ref_us_per_step']:.1f}×",
            "≤ 5×",
        ),
        ("W1 growth (900–1000 / 1–100)", f"{result['w1_growth_100_vs_10']:.2f}", "", "", "≤ 1.2"),
    ]
    if "w1_traced_us_per_step" in result:
        traced = result["w1_traced_us_per_step"]
        plain = result.get("w1_traced_baseline_us_per_step", result["w1_us_per_step"])
        out.append(
            (
                "W1 µs/step with tracing (vs W1)",
                f"{traced:.1f}",
                f"{plain:.1f}",
                f"{traced / plain:.1f}×",
                f"+{traced - plain:.1f} µs/step",
            )
        )
    out += [
        (
            "W2 µs/step (8 tools/step)",
            f"{result['w2_us_per_step']:.1f}",
            f"{result['w2_ref_us_per_step']:.1f}",
            f"{result['w2_us_per_step'] / result['w2_ref_us_per_step']:.1f}×",
            "≤ 5×",
        ),
    ]
    if "w2_ref_sequential_us_per_step" in result:
        seq = result["w2_ref_sequential_us_per_step"]
        out.append(
            (
                "W2 vs tools awaited in sequence",
                f"{result['w2_us_per_step']:.1f}",
                f"{seq:.1f}",
                f"{result['w2_us_per_step'] / seq:.1f}×",
                "(not parallel)",
            )
        )
    for w3row in result["w3"]:
        n = w3row["agents"]
        share = w3row["steps_per_s"] / w3row["ref_steps_per_s"]
        out.append(
            (
                f"W3 steps/s, {n} agents",
                f"{w3row['steps_per_s']:.0f}",
                f"{w3row['ref_steps_per_s']:.0f}",
                f"{share:.0%} of ref",
                "≥ 20%",
            )
        )
        out.append((f"W3 MB/agent, {n} agents", f"{w3row['mb_per_agent']:.4f}", "", "", "≤ 0.03"))
    return out


def print_table(title: str, table: list[tuple[str, str, str, str, str]]) -> None:
    """Print benchmark rows as a rich table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for name in ("workload", "ours", "reference", "ratio", "target"):
        t.add_column(name, no_wrap=True)
    for row in table:
        t.add_row(*row)
    Console(width=max(120, Console().width)).print(t)


def report(
    title: str,
    table: list[tuple[str, str, str, str, str]],
    result: dict[str, Any],
    json_path: str | None,
) -> None:
    """Print ``table`` under ``title``; with ``json_path``, write ``result`` there as JSON."""
    import json

    print_table(title, table)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    """``python -m dsh_agent_loop.bench.loop [--quick] [--json PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="W3 at 1,000 agents only")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)
    result = run_loop_bench(quick=args.quick)
    title = "loop benchmark (pure-trio reference measured in the same run)"
    report(title, rows(result), result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
