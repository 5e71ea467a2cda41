"""``dsh-agent simulate``: many agents on a real store, a summary, zero violations."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path

from rich.console import Console

from dsh_agent_loop.cli._simulate import SimOptions, SimSummary, exit_code, run_simulation

from .helpers import cli


def test_300_agents_on_sqlite(tmp_path: Path) -> None:
    done = cli(
        "simulate",
        "--agents",
        "300",
        "--store",
        "sqlite:///sim.db",
        "--json",
        "sim.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "simulate on sqlite:///sim.db" in out
    for label in ("steps/s", "step latency p50", "step latency p99", "RSS per live agent"):
        assert label in out
    assert "300 / 300" in out
    summary = json.loads((tmp_path / "sim.json").read_text(encoding="utf-8"))
    assert summary["agents"] == 300
    assert summary["violations"] == 0
    assert summary["turns_completed"] == summary["turns_total"] == 300
    assert summary["steps"] == 600  # one tool step and one text step per turn
    assert summary["steps_per_s"] > 0
    assert summary["mb_per_agent"] > 0
    assert summary["check_s"] > 0
    assert summary["close_s"] > 0
    assert "logs read back and checked in" in out
    listed = cli("sessions", "list", "--store", "sqlite:///sim.db", cwd=tmp_path)
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert len(rows) == 300
    assert {row[1] for row in rows} == {f"sim-{n}" for n in range(300)}
    assert {row[3] for row in rows} == {"completed"}
    assert all(row[0].startswith(f"{row[1]}-session-") for row in rows)


def test_seeded_runs_repeat_their_replies(tmp_path: Path) -> None:
    texts = []
    for run, seed in enumerate(("7", "7", "8")):
        store = f"sqlite:///run{run}.db"
        done = cli(
            "simulate",
            "--agents",
            "2",
            "--turns",
            "2",
            "--tools",
            "2",
            "--seed",
            seed,
            "--store",
            store,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        listed = cli("sessions", "list", "--store", store, cwd=tmp_path).stdout.splitlines()
        sim1 = next(line.split("\t")[0] for line in listed if "\tsim-1\t" in line)
        exported = cli("sessions", "export", sim1, "--store", store, cwd=tmp_path).stdout
        events = [json.loads(line) for line in exported.splitlines()[1:]]
        calls = [e["data"]["arguments"] for e in events if e["type"] == "tool/call"]
        replies = [
            block["text"]
            for e in events
            if e["type"] == "assistant/message"
            for block in e["data"]["message"]["content"]
            if block["type"] == "text"
        ]
        assert len(calls) == 4  # 2 turns x 2 tool steps
        assert len(replies) == 2
        texts.append((calls, replies))
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_memory_store_and_exit_code_rules(tmp_path: Path) -> None:
    done = cli("simulate", "--agents", "5", "--tools", "0", "--store", "memory:", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 / 5" in done.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written for a memory store
    base = dict(
        store="memory:",
        agents=1,
        turns_total=1,
        turns_completed=1,
        turn_ends={"completed": 1},
        events=10,
        steps=1,
        wall_s=1.0,
        create_s=0.1,
        close_s=0.1,
        check_s=0.1,
        steps_per_s=1.0,
        step_p50_ms=1.0,
        step_p99_ms=1.0,
        mb_per_agent=0.1,
        violations=0,
        violation_samples=(),
        seed=0,
        tools=1,
        latency_ms=0.0,
    )
    assert exit_code(SimSummary(**base)) == 0
    assert exit_code(SimSummary(**{**base, "violations": 2})) == 1
    # SPEC §17: exit 1 only on violations; turns that did not complete are reported, not failed
    assert exit_code(SimSummary(**{**base, "turns_completed": 0})) == 0


async def test_the_simulation_pauses_the_collector_freezes_its_agents_and_restores_it(
    monkeypatch,
) -> None:
    from dsh_agent_loop import MemoryStore
    from dsh_agent_loop.runtime import Runtime

    freezes = []
    original = Runtime.gc_freeze

    def spying(self: Runtime) -> int:
        freezes.append((len(self.agents.list()), gc.isenabled()))
        return original(self)

    monkeypatch.setattr(Runtime, "gc_freeze", spying)
    gc.unfreeze()
    before = (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count())
    assert before[1]
    console = Console(file=io.StringIO())
    options = SimOptions(agents=25, tools=2)
    summary = await run_simulation(options, MemoryStore(), "memory:", {}, console)
    assert summary.ok
    assert summary.steps == 75
    assert freezes == [(25, False)]  # once all agents exist, with the collector paused
    assert (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()) == before


async def test_a_disabled_collector_stays_disabled() -> None:
    from dsh_agent_loop import MemoryStore

    gc.disable()
    try:
        options = SimOptions(agents=3, tools=1)
        summary = await run_simulation(
            options, MemoryStore(), "memory:", {}, Console(file=io.StringIO())
        )
        assert summary.ok
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_verb_leaves_its_dead_agents_out_of_the_exit_collection(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from dsh_agent_loop.cli._app import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    gc.collect()
    gc.unfreeze()
    try:
        code = main(["simulate", "--agents", "4", "--tools", "1", "--store", "memory:"])
        assert code == 0
        assert "4 / 4" in capsys.readouterr().out
        # the run's agents are cycles: frozen, the collection at exit would not walk them
        assert gc.get_freeze_count() > 0
        assert gc.collect() == 0
    finally:
        gc.unfreeze()
        gc.collect()
