"""``dsh-agent bench``: the table built from the benchmark records."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from dsh_agent_loop.cli._bench import (
    DEFAULT_TARGETS,
    _loop_rows,
    _sse_rows,
    bench_scripts,
    load_script,
    print_table,
    write_json,
)

from .helpers import REPO, cli

LOOP = {
    "w1_us_per_step": 150.0,
    "w1_ref_us_per_step": 10.0,
    "w1_growth_100_vs_10": 1.5,
    "w2_us_per_step": 300.0,
    "w2_ref_us_per_step": 20.0,
    "w3": [
        {"agents": 1000, "steps_per_s": 3000.0, "ref_steps_per_s": 12000.0, "mb_per_agent": 0.03}
    ],
}
SSE = {"sse_chunks_per_s": 200_000.0, "json_loads_per_s": 500_000.0, "ratio": 0.4, "chunks": 9.0}


def test_rows_read_as_times_slower_than_the_reference(tmp_path: Path) -> None:
    rows = [*_loop_rows(LOOP, DEFAULT_TARGETS), *_sse_rows(SSE, DEFAULT_TARGETS)]
    by_key = {row.key: row for row in rows}
    assert by_key["w1"].ratio == 15.0
    assert by_key["w2"].ratio == 15.0
    assert by_key["w3"].ratio == 4.0  # a rate: reference / ours
    assert by_key["sse_abs"].ratio == 2.5
    assert by_key["sse_abs"].met is True  # 200,000/s ≥ 100,000/s
    assert by_key["w1"].met is False  # 15× > 5×
    assert by_key["w3"].met is True  # 25% of the reference ≥ 20%
    assert by_key["w1_growth"].ratio is None
    assert by_key["w1_growth"].met is False  # 1.5 > 1.2
    assert by_key["w3_mb"].met is True
    console = Console(width=120, record=True)
    print_table(rows, console)
    text = console.export_text()
    for fragment in (
        "W1 µs/step, 1 tool",
        "150.0 µs",
        "10.0 µs",
        "15.0x",
        "≤ 5x missed",
        "≤ 5x ok",
        "≥ 100,000/s ok",
    ):
        assert fragment in text
    write_json({"loop": LOOP}, rows, str(tmp_path / "b.json"))
    record = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert record["results"]["loop"] == LOOP
    assert [row["key"] for row in record["rows"]] == [row.key for row in rows]


def test_bench_help_names_its_options(tmp_path: Path) -> None:
    done = cli("bench", "--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--quick", "--json", "--store", "--config", "--debug"):
        assert option in done.stdout


def test_bench_loads_the_scripts_of_the_source_tree() -> None:
    directory = bench_scripts()
    assert directory == REPO / "scripts" / "bench"
    loop = load_script("loop")
    assert Path(loop.__file__ or "").parent == directory
    assert callable(loop.run_loop_bench)


def test_bench_without_the_source_tree_says_where_the_benchmarks_are(tmp_path: Path) -> None:
    done = cli("bench", "--quick", cwd=tmp_path, DSH_AGENT_BENCH_DIR=str(tmp_path / "none"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert "the benchmarks ship with the source tree (scripts/bench/)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
