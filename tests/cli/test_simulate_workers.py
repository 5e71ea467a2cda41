"""``dsh-agent simulate --workers N``: shards in worker processes, one merged summary.

Every test runs the verb as a user would, in a subprocess; the workers are real processes too.
A worker learns its shard from ``$DSH_AGENT_SIM_SHARD``, which the tool modules below read to
misbehave in one shard only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from .helpers import COMMAND, cli, environment

#: A final progress line: description, bar, ``done/total``, seconds.
BAR = re.compile(r"^(creating agents|turns|checking logs)\s.*?(\d+)/(\d+) (\d+\.\d\d) s$")


def _simulate(tmp_path: Path, *args: str, json_name: str = "sim.json") -> dict[str, Any]:
    done = cli("simulate", "--store", "memory:", "--json", json_name, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads((tmp_path / json_name).read_text(encoding="utf-8"))
    summary["stdout"] = done.stdout
    return summary


def _shard_records(tmp_path: Path, shard: str, *args: str) -> list[dict[str, Any]]:
    """What a worker reports, run on its own (the hidden ``--shard I/N``)."""
    done = cli("simulate", "--store", "memory:", "--shard", shard, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_two_workers_merge_to_the_sum_of_their_shards(tmp_path: Path) -> None:
    args = ("--agents", "31", "--turns", "2", "--tools", "2", "--seed", "3")
    merged = _simulate(tmp_path, *args, "--workers", "2")
    assert merged["workers"] == 2
    assert merged["agents"] == 31
    assert merged["turns_total"] == merged["turns_completed"] == 62
    assert merged["turn_ends"] == {"completed": 62}
    assert merged["steps"] == 62 * 3  # two tool steps and a text step per turn
    assert merged["violations"] == 0
    assert merged["step_p99_ms"] >= merged["step_p50_ms"] > 0
    assert merged["mb_per_agent"] > 0
    out = merged["stdout"]
    assert "2 workers" in out
    assert "62 / 62" in out
    bars = [BAR.match(line.strip()) for line in out.splitlines()]
    shown = [(m[1], m[2], m[3]) for m in bars if m is not None]
    assert shown == [  # one set of bars, over every worker's agents, each run to its end
        ("creating agents", "31", "31"),
        ("turns", "62", "62"),
        ("checking logs", "31", "31"),
    ]
    # The shards, each run on its own: agents sim-k with k % 2 == I, reported as JSON lines.
    finals = []
    for shard in ("0/2", "1/2"):
        records = _shard_records(tmp_path, shard, *args)
        assert records[-1]["sim"] == "summary"
        assert [r["sim"] for r in records[:-1] if r["sim"] != "done"] == [
            "begin", "end", "begin", "end", "begin", "end"
        ]  # fmt: skip
        done = [r["counts"] for r in records if r["sim"] == "done"]
        finals.append(records[-1])
        agents = records[-1]["agents"]
        assert [sum(column) for column in zip(*done, strict=True)] == [agents, 2 * agents, agents]
    assert [f["agents"] for f in finals] == [16, 15]
    for key in ("events", "steps", "violations"):
        assert merged[key] == sum(f[key] for f in finals), key
    steps = sum(sum(f["latency"].values()) for f in finals)
    assert steps == merged["steps"]  # every step's latency is in the merged percentiles
    digest = sum(f["digest"] for f in finals) % 2**64
    assert merged["replies_digest"] == f"{digest:016x}"


def test_workers_hold_the_same_conversations_as_one_process(tmp_path: Path) -> None:
    args = ("--agents", "40", "--turns", "2", "--tools", "1", "--seed", "7")
    one = _simulate(tmp_path, *args, json_name="one.json")
    two = _simulate(tmp_path, *args, "--workers", "2", json_name="two.json")
    three = _simulate(tmp_path, *args, "--workers", "3", json_name="three.json")
    other_seed = _simulate(tmp_path, *args[:-1], "8", "--workers", "2", json_name="other.json")
    assert (one["workers"], two["workers"], three["workers"]) == (1, 2, 3)
    assert "workers" not in one["stdout"]
    for key in ("events", "steps", "turn_ends", "replies_digest"):
        assert one[key] == two[key] == three[key], key
    assert len(one["replies_digest"]) == 16
    assert other_seed["replies_digest"] != one["replies_digest"]


def test_more_workers_than_agents_run_one_agent_each(tmp_path: Path) -> None:
    summary = _simulate(tmp_path, "--agents", "3", "--workers", "5")
    assert summary["workers"] == 3
    assert summary["turns_completed"] == 3
    single = _simulate(tmp_path, "--agents", "1", "--workers", "4", json_name="single.json")
    assert single["workers"] == 1  # one agent: run in this process
    every_cpu = _simulate(tmp_path, "--agents", "3", "--workers", "0", json_name="cpus.json")
    assert every_cpu["workers"] == min(os.cpu_count() or 1, 3)


def test_the_workers_option_is_checked(tmp_path: Path) -> None:
    for value in ("65", "-1", "two"):
        done = cli(
            "simulate", "--agents", "4", "--workers", value, "--store", "memory:", cwd=tmp_path
        )
        assert done.returncode == 2, value
        assert "--workers" in done.stderr
        assert "0 to 64" in done.stderr or "integer" in done.stderr


def _tool_module(tmp_path: Path, name: str, body: str) -> None:
    source = f"""
        import os
        import signal

        from dsh_agent_loop import tool

        SHARD = os.environ.get("DSH_AGENT_SIM_SHARD")
        if SHARD is not None:
            with open(f"pid-{{SHARD}}", "w") as f:
                f.write(str(os.getpid()))
        {textwrap.indent(textwrap.dedent(body), " " * 8).strip()}


        @tool
        async def noop() -> str:
            \"\"\"Do nothing.\"\"\"
            return "ok"
    """
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_failing_worker_fails_the_run_naming_its_shard(tmp_path: Path) -> None:
    # Shard 1 fails as its tools load; shard 0 hangs until a signal: it is ended, not awaited.
    _tool_module(
        tmp_path,
        "flaky",
        """
        if SHARD == "1":
            raise RuntimeError("shard one refuses to start")
        if SHARD == "0":
            signal.pause()
        """,
    )
    done = cli(
        "simulate", "--agents", "10", "--workers", "2", "--store", "memory:",
        "--tool", "flaky:noop", "--json", "sim.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "shard 1 of 2" in done.stderr
    assert "exited with code 2" in done.stderr
    assert "shard one refuses to start" in done.stderr  # the worker's own error line
    assert "shard 0" not in done.stderr
    assert "simulate on" not in done.stdout  # no summary of a run that did not finish
    assert not (tmp_path / "sim.json").exists()
    assert _gone(int((tmp_path / "pid-0").read_text()))


def test_a_violation_in_one_worker_fails_the_merged_run(tmp_path: Path) -> None:
    _tool_module(
        tmp_path,
        "planted",
        """
        if SHARD == "1":
            from dsh_agent_loop import invariants

            real = invariants.check

            def check(events):
                return [*real(events), "planted violation"]

            invariants.check = check
        """,
    )
    done = cli(
        "simulate", "--agents", "6", "--workers", "2", "--store", "memory:",
        "--tool", "planted:noop", "--json", "sim.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    summary = json.loads((tmp_path / "sim.json").read_text(encoding="utf-8"))
    assert summary["violations"] == 3  # sim-1, sim-3, sim-5: shard 1's sessions
    assert summary["turns_completed"] == 6
    samples = summary["violation_samples"]
    assert sorted(s.split("-session-")[0] for s in samples) == ["sim-1", "sim-3", "sim-5"]
    assert all(s.endswith(": planted violation") for s in samples)
    assert "violation: sim-1-session-" in done.stdout


def test_ctrl_c_ends_every_worker(tmp_path: Path) -> None:
    _tool_module(tmp_path, "slow", "if SHARD is not None:\n    signal.pause()\n")
    parent = subprocess.Popen(
        [*COMMAND, "simulate", "--agents", "4", "--workers", "2", "--store", "memory:",
         "--tool", "slow:noop"],
        cwd=tmp_path, env=environment(tmp_path), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = [tmp_path / "pid-0", tmp_path / "pid-1"]
        while not all(p.exists() and p.read_text() for p in pids):
            assert parent.poll() is None, parent.communicate()
            time.sleep(0.02)  # waiting for the workers to start, not timing them
        parent.send_signal(signal.SIGINT)
        _, stderr = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 130, stderr
    assert all(_gone(int(p.read_text())) for p in pids)


def test_one_worker_is_todays_run(tmp_path: Path) -> None:
    default = _simulate(tmp_path, "--agents", "5", json_name="default.json")
    explicit = _simulate(tmp_path, "--agents", "5", "--workers", "1", json_name="one.json")
    for summary in (default, explicit):
        assert summary["workers"] == 1
        assert "worker" not in summary["stdout"]
    assert default["replies_digest"] == explicit["replies_digest"]
    # one process: the store may be any store
    done = cli(
        "simulate", "--agents", "3", "--workers", "1", "--store", "sqlite:///s.db", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr


def test_merged_percentiles_are_within_one_percent_of_the_exact_ones() -> None:
    import random

    from dsh_agent_loop.cli._sim_summary import LatencyHistogram, percentile

    rng = random.Random(5)
    shards = [[rng.lognormvariate(-4, 1.2) for _ in range(3_000)] for _ in range(3)]
    shards[0].extend([0.0, 1e-9])  # below the smallest bucket: counted, not lost
    merged = LatencyHistogram()
    for shard in shards:
        counts = json.loads(json.dumps(LatencyHistogram.of(shard).counts))  # as a worker sends
        merged.merge({int(bucket): count for bucket, count in counts.items()})
    every = sorted(value for shard in shards for value in shard)
    assert sum(merged.counts.values()) == len(every)
    for fraction in (0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
        exact = percentile(every, fraction)
        assert merged.percentile(fraction) == pytest.approx(exact, rel=0.01), fraction
    assert LatencyHistogram().percentile(0.5) == 0.0


def test_report_lines_are_bounded_and_split_across_chunks() -> None:
    from dsh_agent_loop.cli._sim_procs import _Lines

    lines = _Lines(limit=8)
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b':1}\n{"b":2}\nrest') == [b'{"a":1}', b'{"b":2}']
    assert lines.feed(b"-of-a-long-line") == [b"rest-of-a-long-line"]  # cut at the limit
    assert lines.feed(b"tail\n") == [b"tail"]
    assert lines.feed(b"last") == []
    assert lines.end() == [b"last"]
    assert lines.end() == []
