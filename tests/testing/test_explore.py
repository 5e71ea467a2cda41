"""explore_cancellation: every checkpoint of the project's scenarios; broken variants it catches."""

from __future__ import annotations

import pytest
import trio

import dsh_agent_loop._agent.tool_calls as tool_calls
import dsh_agent_loop._agent.turn as turn
from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, tool
from dsh_agent_loop.testing import explore_cancellation
from dsh_agent_loop.testing._explore import explore_cancellation_async


@tool(execution_mode="exclusive")
async def set_note(text: str) -> str:
    """Set a note."""
    await trio.sleep(0.01)
    return f"noted {text}"


@tool
async def weather(city: str) -> str:
    """Look up the weather."""
    await trio.sleep(0.02 if city == "Paris" else 0.01)
    return f"sunny in {city}"


async def one_prompt(rt):
    h = await rt.agents.create(options=AgentOptions(id="main", provider="scripted", model="m"))
    h.agent.followup("go")
    await h.agent.wait_idle()


def text_model():
    return {
        "scripted": ScriptedModel([Reply.text("Hello there, friend", reasoning="think it over")])
    }


def tools_model():
    return {
        "scripted": ScriptedModel(
            [
                Reply.tool_calls(
                    ("set_note", {"text": "a"}),
                    ("weather", {"city": "Paris"}),
                    ("weather", {"city": "Rome"}),
                    ("weather", {"city": "Oslo"}),
                ),
                Reply.text("all done"),
            ]
        )
    }


def retry_model():
    return {
        "scripted": ScriptedModel(
            [
                Reply.error("HTTP_5XX", "bad gateway", after_text="par"),
                Reply.text("second try works"),
            ]
        )
    }


@pytest.mark.parametrize(
    ("name", "providers", "tools", "min_k"),
    [
        # (on the memory store a flush commits in the flushing task: no writer wake-up pause)
        ("text", text_model, (), 7),
        ("tools", tools_model, (set_note, weather), 15),
        ("retry", retry_model, (), 6),
    ],
)
def test_every_checkpoint_is_well_formed(name, providers, tools, min_k, capsys):
    report = explore_cancellation(one_prompt, providers=providers, tools=tools, seed=1)
    with capsys.disabled():
        print(
            f"\nexplore_cancellation[{name}]: K={report.checkpoints}"
            f" runs={report.runs} sites={report.sites}"
        )
    assert report.failures == []
    assert report.checkpoints >= min_k
    assert report.runs == report.checkpoints
    assert report.sites >= 2


def test_k_is_deterministic():
    a = explore_cancellation(one_prompt, providers=tools_model, tools=(set_note, weather), seed=3)
    b = explore_cancellation(one_prompt, providers=tools_model, tools=(set_note, weather), seed=3)
    assert a.checkpoints == b.checkpoints
    assert a.failures == b.failures == []


def test_catches_a_lost_interrupted_anchor(monkeypatch):
    original = turn.Turn.close_open_work

    def forget_stream(self):
        if self.attempt is not None:
            self.attempt.asm = None
        original(self)

    monkeypatch.setattr(turn.Turn, "close_open_work", forget_stream)
    report = explore_cancellation(one_prompt, providers=text_model)
    assert report.failures
    assert any("no end frame" in problem for _, problem in report.failures)


def test_catches_a_wrong_delivered_prefix(monkeypatch):
    from dsh_agent_loop.llm._assemble import Assembler

    original = Assembler.content

    def drop_last_word(self):
        blocks = original(self)
        if self.finish is None and blocks and blocks[-1]["type"] == "text":
            from dsh_agent_loop import FrozenDict

            text = blocks[-1]["text"].rsplit(" ", 1)[0]
            blocks = (*blocks[:-1], FrozenDict(type="text", text=text + "!"))
        return blocks

    monkeypatch.setattr(Assembler, "content", drop_last_word)
    report = explore_cancellation(one_prompt, providers=text_model)
    assert any("but the stream delivered" in problem for _, problem in report.failures)


def test_catches_unanswered_tool_calls(monkeypatch):
    monkeypatch.setattr(tool_calls.ToolBatch, "close_remaining", lambda self: None)
    report = explore_cancellation(one_prompt, providers=tools_model, tools=(set_note, weather))
    assert any(
        "has no tool/result" in problem or "before the results" in problem
        for _, problem in report.failures
    )


def test_catches_a_turn_that_does_not_abort(monkeypatch):
    original = turn.Turn.aborted_reason

    def completed(self, default_cause="user"):
        from dsh_agent_loop import FrozenDict

        reason = original(self, default_cause)
        return FrozenDict(kind="completed") if reason["cause"] == "user" else reason

    monkeypatch.setattr(turn.Turn, "aborted_reason", completed)
    report = explore_cancellation(one_prompt, providers=text_model)
    assert any("open at the cancel ended" in problem for _, problem in report.failures)


def test_max_checkpoints_samples_evenly():
    report = explore_cancellation(
        one_prompt, providers=tools_model, tools=(set_note, weather), max_checkpoints=5
    )
    assert report.runs == 5
    assert report.checkpoints > 5
    assert report.failures == []


def test_a_scenario_whose_checkpoints_change_between_runs_is_reported():
    runs = []

    @tool
    async def drifting() -> str:
        """Wait once more on every run."""
        runs.append(1)
        for _ in range(len(runs)):
            await trio.sleep(0.01)
        return "ok"

    def model():
        return {"scripted": ScriptedModel([Reply.tool_calls(("drifting", {})), Reply.text("ok")])}

    report = explore_cancellation(one_prompt, providers=model, tools=(drifting,))
    assert any("K is not stable" in problem for _, problem in report.failures)


@tool
async def swallows_cancel(n: int = 0) -> str:
    """Wait, and answer even when cancelled (the bug explore must catch)."""
    try:
        await trio.sleep(1)
    except trio.Cancelled:
        return "pretended to finish"
    return "finished"


cleaned: list[int] = []


@tool
async def cleans_up_and_reraises(n: int = 0) -> str:
    """Wait; on cancel, clean up and re-raise (correct)."""
    try:
        await trio.sleep(1)
    except trio.Cancelled:
        cleaned.append(n)
        raise
    return "finished"


def one_tool_model(name):
    def providers():
        return {"scripted": ScriptedModel([Reply.tool_calls((name, {})), Reply.text("done")])}

    return providers


def test_catches_a_tool_that_swallows_cancelled():
    report = explore_cancellation(
        one_prompt, providers=one_tool_model("swallows_cancel"), tools=(swallows_cancel,)
    )
    swallowed = [
        n for n, problem in report.failures if "'swallows_cancel' returned normally" in problem
    ]
    assert swallowed, report.failures
    assert all(n > 0 for n in swallowed)  # only the runs that cancelled inside the tool
    assert any("swallowed trio.Cancelled" in problem for _, problem in report.failures)


def test_a_tool_that_reraises_cancelled_passes():
    report = explore_cancellation(
        one_prompt,
        providers=one_tool_model("cleans_up_and_reraises"),
        tools=(cleans_up_and_reraises,),
    )
    assert report.failures == []
    assert report.runs == report.checkpoints > 0
    assert cleaned  # some runs did cancel inside the tool


async def test_works_from_an_async_test():
    # A pytest-trio test: explore_cancellation is already inside a trio run here.
    assert trio.lowlevel.in_trio_run()
    blocking = explore_cancellation(one_prompt, providers=text_model, seed=1)
    awaited = await explore_cancellation_async(one_prompt, providers=text_model, seed=1)
    assert blocking.failures == awaited.failures == []
    assert blocking.checkpoints == awaited.checkpoints >= 7
    assert awaited.runs == awaited.checkpoints


async def test_the_async_form_reports_failures_too(autojump_clock):
    report = await explore_cancellation_async(
        one_prompt, providers=one_tool_model("swallows_cancel"), tools=(swallows_cancel,)
    )
    assert any("swallowed trio.Cancelled" in problem for _, problem in report.failures)


@tool
async def shielded(n: int = 0) -> str:
    """Finish its work shielded from cancellation (correct: Cancelled never reaches it)."""
    with trio.CancelScope(shield=True):
        await trio.sleep(0.5)
    return "saved"


@tool
async def own_timeout(n: int = 0) -> str:
    """Give up on a slow step after its own timeout (correct: that Cancelled is trio's)."""
    with trio.move_on_after(0.1):
        await trio.sleep(1)
    await trio.sleep(0.1)
    return "gave up waiting"


@pytest.mark.parametrize("correct", [shielded, own_timeout], ids=lambda t: t.name)
def test_shields_and_inner_timeouts_are_not_swallowing(correct):
    report = explore_cancellation(
        one_prompt, providers=one_tool_model(correct.name), tools=(correct,)
    )
    assert report.failures == []
    assert report.runs == report.checkpoints > 3
