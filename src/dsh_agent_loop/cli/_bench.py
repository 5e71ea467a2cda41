"""``dsh-agent bench``: run the benchmarks and print one table.

The benchmarks ship with the package (``dsh_agent_loop.bench``; the SSE one is
``dsh_agent_loop.llm._bench_sse``), so ``dsh-agent bench`` runs on any install, from any
directory. Each is imported only when the verb runs (``importlib``), never at package import.

Each row sets a figure of ours beside its pure-trio (or bare-JSON, or plain ``sqlite3``)
reference measured in the same run. The ratio column reads the way the row's target is stated:
for times it is ours/reference ("times slower", target ``≤ N×``); for rates it is
ours/reference as a share ("% of the reference", target ``≥ N%``). The table prints exactly the
``ratio`` each row carries in ``--json``, rounded for display, and ``--check`` fails on the same
rows the table marks ``missed``. A benchmark module may export its own ``TARGETS`` mapping
(row key → bound); otherwise the defaults below apply.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final

import attrs
from rich.console import Console
from rich.table import Table

from ._setup import EXIT_FAILED, EXIT_OK

__all__ = [
    "Row",
    "bench",
    "bench_rows",
    "json_record",
    "missed",
    "print_table",
    "ratio_text",
    "run_benchmarks",
    "tabulate",
]

#: The project's targets (docs/cli.md#bench). Rows whose key is in ``AT_LEAST`` must reach the
#: bound (a share of the reference, or an absolute rate); every other row must stay at or below it.
DEFAULT_TARGETS: Final[Mapping[str, float]] = {
    "w1": 5.0,
    "w1_growth": 1.2,
    "w2": 5.0,
    "w3": 0.2,
    "w3_mb": 0.03,
    "sse_abs": 100_000.0,
    "sqlite_w1": 2.0,
    "sqlite_append": 0.5,
    "scale_share": 0.25,
    "scale_gc": 0.10,
    "scale_growth": 1.3,
}
#: Rows whose target is a lower bound.
AT_LEAST: Final = frozenset({"w3", "sse_abs", "sqlite_append", "scale_share"})
#: Agent counts whose scale-benchmark throughput has a target (docs/scale.md#the-scale-benchmark).
SCALE_SHARE_SIZES: Final = frozenset({2_000, 10_000})


@final
@attrs.frozen
class Row:
    """One table row."""

    key: str
    workload: str
    ours: str
    reference: str
    ratio: float | None
    """Ours against the reference (None: the row has no reference): ours/reference for times,
    the share ours/reference for rates (``share`` is True)."""
    value: float
    """The figure the target bounds: ``ratio``, or the value itself without a reference."""
    target: float | None
    share: bool = False
    """``ratio`` is a share of the reference's rate (shown as a percentage)."""
    at_least: bool = False
    """The target is a lower bound (``value >= target``), else an upper bound."""

    @property
    def met(self) -> bool | None:
        """Whether the target holds (None without a target)."""
        if self.target is None:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target


def _time_row(
    key: str, workload: str, ours: float, ref: float, targets: Mapping[str, float], unit: str
) -> Row:
    digits = 1 if unit == "µs" and ours < 1000 else 0
    return Row(
        key,
        workload,
        f"{ours:,.{digits}f} {unit}",
        f"{ref:,.{digits}f} {unit}",
        ours / ref,
        ours / ref,
        targets.get(key),
    )


def _rate_row(
    key: str, workload: str, ours: float, ref: float, targets: Mapping[str, float]
) -> Row:
    share = ours / ref
    return Row(
        key,
        workload,
        f"{ours:,.0f}/s",
        f"{ref:,.0f}/s",
        share,
        share,
        targets.get(key),
        share=True,
        at_least=key in AT_LEAST,
    )


def _loop_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    w1, w1_ref = result["w1_us_per_step"], result["w1_ref_us_per_step"]
    yield _time_row("w1", "W1 µs/step, 1 tool", w1, w1_ref, targets, "µs")
    growth = result["w1_growth_100_vs_10"]
    yield Row(
        "w1_growth",
        "W1 growth, last/first 100 steps",
        f"{growth:.2f}x",
        "-",
        None,
        growth,
        targets.get("w1_growth"),
    )
    traced = result.get("w1_traced_us_per_step")
    if traced:  # context only: the same W1 traced to an SDK provider without processors
        plain = result.get("w1_traced_baseline_us_per_step", w1)
        yield _time_row("w1_traced", "W1 µs/step with tracing", traced, plain, {}, "µs")
    w2, w2_ref = result["w2_us_per_step"], result["w2_ref_us_per_step"]
    yield _time_row("w2", "W2 µs/step, 8 tools", w2, w2_ref, targets, "µs")
    seq = result.get("w2_ref_sequential_us_per_step")
    if seq:  # context only: a reference that runs its tools one after another
        yield _time_row("w2_sequential", "W2 vs tools awaited in sequence", w2, seq, {}, "µs")
    for entry in result.get("w3", ()):
        n, rate, ref = entry["agents"], entry["steps_per_s"], entry["ref_steps_per_s"]
        yield _rate_row("w3", f"W3 steps/s, {n:,} agents", rate, ref, targets)
        mb = entry["mb_per_agent"]
        yield Row(
            "w3_mb",
            f"W3 MB/agent, {n:,} agents",
            f"{mb:.3f} MB",
            "-",
            None,
            mb,
            targets.get("w3_mb"),
        )


def _sse_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    ours, ref = result["sse_chunks_per_s"], result["json_loads_per_s"]
    row = _rate_row("sse_abs", "SSE parse+normalise chunks/s (ref: bare json.loads)", ours, ref, {})
    # The target is absolute (chunks/s), not a share of the reference.
    yield attrs.evolve(row, value=ours, target=targets.get("sse_abs"), at_least=True)


def _store_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    mem, sql = result["memory_w1_us_per_step"], result["sqlite_w1_us_per_step"]
    yield _time_row(
        "sqlite_w1", "W1 µs/step, SqliteStore (ref: MemoryStore)", sql, mem, targets, "µs"
    )
    floor = result.get("sqlite_w1_floor_us_per_step")
    if floor is not None:  # the lowest ratio this machine allows any durable store (no target)
        yield _time_row(
            "sqlite_w1_floor",
            "  floor: memory W1 + worker hop + sqlite3 commit",
            floor,
            mem,
            {},
            "µs",
        )
    ours, raw = result["sqlite_append_events_per_s"], result["sqlite_raw_events_per_s"]
    yield _rate_row(
        "sqlite_append",
        "SQLite append events/s (ref: raw sqlite3 executemany)",
        ours,
        raw,
        targets,
    )
    pg = result.get("postgres_w1_us_per_step")
    if pg is not None:
        yield _time_row("postgres_w1", "W1 µs/step, PostgresStore", pg, mem, targets, "µs")
    pg_rate, pg_raw = (
        result.get("postgres_append_events_per_s"),
        result.get("postgres_raw_events_per_s"),
    )
    if pg_rate is not None and pg_raw:
        yield _rate_row(
            "postgres_append",
            "PostgreSQL append events/s (ref: psycopg)",
            pg_rate,
            pg_raw,
            targets,
        )


def _compaction_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    """``dsh_agent_loop.bench.compaction``: one compaction's own cost, and the check per step."""
    ms = result["compact_ms_best"]
    n = int(result["messages"])
    yield Row(
        "compaction",
        f"one compaction, {n:,} messages (no model call)",
        f"{ms:.1f} ms",
        "",
        None,
        ms,
        targets.get("compaction"),
    )
    plain, policy = result["w1_plain_us_per_step"], result["w1_policy_us_per_step"]
    yield _time_row(
        "compaction_w1", "W1 µs/step with a compaction policy (vs W1)", policy, plain, targets, "µs"
    )


def _scale_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    """``dsh_agent_loop.bench.scale``: steps/s and GC share per agent count, and the growth."""
    for entry in result.get("sizes", ()):
        n, ours, ref = entry["agents"], entry["ours"], entry["ref"]
        key = "scale_share" if n in SCALE_SHARE_SIZES else "scale_rate"
        yield _rate_row(
            key, f"Scale steps/s, {n:,} agents", ours["steps_per_s"], ref["steps_per_s"], targets
        )
        share = ours["gc_share"]
        yield Row(
            "scale_gc",
            f"Scale GC share of wall time, {n:,} agents",
            f"{share:.0%}",
            f"{ref['gc_share']:.0%}",
            None,
            share,
            targets.get("scale_gc"),
        )
    growth = result.get("growth")
    if growth is not None:
        yield Row(
            "scale_growth",
            "Scale µs/step growth 100 → 10,000 agents (ratio: ours/ref)",
            f"{growth['ours']:.2f}x",
            f"{growth['ref']:.2f}x",
            growth["ratio"],
            growth["ratio"],
            targets.get("scale_growth"),
        )


def _fleet_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    """``dsh_agent_loop.bench.fleet``: send→splice latency and turns/s on 1 and 2 workers."""
    for store in ("sqlite", "postgres"):
        figures = result.get(store)
        if figures is None:
            continue
        p50, p99 = figures["latency_p50_ms"], figures["latency_p99_ms"]
        yield Row(
            f"fleet_{store}_latency",
            f"Fleet {store}: send→spliced p50 / p99",
            f"{p50:.1f} / {p99:.1f} ms",
            "",
            None,
            p50,
            targets.get(f"fleet_{store}_latency"),
        )
        one, two = figures["turns_per_s_1"], figures["turns_per_s_2"]
        yield Row(
            f"fleet_{store}_turns",
            f"Fleet {store}: turns/s, 2 workers (ref: 1 worker)",
            f"{two:,.0f}/s",
            f"{one:,.0f}/s",
            two / one if one else None,
            two / one if one else 0.0,
            targets.get(f"fleet_{store}_turns"),
            share=True,
            at_least=True,
        )


@attrs.frozen
class _Bench:
    name: str
    module: str
    function: str
    rows: Callable[[Mapping[str, Any], Mapping[str, float]], Iterator[Row]]
    quick_kwargs: Mapping[str, Any] | None
    """Arguments for ``--quick`` (None: not run with ``--quick``)."""
    full_kwargs: Mapping[str, Any]


#: The benchmarks ``dsh-agent bench`` knows how to tabulate, in order.
BENCHMARKS: Final = (
    _Bench(
        "loop",
        "dsh_agent_loop.bench.loop",
        "run_loop_bench",
        _loop_rows,
        {"quick": True},
        {"quick": False},
    ),
    _Bench(
        "stores",
        "dsh_agent_loop.bench.stores",
        "run_store_bench",
        _store_rows,
        {"quick": True},
        {"quick": False},
    ),
    _Bench(
        "compaction",
        "dsh_agent_loop.bench.compaction",
        "run_compaction_bench",
        _compaction_rows,
        {"quick": True},
        {"quick": False},
    ),
    # Minutes, in child processes: only without --quick.
    _Bench(
        "scale",
        "dsh_agent_loop.bench.scale",
        "run_scale_bench",
        _scale_rows,
        None,
        {"quick": False},
    ),
    _Bench(
        "fleet",
        "dsh_agent_loop.bench.fleet",
        "run_fleet_bench",
        _fleet_rows,
        {"quick": True},
        {"quick": False},
    ),
    _Bench(
        "sse",
        "dsh_agent_loop.llm._bench_sse",
        "run_sse_bench",
        _sse_rows,
        {"n_chunks": 20_000},
        {},
    ),
)


def tabulate(results: Mapping[str, Any], targets: Mapping[str, float] | None = None) -> list[Row]:
    """The table rows for raw ``results`` by benchmark name (a benchmark absent: no rows)."""
    rows: list[Row] = []
    for bench in BENCHMARKS:
        result = results.get(bench.name)
        if result is not None:
            rows.extend(bench.rows(result, {**DEFAULT_TARGETS, **(targets or {})}))
    return rows


def missed(rows: list[Row]) -> list[Row]:
    """The rows whose target does not hold (what ``--check`` fails on)."""
    return [row for row in rows if row.met is False]


def run_benchmarks(quick: bool) -> tuple[dict[str, Any], list[Row]]:
    """Run every benchmark (``quick``: those with quick settings); returns (results, rows)."""
    results: dict[str, Any] = {}
    targets: dict[str, float] = {}
    for bench in BENCHMARKS:
        kwargs = bench.quick_kwargs if quick else bench.full_kwargs
        if kwargs is None:
            continue
        module = importlib.import_module(bench.module)
        run = getattr(module, bench.function)
        results[bench.name] = run(**kwargs)
        targets.update(getattr(module, "TARGETS", {}))
    return results, tabulate(results, targets)


def ratio_text(row: Row) -> str:
    """The ratio cell: ``15.0x`` for times, ``25%`` for a share of a rate, ``-`` without one."""
    if row.ratio is None:
        return "-"
    return f"{row.ratio:.0%}" if row.share else f"{row.ratio:.1f}x"


def target_text(row: Row) -> str:
    """The target cell: the bound and ``ok`` or ``missed`` (``-`` without a target)."""
    if row.target is None:
        return "-"
    if row.key == "sse_abs":
        bound = f"≥ {row.target:,.0f}/s"
    elif row.share or row.key == "scale_gc":  # a share: of the reference, or of wall time
        bound = f"{'≥' if row.at_least else '≤'} {row.target:.0%}"
    else:
        suffix = "x" if row.ratio is not None else ""
        bound = f"{'≥' if row.at_least else '≤'} {row.target:g}{suffix}"
    return f"{bound} {'ok' if row.met else 'missed'}"


def bench_rows(rows: list[Row]) -> list[tuple[str, str, str, str, str]]:
    """Rows as the table's text cells: workload, ours, reference, ratio, target."""
    return [(r.workload, r.ours, r.reference, ratio_text(r), target_text(r)) for r in rows]


def print_table(rows: list[Row], console: Console) -> None:
    """Print the benchmark table."""
    table = Table(title="dsh-agent bench", title_justify="left")
    table.add_column("workload", no_wrap=True)
    for name in ("ours", "reference", "ratio", "target"):
        table.add_column(name, justify="right", no_wrap=True)
    for cells in bench_rows(rows):
        table.add_row(*cells)
    console.print(table)


def json_record(results: Mapping[str, Any], rows: list[Row]) -> dict[str, Any]:
    """The ``--json`` record: raw results, the rows (``ratio`` as in the table), the misses."""
    return {
        "results": results,
        "rows": [
            {**attrs.asdict(row), "met": row.met, "ratio_text": ratio_text(row)} for row in rows
        ],
        "missed": [row.key for row in missed(rows)],
    }


def write_json(results: Mapping[str, Any], rows: list[Row], path: str) -> None:
    """Write ``json_record`` to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(json_record(results, rows), f, indent=2)
        f.write("\n")


def report_misses(rows: list[Row], errors: Console) -> int:
    """One stderr line per missed target; the ``--check`` exit code (1 when any was missed)."""
    misses = missed(rows)
    for row in misses:
        errors.print(
            f"target missed: {row.workload.strip()}: {row.ours} vs {row.reference},"
            f" ratio {ratio_text(row)}, target {target_text(row).removesuffix(' missed')}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    return EXIT_FAILED if misses else EXIT_OK


def bench(
    quick: bool,
    json_path: str | None,
    console: Console,
    *,
    check: bool = False,
    errors: Console | None = None,
) -> int:
    """Run, print, and optionally save the benchmarks; with ``check``, exit 1 on a missed target."""
    results, rows = run_benchmarks(quick)
    print_table(rows, console)
    if json_path is not None:
        write_json(results, rows, json_path)
    if check:
        return report_misses(rows, errors or console)
    return EXIT_OK
