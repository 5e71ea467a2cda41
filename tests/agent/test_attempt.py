"""``Attempt``: one model call; what its closer appends for a stream cut by a cancel."""

from __future__ import annotations

import gc
from typing import Any

from dsh_agent_loop import Reply
from dsh_agent_loop._agent._actor import AgentActor
from dsh_agent_loop._agent.attempt import Attempt
from dsh_agent_loop._agent.turn import Turn
from dsh_agent_loop.llm._assemble import FOLD_CHUNK, Assembler
from dsh_agent_loop.llm._base import BlockEnd, BlockStart, TextDelta, ToolCallDelta
from dsh_agent_loop.testing import actor_of

from .conftest import harness, wait_until


def _fed(*chunks: object) -> Assembler:
    asm = Assembler()
    for chunk in chunks:
        FOLD_CHUNK[type(chunk)](asm, chunk)
    return asm


async def test_closing_an_attempt_without_a_stream_appends_nothing(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        attempt = Attempt(Turn(actor_of(h.agent), 1), actor_of(h.agent), 1)
        size = len(h.agent.session)
        assert attempt.close() == []
        assert len(h.agent.session) == size


async def test_an_empty_cut_stream_is_an_aborted_attempt(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        attempt = Attempt(Turn(actor_of(h.agent), 1), actor_of(h.agent), 2)
        attempt.asm = Assembler()
        assert attempt.close() == []
        [event] = h.events[-1:]
        assert event.type == "assistant/attempt"
        assert event.data["stream"] == {"attempt": 2}
        assert event.data["failure"]["code"] == "ABORTED"
        assert attempt.asm is None
        assert attempt.close() == []  # closed once


async def test_a_cut_stream_keeps_the_delivered_prefix_and_returns_whole_calls(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        attempt = Attempt(Turn(actor_of(h.agent), 1), actor_of(h.agent), 1)
        attempt.asm = _fed(
            BlockStart(0, "text"),
            TextDelta(0, "Hel"),
            BlockEnd(0),
            BlockStart(1, "tool-call", "c1", "add"),
            ToolCallDelta(1, "{}"),
            BlockEnd(1),
            BlockStart(2, "tool-call", "c2", "add"),
            ToolCallDelta(2, '{"a'),  # cut mid-arguments: dropped
        )
        calls = attempt.close()
        [event] = h.events[-1:]
        assert event.type == "assistant/message"
        assert event.data["interrupted"] is True
        assert event.data["stream"] == {"attempt": 1, "finish": "aborted"}
        content = event.data["message"]["content"]
        assert [b["type"] for b in content] == ["text", "tool-call"]
        assert content[0]["text"] == "Hel"
        assert [c["call_id"] for c in calls] == ["c1"]


async def test_attempt_start_is_published_to_listeners_only(autojump_clock, monkeypatch):
    notified: list[str] = []
    notify = AgentActor.notify

    def spy(self: Any, event_type: str, data: Any) -> None:
        notified.append(event_type)
        notify(self, event_type, data)

    monkeypatch.setattr(AgentActor, "notify", spy)
    async with harness([Reply.error("HTTP_5XX", "busy"), Reply.text("hi")]) as h:
        await h.run()
        assert "agent/attempt-start" not in notified  # nobody listened: nothing was built
        seen: list[Any] = []
        h.rt.hooks.on("agent/attempt-start", seen.append)
        h.model.add(Reply.error("HTTP_5XX", "busy"), Reply.text("again"))
        await h.run()
    assert [
        (e.data["agent_id"], e.data["turn"], e.data["step"], e.data["attempt"]) for e in seen
    ] == [
        ("main", 2, 1, 1),
        ("main", 2, 1, 2),
    ]
    failed = [e for e in h.events if e.type == "assistant/attempt" and e.data["turn"] == 2]
    assert seen[0].time <= failed[0].time < seen[1].time  # the retry starts after the backoff


def _live_turns() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Turn)


async def test_an_ended_turn_keeps_no_attempt_so_its_turn_is_collected(autojump_clock):
    # An Attempt is not GC-tracked and refers to its turn and agent: a cycle through one could
    # never be collected. Ending a turn, by completing or by a cancel mid-stream, drops it.
    before = _live_turns()
    turns: list[Turn] = []
    replies = [Reply.tool_calls(("missing", {})), Reply.text("done"), Reply.hang("…")]
    async with harness(replies) as h:
        agent = h.agent

        def started(_: object) -> None:
            turn = actor_of(agent).running_turn
            assert turn is not None
            assert turn.attempt is not None
            turns.append(turn)

        stop = h.rt.hooks.on("agent/attempt-start", started)
        await agent.run("first")
        agent.followup("second")
        await wait_until(lambda: len(turns) == 3)
        agent.cancel()  # mid-stream: the hang
        await agent.wait_idle()
        stop()
        assert turns[0] is turns[1]  # two steps of the first turn, then the second turn
        assert [t.attempt for t in turns] == [None, None, None]
        turns.clear()
        await h.handle.dispose()
    assert _live_turns() == before
