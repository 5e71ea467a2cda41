"""``dsh-agent bench``: the table built from the benchmark records."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools
from rich.console import Console

from dsh_agent_loop.cli import _bench
from dsh_agent_loop.cli._app import main
from dsh_agent_loop.cli._bench import (
    BENCHMARKS,
    DEFAULT_TARGETS,
    Row,
    _loop_rows,
    _sse_rows,
    json_record,
    missed,
    print_table,
    report_misses,
    tabulate,
    target_text,
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
STORES = {
    "memory_w1_us_per_step": 50.0,
    "sqlite_w1_us_per_step": 120.0,
    "sqlite_w1_ratio": 2.4,
    "memory_hop_w1_us_per_step": 60.0,
    "sqlite_raw_step_commit_us": 40.0,
    "sqlite_w1_floor_us_per_step": 100.0,
    "sqlite_append_events_per_s": 60_000.0,
    "sqlite_raw_events_per_s": 100_000.0,
    "sqlite_append_ratio": 0.6,
    "postgres_w1_us_per_step": None,
}
#: Every target met.
GOOD_LOOP = {
    **LOOP,
    "w1_us_per_step": 40.0,
    "w1_growth_100_vs_10": 1.05,
    "w2_us_per_step": 90.0,
    "w3": [
        {"agents": 1000, "steps_per_s": 6000.0, "ref_steps_per_s": 12000.0, "mb_per_agent": 0.02}
    ],
}


def test_rows_read_the_way_their_targets_are_stated(tmp_path: Path) -> None:
    rows = [*_loop_rows(LOOP, DEFAULT_TARGETS), *_sse_rows(SSE, DEFAULT_TARGETS)]
    by_key = {row.key: row for row in rows}
    assert by_key["w1"].ratio == 15.0
    assert by_key["w2"].ratio == 15.0
    assert by_key["w3"].ratio == 0.25  # a rate: a share of the reference's
    assert by_key["sse_abs"].ratio == 0.4
    assert by_key["sse_abs"].met is True  # 200,000/s ≥ 100,000/s
    assert by_key["w1"].met is False  # 15× > 5×
    assert by_key["w3"].met is True  # 25% of the reference ≥ 20%
    assert by_key["w1_growth"].ratio is None
    assert by_key["w1_growth"].met is False  # 1.5 > 1.2
    assert by_key["w3_mb"].met is True
    console = Console(width=140, record=True)
    print_table(rows, console)
    text = console.export_text()
    for fragment in (
        "W1 µs/step, 1 tool",
        "150.0 µs",
        "10.0 µs",
        "15.0x",
        "≤ 5x missed",
        "25%",
        "≥ 20% ok",
        "≥ 100,000/s ok",
    ):
        assert fragment in text
    write_json({"loop": LOOP}, rows, str(tmp_path / "b.json"))
    record = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert record["results"]["loop"] == LOOP
    assert [row["key"] for row in record["rows"]] == [row.key for row in rows]


def _table_cells(rows: list[Row]) -> dict[str, list[str]]:
    console = Console(width=200, record=True)
    print_table(rows, console)
    cells: dict[str, list[str]] = {}
    for line in console.export_text().splitlines():
        parts = [p.strip() for p in line.strip("│┃ ").split("│")]
        if len(parts) == 5:
            cells[parts[0]] = parts
    return cells


def test_the_table_ratio_is_the_json_ratio() -> None:
    rows = tabulate({"loop": LOOP, "stores": STORES, "sse": SSE})
    record = json.loads(json.dumps(json_record({"loop": LOOP, "stores": STORES}, rows)))
    cells = _table_cells(rows)
    assert len(record["rows"]) == len(rows) == 9
    for row in record["rows"]:
        shown = cells[row["workload"].strip()][3]
        if row["ratio"] is None:
            assert shown == "-"
        elif row["share"]:
            assert shown == f"{row['ratio']:.0%}"
        else:
            assert shown == f"{row['ratio']:.1f}x"
        assert shown == row["ratio_text"]
    by_key = {row["key"]: row for row in record["rows"]}
    # The share in the table is the figure the store benchmark records.
    assert by_key["sqlite_append"]["ratio"] == STORES["sqlite_append_ratio"]
    assert by_key["sqlite_w1"]["ratio"] == STORES["sqlite_w1_ratio"]
    assert cells["SQLite append events/s (ref: raw sqlite3 executemany)"][3:] == ["60%", "≥ 50% ok"]


def test_the_store_table_prints_the_reference_floor() -> None:
    cells = _table_cells(tabulate({"stores": STORES}))
    floor = cells["floor: memory W1 + worker hop + sqlite3 commit"]
    assert floor[1:] == ["100.0 µs", "50.0 µs", "2.0x", "-"]
    assert cells["W1 µs/step, SqliteStore (ref: MemoryStore)"][3:] == ["2.4x", "≤ 2x missed"]


def test_check_names_every_missed_target() -> None:
    assert missed(tabulate({"loop": GOOD_LOOP})) == []
    rows = tabulate({"loop": LOOP, "stores": STORES, "sse": SSE})
    assert [row.key for row in missed(rows)] == ["w1", "w1_growth", "w2", "sqlite_w1"]
    slow = {**GOOD_LOOP, "w3": [{**GOOD_LOOP["w3"][0], "steps_per_s": 2000.0}]}
    assert [row.key for row in missed(tabulate({"loop": slow}))] == ["w3"]  # 17% < 20%
    fat = {**GOOD_LOOP, "w3": [{**GOOD_LOOP["w3"][0], "mb_per_agent": 0.031}]}
    assert [row.key for row in missed(tabulate({"loop": fat}))] == ["w3_mb"]
    errors = Console(width=200, record=True)
    assert report_misses(rows, errors) == 1
    lines = errors.export_text().splitlines()
    assert (
        lines[0]
        == "target missed: W1 µs/step, 1 tool: 150.0 µs vs 10.0 µs, ratio 15.0x, target ≤ 5x"
    )
    assert len(lines) == 4
    quiet = Console(record=True)
    assert report_misses(tabulate({"loop": GOOD_LOOP}), quiet) == 0
    assert quiet.export_text() == ""


def test_bench_help_names_its_options(tmp_path: Path) -> None:
    done = cli("bench", "--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--quick", "--json", "--store", "--config", "--debug"):
        assert option in done.stdout


def test_the_benchmarks_are_modules_of_the_package() -> None:
    for bench in BENCHMARKS:
        module = importlib.import_module(bench.module)
        assert bench.module.startswith("dsh_agent_loop.")
        assert Path(module.__file__ or "").is_relative_to(REPO / "src" / "dsh_agent_loop")
        assert callable(getattr(module, bench.function))
    assert {b.module for b in BENCHMARKS} >= {
        f"dsh_agent_loop.bench.{name}"
        for name in ("loop", "stores", "scale", "compaction", "fleet")
    }


def test_importing_the_package_or_the_cli_does_not_import_the_benchmarks(tmp_path: Path) -> None:
    code = (
        "import sys, dsh_agent_loop, dsh_agent_loop.cli._app\n"
        "print(sorted(m for m in sys.modules if m.startswith('dsh_agent_loop.bench')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# --- a plain (non-editable) install ---------------------------------------------------------


def _wheel_packages() -> tuple[Path, list[str], dict[str, list[str]]]:
    """(source root, packages, package data) as pyproject's setuptools config finds them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setup = config["tool"]["setuptools"]
    src = REPO / setup["packages"]["find"]["where"][0]
    return src, setuptools.find_packages(where=str(src)), setup.get("package-data", {})


def test_the_wheel_config_ships_the_benchmarks() -> None:
    src, packages, _ = _wheel_packages()
    assert "dsh_agent_loop.bench" in packages
    shipped = {p.name for p in (src / "dsh_agent_loop" / "bench").glob("*.py")}
    assert shipped >= {
        "__init__.py", "loop.py", "stores.py", "scale.py", "compaction.py", "fleet.py"
    }  # fmt: skip


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding what a wheel holds: each found package's modules and package data."""
    src, packages, data = _wheel_packages()
    site = tmp_path_factory.mktemp("site")
    for package in packages:
        source = src.joinpath(*package.split("."))
        target = site.joinpath(*package.split("."))
        target.mkdir(parents=True)
        patterns = ["*.py", *data.get(package, [])]
        for path in {p for pattern in patterns for p in source.glob(pattern)}:
            shutil.copy2(path, target / path.name)
    return site


def _run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd`` with ``site`` first on the path, no bench-directory override."""
    env = {k: v for k, v in os.environ.items() if k != "DSH_AGENT_BENCH_DIR"}
    env.update(PYTHONPATH=str(site), COLUMNS="160", XDG_CONFIG_HOME=str(cwd / ".xdg"))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_a_plain_install_runs_the_scale_children_from_the_package(
    plain_install: Path, tmp_path: Path
) -> None:
    out = tmp_path / "scale.json"
    code = (
        "import json, sys, dsh_agent_loop.bench.scale as scale\n"
        "print(scale.__file__)\n"
        "json.dump(scale.run_scale_bench(sizes=(20,)), open(sys.argv[1], 'w'))\n"
    )
    done = _run_installed(plain_install, tmp_path, "-c", code, str(out))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.splitlines()[0]).is_relative_to(plain_install)
    (entry,) = json.loads(out.read_text(encoding="utf-8"))["sizes"]
    for side in ("ours", "ref"):  # each measured in a child: python -m dsh_agent_loop.bench.scale
        figures = entry[side]
        assert figures["agents"] == 20
        assert figures["steps_per_s"] > 0
        assert 0 <= figures["gc_share"] <= 1
        assert figures["peak_rss_mb"] > 10  # a Python process's, in MB (not kB)
    assert "growth" not in json.loads(out.read_text(encoding="utf-8"))  # needs 100 and 10,000


@pytest.mark.slow
def test_bench_quick_runs_from_a_plain_install_outside_the_checkout(
    plain_install: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    done = _run_installed(
        plain_install, tmp_path, "-m", "dsh_agent_loop.cli", "bench", "--quick", "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert "dsh-agent bench" in done.stdout
    assert "W1 µs/step, 1 tool" in done.stdout
    record = json.loads(out.read_text(encoding="utf-8"))
    assert set(record["results"]) == {"loop", "stores", "compaction", "fleet", "sse"}
    keys = {row["key"] for row in record["rows"]}
    assert {"w1", "w2", "w3", "sqlite_w1", "sqlite_append", "compaction", "sse_abs"} <= keys


@pytest.mark.parametrize(("loop", "code"), [(LOOP, 1), (GOOD_LOOP, 0)])
def test_bench_check_exit_code_follows_the_misses(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    loop: dict[str, object],
    code: int,
) -> None:
    results = {"loop": loop}
    monkeypatch.setattr(_bench, "run_benchmarks", lambda quick: (results, tabulate(results)))
    out = tmp_path / "b.json"
    assert main(["bench", "--quick", "--check", "--json", str(out)]) == code
    assert main(["bench", "--quick"]) == 0  # without --check a miss is only shown
    captured = capsys.readouterr()
    assert ("target missed: W1 µs/step" in captured.err) is (code == 1)
    assert json.loads(out.read_text(encoding="utf-8"))["missed"] == (
        ["w1", "w1_growth", "w2"] if code else []
    )


def _scale_size(n: int, ours: float, ref: float, gc_share: float) -> dict[str, object]:
    side = {"us_per_step": 0.0, "gc_share": 0.2, "peak_rss_mb": 50.0, "gc_collections": 3}
    return {
        "agents": n,
        "ours": {**side, "steps_per_s": ours, "gc_share": gc_share},
        "ref": {**side, "steps_per_s": ref},
        "share": ours / ref,
    }


def test_scale_rows_carry_the_issue_15_targets() -> None:
    scale = {
        "sizes": [
            _scale_size(100, 10_000.0, 30_000.0, 0.05),
            _scale_size(2_000, 6_000.0, 20_000.0, 0.08),
            _scale_size(10_000, 4_000.0, 10_000.0, 0.30),
        ],
        "growth": {"ours": 2.5, "ref": 3.0, "ratio": 2.5 / 3.0},
    }
    rows = tabulate({"scale": scale})
    cells = {r.workload: (r.ratio, target_text(r)) for r in rows}
    # no throughput target at 100 agents; 30% at 2,000 meets 25%; 40% at 10,000 too
    assert cells["Scale steps/s, 100 agents"][1] == "-"
    assert cells["Scale steps/s, 2,000 agents"] == (0.3, "≥ 25% ok")
    assert cells["Scale steps/s, 10,000 agents"][1] == "≥ 25% ok"
    assert cells["Scale GC share of wall time, 2,000 agents"][1] == "≤ 10% ok"
    assert cells["Scale GC share of wall time, 10,000 agents"][1] == "≤ 10% missed"
    growth = "Scale µs/step growth 100 → 10,000 agents (ratio: ours/ref)"
    assert cells[growth] == (pytest.approx(2.5 / 3.0), "≤ 1.3x ok")
    assert [r.key for r in missed(rows)] == ["scale_gc"]


def test_the_compaction_rows_report_its_cost_and_the_check_per_step() -> None:
    from dsh_agent_loop.cli._bench import tabulate

    figures = {
        "messages": 1000.0,
        "compact_ms_best": 2.25,
        "compact_ms_median": 2.5,
        "usage_us_best": 3.0,
        "w1_plain_us_per_step": 50.0,
        "w1_policy_us_per_step": 52.0,
    }
    rows = {row.key: row for row in tabulate({"compaction": figures})}
    assert rows["compaction"].ours == "2.2 ms"
    assert "1,000 messages" in rows["compaction"].workload
    assert rows["compaction_w1"].ratio == 52.0 / 50.0


# --- the fleet benchmark ----------------------------------------------------------------------


def test_fleet_rows_show_latency_and_the_two_worker_share() -> None:
    figures = {
        "latency_p50_ms": 12.0, "latency_p99_ms": 40.0, "latency_samples": 20.0,
        "turns_per_s_1": 100.0, "turns_per_s_2": 150.0, "turns": 40.0,
    }  # fmt: skip
    rows = {row.key: row for row in tabulate({"fleet": {"sqlite": figures, "postgres": None}})}
    assert set(rows) == {"fleet_sqlite_latency", "fleet_sqlite_turns"}
    assert rows["fleet_sqlite_latency"].ours == "12.0 / 40.0 ms"
    assert rows["fleet_sqlite_turns"].ratio == 1.5
    assert rows["fleet_sqlite_turns"].ours == "150/s"
    assert rows["fleet_sqlite_turns"].reference == "100/s"


def test_the_fleet_benchmark_measures_real_workers_on_sqlite(tmp_path: Path) -> None:
    from dsh_agent_loop.bench.fleet import measure_latency, measure_turns

    latency = measure_latency(f"sqlite:///{tmp_path / 'latency.db'}", 3)
    assert latency["samples"] == 3
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert measure_turns(f"sqlite:///{tmp_path / 'turns.db'}", 2, 4, 2) > 0
