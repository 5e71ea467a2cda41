"""``dsh-agent bench``: run the benchmarks and print one table.

The loop and store benchmarks ship with the source tree (``scripts/bench/``), not with the
package: ``dsh-agent bench`` runs them from the checkout the package was installed from (an
editable install), else from ``scripts/bench`` under the current directory, else from
``$DSH_AGENT_BENCH_DIR``; on a plain install it says where they are and exits 2.

Each row sets a figure of ours beside its pure-trio (or bare-JSON) reference measured in the
same run. ``ratio`` always reads "times slower than the reference" (ours/reference for times,
reference/ours for rates), so one target direction fits every row. A benchmark module may
export its own ``TARGETS`` mapping (row key → bound); otherwise the defaults below apply.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Final, final

import attrs
from rich.console import Console
from rich.table import Table

from ._setup import EXIT_OK, CliError

__all__ = ["Row", "bench_rows", "bench_scripts", "load_script", "print_table", "run_benchmarks"]

#: The project's targets (issues #2, #4): the largest acceptable ratio, or for rows without a
#: reference the largest acceptable value. W3's "≥ 20% of the reference's steps/s" is a ratio
#: of at most 5; the SSE target is absolute (≥ 100,000 chunks/s), expressed as 100,000/ours ≤ 1.
DEFAULT_TARGETS: Final[Mapping[str, float]] = {
    "w1": 5.0,
    "w1_growth": 1.2,
    "w2": 5.0,
    "w3": 5.0,
    "w3_mb": 0.03,
    "sse_abs": 1.0,
    "sqlite_w1": 2.0,
    "sqlite_append": 2.0,
}
SSE_TARGET_CHUNKS_PER_S: Final = 100_000


@final
@attrs.frozen
class Row:
    """One table row."""

    key: str
    workload: str
    ours: str
    reference: str
    ratio: float | None
    """Times slower than the reference (None: the row has no reference)."""
    value: float
    """The figure the target bounds: ``ratio``, or the value itself without a reference."""
    target: float | None

    @property
    def met(self) -> bool | None:
        """Whether the target holds (None without a target)."""
        return None if self.target is None else self.value <= self.target


def _row(
    key: str,
    workload: str,
    ours: str,
    reference: str,
    ratio: float | None,
    value: float,
    targets: Mapping[str, float],
) -> Row:
    return Row(key, workload, ours, reference, ratio, value, targets.get(key))


def _loop_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    w1, w1_ref = result["w1_us_per_step"], result["w1_ref_us_per_step"]
    yield _row(
        "w1",
        "W1 µs/step, 1 tool",
        f"{w1:.1f} µs",
        f"{w1_ref:.1f} µs",
        w1 / w1_ref,
        w1 / w1_ref,
        targets,
    )
    growth = result["w1_growth_100_vs_10"]
    yield _row(
        "w1_growth",
        "W1 growth, last/first",
        f"{growth:.2f}x",
        "-",
        None,
        growth,
        targets,
    )
    w2, w2_ref = result["w2_us_per_step"], result["w2_ref_us_per_step"]
    yield _row(
        "w2",
        "W2 µs/step, 8 tools",
        f"{w2:.1f} µs",
        f"{w2_ref:.1f} µs",
        w2 / w2_ref,
        w2 / w2_ref,
        targets,
    )
    seq = result.get("w2_ref_sequential_us_per_step")
    if seq:  # context only: a reference that runs its tools one after another
        yield _row(
            "w2_sequential",
            "W2 vs tools awaited in sequence",
            f"{w2:.1f} µs",
            f"{seq:.1f} µs",
            w2 / seq,
            w2 / seq,
            targets,
        )
    for entry in result.get("w3", ()):
        n, rate, ref = entry["agents"], entry["steps_per_s"], entry["ref_steps_per_s"]
        yield _row(
            "w3",
            f"W3 steps/s, {n:,} agents",
            f"{rate:,.0f}/s",
            f"{ref:,.0f}/s",
            ref / rate,
            ref / rate,
            targets,
        )
        mb = entry["mb_per_agent"]
        yield _row("w3_mb", f"W3 MB/agent, {n:,}", f"{mb:.3f} MB", "-", None, mb, targets)


def _sse_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    ours, ref = result["sse_chunks_per_s"], result["json_loads_per_s"]
    yield _row(
        "sse_abs",
        "SSE parse+normalise chunks/s (ref: bare json.loads)",
        f"{ours:,.0f}/s",
        f"{ref:,.0f}/s",
        ref / ours,
        SSE_TARGET_CHUNKS_PER_S / ours,
        targets,
    )


def _store_rows(result: Mapping[str, Any], targets: Mapping[str, float]) -> Iterator[Row]:
    mem, sql = result["memory_w1_us_per_step"], result["sqlite_w1_us_per_step"]
    yield _row(
        "sqlite_w1",
        "W1 µs/step, SqliteStore (ref: MemoryStore)",
        f"{sql:.1f} µs",
        f"{mem:.1f} µs",
        sql / mem,
        sql / mem,
        targets,
    )
    ours, raw = result["sqlite_append_events_per_s"], result["sqlite_raw_events_per_s"]
    yield _row(
        "sqlite_append",
        "SQLite append events/s (ref: raw sqlite3 executemany)",
        f"{ours:,.0f}/s",
        f"{raw:,.0f}/s",
        raw / ours,
        raw / ours,
        targets,
    )
    pg = result.get("postgres_w1_us_per_step")
    if pg is not None:
        yield _row(
            "postgres_w1",
            "W1 µs/step, PostgresStore",
            f"{pg:.0f} µs",
            f"{mem:.1f} µs",
            pg / mem,
            pg / mem,
            targets,
        )


#: Overrides where the benchmark scripts are looked for.
BENCH_DIR_ENV: Final = "DSH_AGENT_BENCH_DIR"
#: Where they are, relative to a source checkout.
SCRIPTS: Final = Path("scripts", "bench")


def bench_scripts() -> Path | None:
    """The directory holding the benchmark scripts, or None (a plain install has none).

    ``$DSH_AGENT_BENCH_DIR`` when set; else the source checkout this package runs from (an
    editable install: ``src/dsh_agent_loop`` sits two levels below the checkout); else
    ``scripts/bench`` under the current directory.
    """
    override = os.environ.get(BENCH_DIR_ENV)
    if override:
        candidates = [Path(override)]
    else:
        checkout = Path(__file__).resolve().parents[3]
        candidates = [checkout / SCRIPTS, Path.cwd() / SCRIPTS]
    for directory in candidates:
        if (directory / "loop.py").is_file():
            return directory.resolve()
    return None


def load_script(name: str) -> ModuleType:
    """Import the benchmark script ``name`` (``loop``, ``stores``) from ``bench_scripts()``.

    The scripts import each other as top-level modules, as they do when run directly.

    Raises:
        CliError: no benchmark scripts here (a plain install), or ``name`` is not one of them.
    """
    directory = bench_scripts()
    if directory is None:
        raise CliError(
            "dsh-agent bench: the benchmarks ship with the source tree (scripts/bench/), not"
            " with the package; run it in a checkout of dsh-agent-loop, or set"
            f" {BENCH_DIR_ENV} to its scripts/bench directory"
        )
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    module = importlib.import_module(name)
    origin = Path(module.__file__ or "").resolve()
    if origin.parent != directory:
        raise CliError(f"dsh-agent bench: {name!r} resolves to {origin}, not to {directory}")
    return module


@attrs.frozen
class _Bench:
    name: str
    module: str
    function: str
    rows: Callable[[Mapping[str, Any], Mapping[str, float]], Iterator[Row]]
    quick_kwargs: Mapping[str, Any]
    full_kwargs: Mapping[str, Any]
    script: bool = True
    """A script of ``scripts/bench`` (else a module of the package)."""


#: The benchmarks ``dsh-agent bench`` knows how to tabulate, in order.
BENCHMARKS: Final = (
    _Bench("loop", "loop", "run_loop_bench", _loop_rows, {"quick": True}, {"quick": False}),
    _Bench("stores", "stores", "run_store_bench", _store_rows, {"quick": True}, {"quick": False}),
    _Bench(
        "sse",
        "dsh_agent_loop.llm._bench_sse",
        "run_sse_bench",
        _sse_rows,
        {"n_chunks": 20_000},
        {},
        script=False,
    ),
)


def run_benchmarks(quick: bool) -> tuple[dict[str, Any], list[Row]]:
    """Run every benchmark; returns (raw results by name, table rows).

    Raises:
        CliError: the benchmark scripts are not here (a plain install).
    """
    results: dict[str, Any] = {}
    rows: list[Row] = []
    for bench in BENCHMARKS:
        module = (
            load_script(bench.module) if bench.script else importlib.import_module(bench.module)
        )
        run = getattr(module, bench.function)
        result = run(**(bench.quick_kwargs if quick else bench.full_kwargs))
        results[bench.name] = result
        targets = {**DEFAULT_TARGETS, **getattr(module, "TARGETS", {})}
        rows.extend(bench.rows(result, targets))
    return results, rows


def bench_rows(rows: list[Row]) -> list[tuple[str, str, str, str, str]]:
    """Rows as the table's text cells."""
    cells = []
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.1f}x"
        if row.target is None:
            target = "-"
        elif row.key == "sse_abs":
            target = f"≥ {SSE_TARGET_CHUNKS_PER_S:,}/s {'ok' if row.met else 'missed'}"
        else:
            bound = f"≤ {row.target:g}" + ("x" if row.ratio is not None else "")
            target = f"{bound} {'ok' if row.met else 'missed'}"
        cells.append((row.workload, row.ours, row.reference, ratio, target))
    return cells


def print_table(rows: list[Row], console: Console) -> None:
    """Print the benchmark table."""
    table = Table(title="dsh-agent bench", title_justify="left")
    table.add_column("workload", no_wrap=True)
    for name in ("ours", "reference", "ratio", "target"):
        table.add_column(name, justify="right", no_wrap=True)
    for cells in bench_rows(rows):
        table.add_row(*cells)
    console.print(table)


def write_json(results: Mapping[str, Any], rows: list[Row], path: str) -> None:
    """Write the raw results and the rows to ``path``."""
    record = {"results": results, "rows": [attrs.asdict(row) for row in rows]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")


def bench(quick: bool, json_path: str | None, console: Console) -> int:
    """Run, print, and optionally save the benchmarks."""
    results, rows = run_benchmarks(quick)
    print_table(rows, console)
    if json_path is not None:
        write_json(results, rows, json_path)
    return EXIT_OK
