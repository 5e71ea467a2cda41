"""Cancellation (docs/design.md#cancellation): every cancel point leaves a well-formed log and the
agent usable."""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop import Reply, ScriptedModel, tool
from dsh_agent_loop.llm._base import PreparedCall
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, of_type, plain, turn_ends, types, user_texts

ABORTED_BEFORE_DISPATCH = "Error: tool call aborted before dispatch"


async def cancel_after_chunks(h, n, kind="text-delta", **cancel_kwargs):
    """Follow up, cancel once ``n`` chunks of ``kind`` were streamed, return the frames seen."""
    frames = []
    async with h.agent.subscribe(types=["agent/assistant-stream"]) as recv:
        h.agent.followup("go")
        seen = 0
        async for event in recv:
            frames.append(event.data)
            chunk = event.data.get("chunk")
            if chunk is not None and chunk.type == kind:
                seen += 1
                if seen == n:
                    h.agent.cancel(**cancel_kwargs)
                    break
        await h.agent.wait_idle()
        while True:
            try:
                frames.append(recv.receive_nowait().data)
            except trio.WouldBlock:
                break
    return frames


async def test_cancel_mid_stream_keeps_exactly_the_delivered_prefix(autojump_clock):
    replies = [Reply.text("one two three four five"), Reply.text("next")]
    async with harness(replies, latency=1.0) as h:
        frames = await cancel_after_chunks(h, 2)
        (anchor,) = h.of_type("assistant/message")
        assert anchor.data["interrupted"] is True
        assert plain(anchor.data["message"]["content"]) == [{"type": "text", "text": "one two "}]
        assert anchor.time == 2.0
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert h.types()[-4:] == ["request/context", "assistant/message", "step/end", "turn/end"]
        assert h.of_type("assistant/attempt") == []
        assert frames[-1]["frame"] == "end"
        assert frames[-1]["outcome"] == "committed"
        assert frames[-1]["seq"] == anchor.seq
        # the next request contains what the user saw
        await h.run("again")
        messages = h.model.requests[1].messages
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[1]["content"][0]["text"] == "one two "
        assert turn_ends(h.events)[-1] == {"kind": "completed"}
        assert_well_formed(h.events)


async def test_cancel_a_hanging_stream(autojump_clock):
    async with harness([Reply.hang(after_text="partial answer")]) as h:
        h.agent.followup("go")
        await trio.sleep(100)
        assert h.agent.status.value == "running"
        h.agent.cancel()
        await h.agent.wait_idle()
        (anchor,) = h.of_type("assistant/message")
        assert anchor.data["interrupted"] is True
        assert anchor.data["message"]["content"][0]["text"] == "partial answer"
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert_well_formed(h.events)


async def test_cancel_before_anything_was_delivered_leaves_an_attempt(autojump_clock):
    async with harness([Reply.text("late words")], latency=10.0) as h:
        frames = []
        h.rt.hooks.on("agent/assistant-stream", lambda e: frames.append(plain(e.data)))
        h.agent.followup("go")
        await trio.sleep(5)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert h.of_type("assistant/message") == []
        (attempt,) = h.of_type("assistant/attempt")
        assert "text" not in attempt.data["stream"]
        assert h.types()[-3:] == ["assistant/attempt", "step/end", "turn/end"]
        # the text block opened (a chunk frame) but no text arrived: nothing was delivered
        assert [f["frame"] for f in frames] == ["start", "chunk", "end"]
        assert frames[1]["chunk"].type == "block-start"
        assert frames[-1]["outcome"] == "abandoned"
        # the abandoned attempt never reaches the model
        assert h.agent.session.derive_messages()[-1]["role"] == "user"
        assert_well_formed(h.events)


async def test_a_half_streamed_call_is_dropped_from_the_anchor(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return "noted"

    reply = Reply.tool_calls(
        ("note", {"text": "a"}, "c1"), ("note", {"text": "b"}, "c2"), text="calling"
    )
    async with harness([reply], latency=1.0, tools=[note]) as h:
        # the text block's block-end is followed by c1's block-start, then a pause: cancel there
        await cancel_after_chunks(h, 1, kind="block-end")
        (anchor,) = h.of_type("assistant/message")
        assert anchor.data["interrupted"] is True
        assert plain(anchor.data["message"]["content"]) == [{"type": "text", "text": "calling"}]
        assert ran == []
        assert h.of_type("tool/call") == []
        assert h.of_type("tool/result") == []
        assert_well_formed(h.events)


async def test_a_complete_call_in_an_interrupted_anchor_is_aborted_before_dispatch(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return "noted"

    reply = Reply.tool_calls(("note", {"text": "a"}, "c1"), ("note", {"text": "b"}, "c2"))
    async with harness([reply], latency=1.0, tools=[note]) as h:
        await cancel_after_chunks(h, 1, kind="block-end")
        (anchor,) = h.of_type("assistant/message")
        assert anchor.data["interrupted"] is True
        blocks = plain(anchor.data["message"]["content"])
        # c1 is complete; c2 had started but was half-streamed: dropped
        assert blocks == [
            {"type": "tool-call", "call_id": "c1", "name": "note", "arguments": '{"text":"a"}'}
        ]
        assert ran == []
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == ["c1"]
        (result,) = h.of_type("tool/result")
        assert result.data["error"]["code"] == "ABORTED_BEFORE_DISPATCH"
        assert result.data["message"]["content"][0]["text"] == ABORTED_BEFORE_DISPATCH
        assert h.types()[-5:] == [
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert_well_formed(h.events)


async def test_cancel_while_a_tool_runs_aborts_it_and_drains_the_others(autojump_clock):
    cleanup = []

    @tool
    async def work(label: str, seconds: float) -> str:
        try:
            await trio.sleep(seconds)
        finally:
            cleanup.append((label, trio.current_time()))
        return f"{label} done"

    calls = [
        ("work", {"label": "long", "seconds": 10}, "c1"),
        ("work", {"label": "short", "seconds": 1}, "c2"),
        ("work", {"label": "longer", "seconds": 20}, "c3"),
    ]
    async with harness([Reply.tool_calls(*calls)], tools=[work]) as h:
        h.agent.followup("go")
        await trio.sleep(5)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert sorted(cleanup) == [("long", 5.0), ("longer", 5.0), ("short", 1.0)]
        results = h.of_type("tool/result")
        assert [r.data["message"]["call_id"] for r in results] == ["c1", "c2", "c3"]
        codes = [(r.data.get("error") or {}).get("code") for r in results]
        assert codes == ["ABORTED", None, "ABORTED"]
        assert results[1].data["message"]["content"][0]["text"] == "short done"
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert_well_formed(h.events)


async def test_cancel_during_a_tool_synthesises_pairs_for_undispatched_calls(autojump_clock):
    started = []

    @tool(execution_mode="exclusive")
    async def slow(label: str) -> str:
        started.append(label)
        await trio.sleep(10)
        return "done"

    calls = [
        ("slow", {"label": "a"}, "c1"),
        ("slow", {"label": "b"}, "c2"),
        ("slow", {"label": "c"}, "c3"),
    ]
    async with harness([Reply.tool_calls(*calls)], tools=[slow]) as h:
        h.agent.followup("go")
        await trio.sleep(5)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert started == ["a"]
        # c1 was dispatched before the cancel; c2 and c3 get synthetic pairs at the cancel
        assert sorted(h.types()[-8:]) == sorted(
            ["tool/call", "tool/result"] * 3 + ["step/end", "turn/end"]
        )
        assert h.types()[-2:] == ["step/end", "turn/end"]
        calls_ = h.of_type("tool/call")
        results = h.of_type("tool/result")
        assert [c.data["call_id"] for c in calls_] == ["c1", "c2", "c3"]
        assert [r.data["message"]["call_id"] for r in results] == ["c1", "c2", "c3"]
        assert [r.data["error"]["code"] for r in results] == [
            "ABORTED",
            "ABORTED_BEFORE_DISPATCH",
            "ABORTED_BEFORE_DISPATCH",
        ]
        for r in results[1:]:
            assert r.data["message"]["content"][0]["text"] == ABORTED_BEFORE_DISPATCH
        # every result cites its own tool/call
        for c, r in zip(calls_, results, strict=True):
            assert r.source_event_seqs == (c.seq,)
            assert c.seq < r.seq
        assert [c.time for c in calls_] == [0.0, 5.0, 5.0]
        assert_well_formed(h.events)


async def test_the_driver_is_idle_only_after_the_tools_cleanup(autojump_clock):
    @tool
    async def stubborn() -> str:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(3)
        return "never"

    async with harness([Reply.tool_calls(("stubborn", {}, "c1"))], tools=[stubborn]) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert trio.current_time() == 4.0
        assert h.of_type("turn/end")[0].time == 4.0
        assert_well_formed(h.events)


class SlowPrepare:
    """A scripted route whose ``prepare_call`` takes ``delay`` seconds."""

    def __init__(self, model: ScriptedModel, delay: float) -> None:
        self.model = model
        self.delay = delay

    async def prepare_call(self, config) -> PreparedCall:
        await trio.sleep(self.delay)
        return await self.model.prepare_call(config)

    async def aclose(self) -> None:
        pass


async def _assert_cancelled_before_request(h):
    assert h.types() == [
        "session/end-seed",
        "agent/inbox/spliced",
        "turn/start",
        "agent/inbox/spliced",
        "step/start",
        "step/end",
        "turn/end",
    ]
    assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
    assert len(h.agent.inbox) == 0  # the claimed message is consumed
    assert h.model.requests == []
    assert_well_formed(h.events)


async def test_cancel_during_the_request_waterfall(autojump_clock):
    async def slow_request(payload, next):
        await trio.sleep(10)
        return await next(payload)

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/request", slow_request)
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel(keep_inbox=True)
        await h.agent.wait_idle()
        await _assert_cancelled_before_request(h)


async def test_cancel_during_prepare_call(autojump_clock):
    model = ScriptedModel([Reply.text("never")])
    slow = SlowPrepare(model, 10)
    from dsh_agent_loop import MemoryStore, open_runtime

    from .conftest import OPTIONS, Harness

    async with open_runtime(store=MemoryStore(), providers={"scripted": slow}) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        h = Harness(rt, handle, model)
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        await _assert_cancelled_before_request(h)
        # the agent is usable again: the prompt and the user message arrive with the next request
        slow.delay = 0
        model.add(Reply.text("ok"))
        await h.run("again")
        assert user_texts(model.requests[0].messages) == ["again"]
        assert len(h.of_type("system/message")) == 1
        assert_well_formed(h.events)


async def test_idle_cancel_appends_nothing(autojump_clock):
    async with harness([Reply.text("a")]) as h:
        await h.run()
        before = h.events
        notes = []
        h.rt.hooks.on("agent/status", notes.append)
        h.agent.cancel()
        h.agent.cancel(keep_inbox=True)
        await trio.sleep(1)
        assert h.events == before
        assert notes == []
        assert h.agent.status.value == "idle"


@pytest.mark.parametrize("keep_inbox", [True, False])
async def test_keep_inbox_decides_what_happens_to_queued_messages(autojump_clock, keep_inbox):
    async with harness([Reply.hang(after_text="x"), Reply.text("later")]) as h:
        h.agent.followup("first")
        await trio.sleep(1)
        h.agent.followup("queued turn")
        h.agent.inject("queued step")
        discarded = []
        h.rt.hooks.on("agent/inbox/discarded", lambda e: discarded.append(e.data["message"]["id"]))
        n = len(h.events)
        h.agent.cancel(keep_inbox=keep_inbox)
        await h.agent.wait_idle()
        new = h.events[n:]
        splices = [plain(e.data) for e in new if e.type == "agent/inbox/spliced"]
        if keep_inbox:
            assert splices == []
            assert [m["id"] for m in h.agent.inbox.next_turn] == ["m-2"]
            assert [m["id"] for m in h.agent.inbox.next_step] == ["m-3"]
            assert discarded == []
        else:
            # one canceled splice per non-empty list, next-step first
            assert splices == [
                {
                    "target": "next-step",
                    "start": 0,
                    "removed_count": 1,
                    "inserted": [],
                    "outcome": "canceled",
                },
                {
                    "target": "next-turn",
                    "start": 0,
                    "removed_count": 1,
                    "inserted": [],
                    "outcome": "canceled",
                },
            ]
            assert new[0].type == "agent/inbox/spliced"  # cleared before the turn winds down
            assert len(h.agent.inbox) == 0
            assert discarded == ["m-3", "m-2"]
        # the wake made by the queued followup is dropped: no new turn starts by itself
        assert len(h.of_type("turn/start")) == 1
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert_well_formed(h.events)


async def test_first_cause_wins(autojump_clock):
    async with harness([Reply.hang(after_text="x")]) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel(cause="user")
        h.agent.cancel(cause="hook")
        await h.agent.wait_idle()
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]


async def test_a_followup_right_after_cancel_runs_as_the_next_turn(autojump_clock):
    replies = [Reply.hang(after_text="x"), Reply.text("second"), Reply.text("third")]
    async with harness(replies) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        h.agent.followup("again")  # the cancelled turn is still winding down
        h.agent.steer("steered during wind-down")
        spliced = h.of_type("agent/inbox/spliced")[-1]
        assert spliced.data["target"] == "next-turn"
        await h.agent.wait_idle()
        assert turn_ends(h.events) == [
            {"kind": "aborted", "cause": "user"},
            {"kind": "completed"},
            {"kind": "completed"},
        ]
        # one next-turn message per turn: the steer, moved to next-turn, runs as the third turn
        assert user_texts(h.model.requests[1].messages) == ["go", "again"]
        assert user_texts(h.model.requests[2].messages) == [
            "go",
            "again",
            "steered during wind-down",
        ]
        assert len(h.agent.inbox) == 0
        assert_well_formed(h.events)


async def test_a_followup_from_a_tools_cleanup_is_latched(autojump_clock):
    box = []

    @tool
    async def slow() -> str:
        try:
            await trio.sleep_forever()
        finally:
            box[0].followup("from cleanup")
        return "never"

    replies = [Reply.tool_calls(("slow", {}, "c1")), Reply.text("handled")]
    async with harness(replies, tools=[slow]) as h:
        box.append(h.agent)
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}, {"kind": "completed"}]
        assert user_texts(h.model.requests[1].messages)[-1] == "from cleanup"
        assert_well_formed(h.events)


async def test_dispose_never_latches(autojump_clock):
    box = []

    @tool
    async def slow() -> str:
        try:
            await trio.sleep_forever()
        finally:
            box[0].followup("from cleanup")
        return "never"

    async with harness(
        [Reply.tool_calls(("slow", {}, "c1")), Reply.text("never")], tools=[slow]
    ) as h:
        box.append(h.agent)
        h.agent.followup("go")
        await trio.sleep(1)
        await h.handle.dispose()
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "disposed"}]
        assert len(h.of_type("turn/start")) == 1
        assert len(h.model.requests) == 1
        assert actor_of(h.agent).stopped
        stored = await h.rt.store.open(h.agent.session_id)
        assert types(await stored.read()) == h.types()
        assert_well_formed(h.events)


async def test_leaving_the_runtime_aborts_a_running_turn(autojump_clock):
    async with harness([Reply.hang(after_text="partial")]) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        store = h.rt.store
        sid = h.agent.session_id
    reader = await store.open(sid)
    events = await reader.read()
    assert turn_ends(events) == [{"kind": "aborted", "cause": "disposed"}]
    (anchor,) = of_type(events, "assistant/message")
    assert anchor.data["interrupted"] is True
    assert_well_formed(events)


async def test_cancel_during_retry_backoff_wins_over_retry(autojump_clock):
    async with harness([Reply.error("HTTP_5XX", "bad gateway"), Reply.text("never")], seed=1) as h:
        h.agent.followup("go")
        await trio.sleep(0.1)  # inside the first backoff (at least 0.5 s)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert len(h.model.requests) == 1
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert len(h.of_type("assistant/attempt")) == 1
        assert_well_formed(h.events)


@pytest.mark.parametrize("keep_inbox", [True, False])
async def test_cancel_before_the_turn_starts_opens_no_turn(autojump_clock, keep_inbox):
    async with harness([Reply.text("a")]) as h:
        h.agent.followup("go")
        assert h.agent.status.value == "running"
        h.agent.cancel(keep_inbox=keep_inbox)
        await h.agent.wait_idle()
        await trio.sleep(1)
        assert "turn/start" not in h.types()
        assert h.model.requests == []
        assert len(h.agent.inbox) == (1 if keep_inbox else 0)
        if keep_inbox:
            # the dropped wake is not replayed; the next wake picks the message up
            await h.run("second")
            assert user_texts(h.model.requests[0].messages) == ["go"]


async def test_cancel_during_pre_step_opens_no_step(autojump_clock):
    async def slow(payload, next):
        await trio.sleep(10)
        return await next(payload)

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/pre-step", slow)
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert h.types() == [
            "session/end-seed",
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "turn/end",
        ]
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]


async def test_cancel_with_calls_waiting_for_a_pool_slot(autojump_clock):
    started = []

    @tool
    async def work(label: str) -> str:
        started.append(label)
        await trio.sleep(10)
        return "done"

    calls = [("work", {"label": x}, x) for x in ("a", "b", "c")]
    async with harness([Reply.tool_calls(*calls)], tools=[work], max_parallel_tool_calls=1) as h:
        h.agent.followup("go")
        await trio.sleep(1)
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == ["a"]
        h.agent.cancel()
        await h.agent.wait_idle()
        assert started == ["a"]
        results = h.of_type("tool/result")
        assert [r.data["message"]["call_id"] for r in results] == ["a", "b", "c"]
        assert [r.data["error"]["code"] for r in results] == [
            "ABORTED",
            "ABORTED_BEFORE_DISPATCH",
            "ABORTED_BEFORE_DISPATCH",
        ]
        assert_well_formed(h.events)


@pytest.mark.parametrize("hook", ["tools/pre-execute", "tools/execute"])
async def test_a_raising_tool_pipeline_hook_ends_the_turn_error(autojump_clock, hook):
    offered = []
    errors = []

    async def boom(payload, next):
        raise RuntimeError(f"{hook} broke")

    async def request_error(payload, next):
        offered.append(payload)
        return await next(payload)

    @tool
    async def work(label: str) -> str:
        await trio.sleep(1)
        return "done"

    calls = [("work", {"label": x}, x) for x in ("a", "b")]
    async with harness([Reply.tool_calls(*calls), Reply.text("next turn")], tools=[work]) as h:
        h.rt.hooks.waterfall(hook, boom)
        h.rt.hooks.waterfall("agent/request-error", request_error)
        h.rt.hooks.on("agent/error", lambda e: errors.append(plain(e.data["error"])))
        await h.run("go")
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert f"{hook} broke" in end["error"]["message"]
        assert errors == [end["error"]]
        assert offered == []  # pipeline failures are never offered to agent/request-error
        assert sorted(r.data["message"]["call_id"] for r in h.of_type("tool/result")) == ["a", "b"]
        assert_well_formed(h.events)
        # the loop goes on: the next turn (no tool calls) runs normally
        await h.run("again")
        assert turn_ends(h.events)[-1] == {"kind": "completed"}
        assert_well_formed(h.events)
