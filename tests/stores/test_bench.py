"""``dsh_agent_loop.bench.stores`` at toy sizes: the figures exist and are positive; the table."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from dsh_agent_loop.bench import stores as bench
from dsh_agent_loop.stores import SqliteStore


def test_append_throughput_and_its_raw_references(tmp_path: Path) -> None:
    rate, group = bench.append_throughput(partial(SqliteStore, tmp_path / "s.db"), 4, 3)
    assert rate > 0
    assert 1 <= group <= 4  # batches per commit: group commit joins concurrent flushes
    raw = bench.raw_sqlite_throughput(str(tmp_path / "raw.db"), 4, 3, group)
    encoded = bench.raw_sqlite_throughput(str(tmp_path / "enc.db"), 4, 3, group, encoded=True)
    assert raw > 0
    assert encoded > 0


def test_raw_rows_are_the_stored_form() -> None:
    rows = [row for batch in bench._raw_rows(2, 2) for row in batch]
    assert len(rows) == 2 * 2 * bench.BATCH
    assert {(r[0], r[1]) for r in rows} == {(f"tp-{i}", s) for i in range(2) for s in range(6)}
    assert all(json.loads(r[3])["seq"] == r[1] for r in rows)


def test_table_rows() -> None:
    result = {
        "sqlite_w1_us_per_step": 200.0,
        "memory_w1_us_per_step": 100.0,
        "sqlite_w1_ratio": 2.0,
        "sqlite_append_events_per_s": 50_000.0,
        "sqlite_raw_events_per_s": 60_000.0,
        "sqlite_append_ratio": 50_000 / 60_000,
        "sqlite_raw_preencoded_events_per_s": 100_000.0,
        "memory_hop_w1_us_per_step": 150.0,
        "sqlite_raw_step_commit_us": 30.0,
        "sqlite_w1_floor_us_per_step": 180.0,
        "postgres_w1_us_per_step": None,
    }
    table = bench.rows(result)
    assert [row[3] for row in table] == ["2.00×", "1.80×", "", "83%", "50%"]
    assert table[2][1:3] == ("150", "30")
    result.update(
        postgres_w1_us_per_step=1000.0,
        postgres_append_events_per_s=5000.0,
        postgres_raw_events_per_s=4000.0,
    )
    assert [row[3] for row in bench.rows(result)[5:]] == ["10.00×", "125%"]


def test_the_floor_parts_run_the_real_paths(tmp_path: Path) -> None:
    # W1 on the hop store: a memory store whose every commit crosses to a worker thread.
    hops = []

    def counting() -> None:
        hops.append(1)

    original = bench._nothing
    bench._nothing = counting  # type: ignore[assignment]
    try:
        seconds = bench.w1(5, store_factory=bench._HopStore)
    finally:
        bench._nothing = original  # type: ignore[assignment]
    assert seconds > 0
    assert len(hops) >= 5  # at least one hop per step (a flush before each tool)
    assert bench.raw_step_commit_us(str(tmp_path / "step.db"), rounds=20) > 0
