"""``dsh-agent simulate``: many agents on a real store, a summary, zero violations."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dsh_agent_loop import MemoryStore
from dsh_agent_loop.cli._simulate import (
    DEFAULT_CONCURRENCY,
    SimOptions,
    SimScript,
    SimSummary,
    exit_code,
    measure_simulation,
)
from dsh_agent_loop.llm._base import ModelRequest
from dsh_agent_loop.llm._scripted import Reply

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
    # docs/design.md#exit-codes: exit 1 only on violations; turns that did not complete are
    # reported, not failed
    assert exit_code(SimSummary(**{**base, "turns_completed": 0})) == 0


async def test_the_simulation_pauses_the_collector_for_the_run_and_restores_it(
    monkeypatch,
) -> None:
    from dsh_agent_loop import invariants
    from dsh_agent_loop._agent.lifecycle import Agents
    from dsh_agent_loop._runtime import Runtime

    seen: list[tuple[str, bool]] = []
    create, check = Agents.create, invariants.check

    async def creating(self: Agents, *args: object, **kwargs: object) -> object:
        seen.append(("create", gc.isenabled()))
        return await create(self, *args, **kwargs)

    def checking(events: object) -> object:
        seen.append(("check", gc.isenabled()))
        return check(events)  # type: ignore[arg-type]

    def no_freeze(self: Runtime) -> int:
        raise AssertionError("the run freezes nothing: the collector is paused for all of it")

    monkeypatch.setattr(Agents, "create", creating)
    monkeypatch.setattr(invariants, "check", checking)
    monkeypatch.setattr(Runtime, "gc_freeze", no_freeze)
    gc.unfreeze()
    before = (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count())
    assert before[1]
    console = Console(file=io.StringIO())
    options = SimOptions(agents=25, tools=2)
    summary = await _summary(options, MemoryStore(), "memory:", {}, console)
    assert summary.ok
    assert summary.steps == 75
    assert seen.count(("create", False)) == 25  # paused from the first creation ...
    assert seen.count(("check", False)) == 25  # ... until the last log is checked
    assert len(seen) == 50
    assert (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()) == before


@pytest.mark.parametrize("concurrency", [1, 3, 0])
async def test_at_most_concurrency_agents_run_a_turn_at_once(monkeypatch, concurrency: int) -> None:
    """Turns overlap up to ``concurrency`` agents (0: all of them), and every turn completes."""
    agents, tools, turns = 12, 2, 2
    active: set[str] = set()
    widest = 0
    reply = SimScript.reply

    def watching(self: SimScript, request: ModelRequest) -> Reply:
        nonlocal widest
        answer = reply(self, request)
        agent = next(m for m in reversed(list(request.messages)) if m["role"] == "user")["content"][
            0
        ]["text"].split()[0]
        if answer.calls:
            active.add(agent)
            widest = max(widest, len(active))
        else:  # the turn's text reply: the agent's last turn may end now
            active.discard(agent)
        return answer

    monkeypatch.setattr(SimScript, "reply", watching)
    options = SimOptions(agents=agents, tools=tools, turns=turns, concurrency=concurrency)
    summary = await _summary(options, MemoryStore(), "memory:", {}, Console(file=io.StringIO()))
    assert summary.ok
    assert summary.turns_completed == agents * turns
    assert summary.concurrency == concurrency
    assert widest == (concurrency or agents)


async def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        options = SimOptions(agents=3, tools=1)
        summary = await _summary(options, MemoryStore(), "memory:", {}, Console(file=io.StringIO()))
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
        assert gc.isenabled()  # restored after the run
        # the run's agents are cycles: frozen, the collection at exit would not walk them
        assert gc.get_freeze_count() > 0
        assert gc.collect() == 0
        gc.unfreeze()
        assert gc.collect() > 0  # they were garbage, left to the process's exit
    finally:
        gc.unfreeze()
        gc.collect()


def test_the_concurrency_option(tmp_path: Path) -> None:
    done = cli("simulate", "--agents", "6", "--store", "memory:", "--json", "a.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "a.json").read_text())["concurrency"] == DEFAULT_CONCURRENCY
    assert "every agent in a turn at once" in done.stdout
    done = cli(
        "simulate", "--agents", "6", "--concurrency", "2", "--store", "memory:", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "at most 2 agents in a turn at once" in done.stdout
    assert "6 / 6" in done.stdout
    bad = cli(
        "simulate", "--agents", "6", "--concurrency", "-1", "--store", "memory:", cwd=tmp_path
    )
    assert bad.returncode == 2
    assert "--concurrency" in bad.stderr


async def test_agents_are_created_concurrently_and_keep_their_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``_CREATORS`` creations overlap; the sessions read back are sim-0 … in order."""
    from dsh_agent_loop._agent.lifecycle import Agents
    from dsh_agent_loop.cli import _simulate
    from dsh_agent_loop.stores import SqliteStore

    monkeypatch.setattr(_simulate, "_CREATORS", 4)
    active = widest = 0
    create, read_back = Agents.create, _simulate._read_back
    read: list[str] = []

    async def creating(self: Agents, *args: object, **kwargs: object) -> object:
        nonlocal active, widest
        active += 1
        widest = max(widest, active)
        try:
            return await create(self, *args, **kwargs)
        finally:
            active -= 1

    async def reading(store: object, session_ids: list[str], counts: object) -> object:
        read.extend(session_ids)
        return await read_back(store, session_ids, counts)  # type: ignore[arg-type]

    monkeypatch.setattr(Agents, "create", creating)
    monkeypatch.setattr(_simulate, "_read_back", reading)
    store = SqliteStore(tmp_path / "sim.db")
    options = SimOptions(agents=20, tools=1)
    summary = await _summary(options, store, "sqlite", {}, Console(file=io.StringIO()))
    assert summary.ok
    assert summary.turns_completed == 20
    assert widest == 4  # (each SQLite create waits for its claim transaction)
    assert [sid.split("-session-")[0] for sid in read] == [f"sim-{n}" for n in range(20)]


def _request(*messages: dict[str, object]) -> ModelRequest:
    from dsh_agent_loop._frozen import freeze

    return ModelRequest(config={}, messages=[freeze(m) for m in messages])


def _user(text: str) -> dict[str, object]:
    return {"role": "user", "id": "m-1", "content": [{"type": "text", "text": text}]}


def test_sim_text_replies_are_drawn_from_a_bounded_seeded_pool() -> None:
    from dsh_agent_loop.cli._sim_script import _VOCABULARY, REPLY_WORDS, TEXT_REPLIES

    script = SimScript(seed=3, tools=0)
    prompts = [f"sim-{n} turn 1" for n in range(4 * TEXT_REPLIES)]
    replies = [script.reply(_request(_user(p))) for p in prompts]
    for reply in replies:
        words = reply.content.split(" ")
        assert len(words) == REPLY_WORDS
        assert set(words) <= set(_VOCABULARY)
        assert not reply.calls
    # equal texts are one reply object (built once, chunks and all), and the pool is bounded
    by_text = {}
    for reply in replies:
        assert by_text.setdefault(reply.content, reply) is reply
    assert 0.9 * TEXT_REPLIES <= len(by_text) <= TEXT_REPLIES
    # the same inputs give the same reply in a new script; another seed gives other texts
    again = SimScript(seed=3, tools=0)
    assert [again.reply(_request(_user(p))).content for p in prompts[:50]] == [
        r.content for r in replies[:50]
    ]
    other = SimScript(seed=4, tools=0)
    other_texts = [other.reply(_request(_user(p))).content for p in prompts[:50]]
    assert sum(a != b.content for a, b in zip(other_texts, replies[:50], strict=True)) > 40


def test_sim_replies_follow_the_step_and_the_whole_prompt_text() -> None:
    script = SimScript(seed=0, tools=2)
    call = {"role": "assistant", "content": [{"type": "tool-call", "call_id": "c", "name": "t"}]}
    result = {"role": "tool", "call_id": "c", "name": "t", "content": []}
    first = script.reply(_request(_user("p")))
    second = script.reply(_request(_user("p"), call, result))
    third = script.reply(_request(_user("p"), call, result, call, result))
    assert first.calls
    assert second.calls
    assert not third.calls
    assert third.content
    # a prompt of two text blocks is read whole, as one of one block with the joined text
    two_blocks = {
        "role": "user",
        "id": "m-1",
        "content": [{"type": "text", "text": "sim-1 "}, {"type": "text", "text": "turn 1"}],
    }
    joined = script.reply(_request(_user("sim-1 turn 1"), call, result, call, result))
    split = script.reply(_request(two_blocks, call, result, call, result))
    assert split is joined
    # a later user message starts the count again
    assert script.reply(_request(_user("p"), call, result, call, result, _user("q"))).calls


async def _summary(*args: Any, **kwargs: Any) -> SimSummary:
    """The summary of ``measure_simulation(*args, **kwargs)``."""
    return (await measure_simulation(*args, **kwargs)).summary
