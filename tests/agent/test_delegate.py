"""The ``delegate`` tool (docs/design.md#sub-agents): a sub-agent runs the task, its answer is the
result."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    CompactionPolicy,
    InvalidOptionError,
    MemoryStore,
    Reply,
    ScriptedModel,
    TurnAbortedError,
    TurnBudget,
    delegate_tool,
    open_runtime,
    tool,
)
from dsh_agent_loop.testing import explore_cancellation

from .conftest import (
    assert_well_formed,
    hanging_tool,
    parent_child_runtime,
    plain,
    stored,
    turn_ends,
    user_texts,
)

PARENT = AgentOptions(id="main", provider="p", model="m")
HELPER = AgentOptions(id="helper", provider="c", model="m")


def results(events) -> list[dict[str, Any]]:
    """Each ``tool/result``: its text, error code and meta."""
    out = []
    for event in events:
        if event.type == "tool/result":
            (block,) = event.data["message"]["content"]
            error = event.data.get("error")
            out.append(
                {
                    "text": block["text"],
                    "code": None if error is None else error["code"],
                    "meta": plain(event.data.get("meta")),
                }
            )
    return out


def delegate(task: str, call_id: str, child: str | None = None) -> Reply:
    arguments = {"task": task} if child is None else {"task": task, "child": child}
    return Reply.tool_calls(("delegate", arguments, call_id))


async def test_the_child_answer_is_the_tool_result_and_the_child_is_reused(autojump_clock):
    async with parent_child_runtime(
        parent=[
            delegate("What is 6 times 7?", "d1"),
            Reply.text("It is 42."),
            delegate("And doubled?", "d2"),
            Reply.text("84."),
            delegate("Fresh start", "d3", child="other"),
            Reply.text("ok"),
        ],
        child=[Reply.text("42"), Reply.text("84"), Reply.text("fresh")],
    ) as rt:
        rt.add_tool(delegate_tool(rt, HELPER))
        parent = await rt.agents.create(options=PARENT)
        first = await parent.agent.run("go")
        assert first.text == "It is 42."
        child = rt.agents.get("main.helper")
        assert child is not None
        assert child.parent is parent.agent
        assert parent.agent.children == (child,)
        assert child.session.header["parent_session_id"] == parent.session_id
        assert results(parent.agent.session.events) == [
            {
                "text": "42",
                "code": None,
                "meta": {"child_id": "main.helper", "session_id": child.session_id, "turn": 1},
            }
        ]
        await parent.agent.run("again")  # the same child, which remembers the first task
        assert user_texts(child.session.derive_messages()) == ["What is 6 times 7?", "And doubled?"]
        await parent.agent.run("a new one")
        other = rt.agents.get("main.other")
        assert other is not None
        assert user_texts(other.session.derive_messages()) == ["Fresh start"]
        assert [r["text"] for r in results(parent.agent.session.events)] == ["42", "84", "fresh"]
        sessions = [parent.session_id, child.session_id, other.session_id]
    for session_id in sessions:
        assert_well_formed(await stored(rt, session_id))


async def test_a_failed_child_turn_is_a_tool_error_naming_its_code(autojump_clock):
    async with parent_child_runtime(
        parent=[delegate("Try", "d1"), Reply.text("it failed")],
        child=[Reply.error("BAD_REQUEST", "the request was refused", status=400)],
    ) as rt:
        rt.add_tool(delegate_tool(rt, HELPER, name="ask_helper_as_delegate"))
        rt.add_tool(delegate_tool(rt, HELPER))
        parent = await rt.agents.create(options=PARENT)
        result = await parent.agent.run("go")
        assert result.text == "it failed"
        (failure,) = results(parent.agent.session.events)
        assert failure["code"] == "TOOL_ERROR"
        assert failure["text"].startswith("Error: sub-agent 'main.helper' failed with BAD_REQUEST")
        assert failure["meta"] == {"child_id": "main.helper", "code": "BAD_REQUEST"}
        child = rt.agents.get("main.helper")
        assert turn_ends(child.session.events)[0]["kind"] == "error"


async def test_a_child_waiting_for_approval_says_so_to_the_parent(autojump_clock):
    @tool(requires_approval=True)
    async def erase(path: str) -> str:
        """Erase a file."""
        return f"erased {path}"

    async with parent_child_runtime(
        parent=[delegate("Clean up", "d1"), Reply.text("waiting on the helper")],
        child=[Reply.tool_calls(("erase", {"path": "a"}, "e1")), Reply.text("cleaned")],
        tools=[erase],
    ) as rt:
        rt.add_tool(delegate_tool(rt, HELPER))
        parent = await rt.agents.create(options=PARENT)
        result = await parent.agent.run("go")
        assert result.text == "waiting on the helper"
        (waiting,) = results(parent.agent.session.events)
        assert waiting["code"] is None
        assert waiting["text"] == (
            "[sub-agent 'main.helper' is waiting for a person to approve: erase (e1); "
            "its answer is not available yet]"
        )
        assert waiting["meta"]["awaiting_approval"] == ["e1"]
        child = rt.agents.get("main.helper")
        assert [r.call_id for r in child.pending_approvals()] == ["e1"]
        done = await child.resolve_approvals({"e1": True})
        assert done.text == "cleaned"


async def test_a_name_taken_by_another_agent_is_a_tool_error(autojump_clock):
    async with parent_child_runtime(parent=[delegate("Try", "d1"), Reply.text("no")]) as rt:
        rt.add_tool(delegate_tool(rt, HELPER))
        await rt.agents.create(options=AgentOptions(id="main.helper", provider="c", model="m"))
        parent = await rt.agents.create(options=PARENT)
        await parent.agent.run("go")
        (failure,) = results(parent.agent.session.events)
        assert failure["code"] == "TOOL_ERROR"
        assert "INVALID_OPTION" in failure["text"]
        assert "not a sub-agent of 'main'" in failure["text"]


async def test_an_undeclared_name_is_refused():
    async with open_runtime() as rt:
        with pytest.raises(InvalidOptionError, match="no sub-agent 'ghost'"):
            delegate_tool(rt, "ghost")


@pytest.mark.parametrize("path", ["cancel", "deadline", "run-caller"])
async def test_cancelling_the_parent_while_it_delegates_aborts_the_child(autojump_clock, path):
    started = trio.Event()
    budget = TurnBudget(max_seconds=5) if path == "deadline" else None
    async with parent_child_runtime(
        parent=[delegate("Wait", "d1")],
        child=[Reply.tool_calls(("hang", {}, "h1"))],
        tools=[hanging_tool(started)],
    ) as rt:
        rt.add_tool(delegate_tool(rt, HELPER))
        parent = await rt.agents.create(
            options=AgentOptions(id="main", provider="p", model="m", turn_budget=budget)
        )
        with trio.fail_after(60):
            if path == "run-caller":
                with trio.move_on_after(1):
                    await parent.agent.run("go")
            else:
                parent.agent.followup("go")
                await started.wait()
                if path == "cancel":
                    parent.agent.cancel()
            await parent.agent.wait_idle()
        child = rt.agents.get("main.helper")
        assert turn_ends(child.session.events) == [{"kind": "aborted", "cause": "parent"}]
        (end,) = turn_ends(parent.agent.session.events)
        assert end["kind"] == "aborted"
        assert end["cause"] == ("hook" if path == "deadline" else "user")
        (settled,) = results(parent.agent.session.events)
        assert settled["code"] == "ABORTED"  # settled like any other cancelled tool call
        assert child.status.value == "idle"
        sessions = [parent.session_id, child.session_id]
    for session_id in sessions:
        assert_well_formed(await stored(rt, session_id))


class _Late:
    """Stands for the runtime the explorer opens for each run (the tool needs its agents)."""

    rt: Any = None

    @property
    def agents(self) -> Any:
        return self.rt.agents


_LATE = _Late()
#: Given to the explorer, which watches it for a swallowed ``Cancelled``.
_DELEGATE = delegate_tool(_LATE, HELPER)


async def _delegating_turn(rt) -> None:
    _LATE.rt = rt
    handle = await rt.agents.create(options=PARENT)
    try:
        result = await handle.agent.run("go")
    except TurnAbortedError:  # the explorer's cancel landed in the parent's turn
        return
    assert result.text in {"done", "the helper failed"}


def _providers() -> dict[str, Any]:
    return {
        "p": ScriptedModel([delegate("Look it up", "d1"), Reply.text("done")]),
        "c": ScriptedModel([Reply.tool_calls(("look", {}, "l1")), Reply.text("found it")]),
    }


@tool
async def look() -> str:
    """Look it up."""
    await trio.sleep(1)
    return "the answer"


class _SlowFlush:
    """A write handle whose commits take virtual time.

    The parent's ``run()`` of the child waits for the child's ``turn/end`` to be durable; with
    instant commits, whether it must wait depends on the order trio picks among tasks woken
    together (non-deterministic). A commit that takes time makes it wait every time.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def flush(self) -> None:
        await trio.sleep(0.25)
        await self._inner.flush()


class _SlowStore(MemoryStore):
    async def create(self, header: Any, *, inherited_events: Any = ()) -> Any:
        return _SlowFlush(await super().create(header, inherited_events=inherited_events))


def test_a_delegating_turn_is_well_formed_at_every_cancel_point():
    report = explore_cancellation(
        _delegating_turn,
        providers=_providers,
        tools=[look, _DELEGATE],
        store_factory=_SlowStore,
    )
    assert report.failures == []
    assert report.runs == report.checkpoints >= 12
    assert report.sites >= 3


# -- declared in the config ----------------------------------------------------------------------
def _config(*subagents: dict[str, Any]) -> dict[str, Any]:
    block = {"subagents": list(subagents)}
    return {"plugins": [{"name": "@deepseek-ai/dsh-agent-loop", "config": block}]}


async def test_subagents_declared_in_the_config_are_delegate_tools(autojump_clock):
    config = _config(
        {
            "id": "researcher",
            "provider": "c",
            "model": "m",
            "persona": "You research one question.",
            "turnBudget": {"maxSteps": 3},
            "compaction": {"keepRecentTurns": 1},
            "tool": "research",
            "description": "Ask the researcher.",
        }
    )
    providers = {
        "p": ScriptedModel(
            [Reply.tool_calls(("research", {"task": "Why?"}, "r1")), Reply.text("ok")]
        ),
        "c": ScriptedModel([Reply.text("because")]),
    }
    async with open_runtime(
        config, providers=providers, store=MemoryStore(), clock=trio.current_time
    ) as rt:
        declared = rt.tools["research"]
        assert declared.description == "Ask the researcher."
        options, _ = rt.subagents["researcher"]
        assert options.turn_budget == TurnBudget(max_steps=3)
        assert options.compaction == CompactionPolicy(keep_recent_turns=1)
        assert delegate_tool(rt, "researcher").name == "delegate"
        parent = await rt.agents.create(options=PARENT)
        await parent.agent.run("go")
        assert [r["text"] for r in results(parent.agent.session.events)] == ["because"]
        child = rt.agents.get("main.researcher")
        assert child.options.persona == "You research one question."
        assert child.parent is parent.agent


@pytest.mark.parametrize(
    ("subagents", "fault"),
    [
        ([{"id": "a"}, {"id": "b"}], "subagents[1].tool: tool name 'delegate' is declared twice"),
        ([{"id": "a", "provider": "nope"}], "subagents[0].provider: unknown provider 'nope'"),
        ([{"id": "a", "tools": ["no_such_tool"]}], "subagents[0].tools[0]: unknown tool"),
        ([{"id": "a", "tol": "x"}], "subagents[0]"),
    ],
)
async def test_bad_subagents_are_config_faults(subagents, fault):
    from dsh_agent_loop import ConfigError

    with pytest.raises(ConfigError, match=re.escape(fault)):
        async with open_runtime(_config(*subagents), providers={"c": ScriptedModel([])}):
            pass
