"""The turn/step machine through real turns (docs/design.md#turns-and-steps): sequences, steering,
hooks, ends."""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    PreStepDecision,
    Reply,
    SubscriberOverflowError,
    ToolResult,
    tool,
)

from .conftest import assert_well_formed, harness, plain, turn_ends, user_texts

SEED_AND_FOLLOWUP = ["session/end-seed", "agent/inbox/spliced"]
TEXT_STEP = [
    "step/start",
    "system/message",
    "user/message",
    "request/header",
    "request/context",
    "assistant/message",
    "step/end",
]


async def test_text_only_turn_exact_sequence_and_request(autojump_clock):
    async with harness([Reply.text("Hello world", reasoning="let me think")]) as h:
        msg_id = await h.run("Summarise README.md")
        assert msg_id == "m-1"
        assert h.types() == [
            *SEED_AND_FOLLOWUP,
            "turn/start",
            "agent/inbox/spliced",
            *TEXT_STEP,
            "turn/end",
        ]
        (answer,) = h.of_type("assistant/message")
        assert plain(answer.data["message"]) == {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "let me think"},
                {"type": "text", "text": "Hello world"},
            ],
        }
        assert answer.data["stream"]["finish"] == "stop"
        assert "interrupted" not in answer.data
        assert turn_ends(h.events) == [
            {
                "kind": "completed",
            }
        ]
        # the empty prompt reserves node 0 but never reaches the model
        (system,) = h.of_type("system/message")
        assert system.data["message"]["content"] == ()
        (request,) = h.model.requests
        assert [plain(m) for m in request.messages] == [
            {
                "role": "user",
                "id": "m-1",
                "content": [{"type": "text", "text": "Summarise README.md"}],
            }
        ]
        assert request.config["provider"] == "scripted"
        assert request.config["model"] == "m"
        assert request.tools == ()
        # the claim splice removes the message from next-turn without an outcome
        claim = h.events[3]
        assert plain(claim.data) == {
            "target": "next-turn",
            "start": 0,
            "removed_count": 1,
            "inserted": [],
        }
        assert len(h.agent.inbox) == 0
        assert_well_formed(h.events)


async def test_derived_history_carries_previous_turns(autojump_clock):
    async with harness([Reply.text("one"), lambda req: Reply.text(str(len(req.messages)))]) as h:
        await h.run("first")
        await h.run("second")
        second = h.model.requests[1]
        assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
        assert user_texts(second.messages) == ["first", "second"]
        # the first request's messages are reused, not copied, in the second request
        assert second.messages[0] is h.model.requests[0].messages[0]
        last = h.of_type("assistant/message")[-1]
        assert last.data["message"]["content"][0]["text"] == "3"
        assert [e.data["turn"] for e in h.of_type("turn/start")] == [1, 2]
        assert_well_formed(h.events)


async def test_event_time_follows_the_runtime_clock(autojump_clock):
    @tool
    async def wait(seconds: float) -> str:
        await trio.sleep(seconds)
        return "waited"

    replies = [Reply.tool_calls(("wait", {"seconds": 3}, "c1")), Reply.text("two words")]
    async with harness(replies, latency=1.0, tools=[wait]) as h:
        frames = []
        h.rt.hooks.on("agent/assistant-stream", lambda e: frames.append(e))
        await trio.sleep(5)
        await h.run()
        assert h.of_type("turn/start")[0].time == 5.0
        (call,) = h.of_type("tool/call")
        (result,) = h.of_type("tool/result")
        assert call.time > 5.0  # the tool call streamed with latency
        assert result.time == call.time + 3.0
        # every stream frame is stamped by the same clock, and the message lands with the last
        chunks = [e.data for e in frames if e.data["frame"] == "chunk"]
        assert [c["time"] for c in chunks] == sorted(c["time"] for c in chunks)
        last_chunk = [c for c in chunks if c["step"] == 2][-1]
        answer = h.of_type("assistant/message")[-1]
        assert answer.time == last_chunk["time"]
        assert answer.time >= result.time + 2.0  # two words, one latency each at least
        assert h.of_type("turn/end")[0].time == answer.time


async def test_status_goes_running_then_idle(autojump_clock):
    seen = []
    async with harness([Reply.text("hi")], latency=1.0) as h:
        h.rt.hooks.on("agent/status", lambda e: seen.append(e.data["status"]))
        assert h.agent.status.value == "idle"
        h.agent.followup("go")
        assert h.agent.status.value == "running"  # synchronously, before the driver runs
        await h.agent.wait_idle()
        assert h.agent.status.value == "idle"
        assert seen == ["running", "idle"]
        # wait_idle returning means the turn is stored
        stored = await h.stored()
        assert stored[-1].type == "turn/end"


async def test_two_followups_run_as_two_turns(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")], latency=1.0) as h:
        first = h.agent.followup("one")
        second = h.agent.followup("two")
        assert (first, second) == ("m-1", "m-2")
        await h.agent.wait_idle()
        assert turn_ends(h.events) == [{"kind": "completed"}] * 2
        assert [user_texts(r.messages) for r in h.model.requests] == [["one"], ["one", "two"]]
        assert_well_formed(h.events)


async def test_steer_during_a_tool_is_admitted_after_that_steps_end(autojump_clock):
    agent_box = []

    @tool
    async def slow(n: int) -> str:
        await trio.sleep(2)
        return "slow done"

    async def steer_later():
        await trio.sleep(1)
        agent_box[0].steer("also this")

    replies = [Reply.tool_calls(("slow", {"n": 1}, "c1")), Reply.text("ok")]
    async with harness(replies, tools=[slow]) as h:
        agent_box.append(h.agent)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steer_later)
            await h.run("go")
        types = h.types()
        step_end_1 = types.index("step/end")
        steer_user = next(
            e
            for e in h.of_type("user/message")
            if e.data["message"]["content"][0]["text"] == "also this"
        )
        steer_splice = next(
            e
            for e in h.of_type("agent/inbox/spliced")
            if e.data["target"] == "next-step" and e.data["inserted"]
        )
        assert steer_splice.time == 1.0
        assert steer_user.seq > step_end_1
        assert types[step_end_1 + 1 : step_end_1 + 4] == [
            "agent/inbox/spliced",  # the claim, between steps
            "step/start",
            "user/message",
        ]
        assert user_texts(h.model.requests[1].messages) == ["go", "also this"]
        assert [e.data["turn"] for e in h.of_type("turn/start")] == [1]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert_well_formed(h.events)


async def test_inject_does_not_wake_and_joins_the_next_turn(autojump_clock):
    async with harness([Reply.text("ok")]) as h:
        h.agent.inject("background context")
        assert h.agent.status.value == "idle"
        await trio.sleep(10)
        assert "turn/start" not in h.types()
        assert [m["id"] for m in h.agent.inbox.next_step] == ["m-1"]
        await h.run("question")
        # next-step is claimed before the one next-turn message
        assert user_texts(h.model.requests[0].messages) == ["background context", "question"]
        assert h.types()[:5] == [
            "session/end-seed",
            "agent/inbox/spliced",
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
        ]
        assert len(h.agent.inbox) == 0
        assert_well_formed(h.events)


async def test_send_targets_and_wake_flag(autojump_clock):
    async with harness([Reply.text("ok")]) as h:
        queued = h.agent.send("later", "next-turn", wake=False)
        await trio.sleep(1)
        assert h.agent.status.value == "idle"
        assert [m["id"] for m in h.agent.inbox.next_turn] == [queued]
        with pytest.raises(ValueError, match='message "m-1" is already pending'):
            h.agent.send("dup", "next-step", message_id="m-1")
        h.agent.send("now", "next-step", wake=True)
        await h.agent.wait_idle()
        assert user_texts(h.model.requests[0].messages) == ["now", "later"]


async def test_pre_step_reject_ends_blocked_without_a_step(autojump_clock):
    payloads = []

    async def reject(payload, next):
        payloads.append(payload)
        return PreStepDecision.reject("not allowed")

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/pre-step", reject)
        await h.run("go")
        assert h.types() == [
            *SEED_AND_FOLLOWUP,
            "turn/start",
            "agent/inbox/spliced",
            "turn/end",
        ]
        assert turn_ends(h.events) == [{"kind": "blocked"}]
        assert h.model.requests == []
        assert len(h.agent.inbox) == 0  # claimed messages are consumed
        (payload,) = payloads
        assert payload["turn"] == 1
        assert payload["step"] == 1
        assert [m["id"] for m in payload["messages"]] == ["m-1"]
        assert_well_formed(h.events)


async def test_empty_first_batch_completes_without_a_step(autojump_clock):
    async def empty(payload, next):
        return PreStepDecision.enter(())

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/pre-step", empty)
        await h.run("go")
        assert h.types() == [
            *SEED_AND_FOLLOWUP,
            "turn/start",
            "agent/inbox/spliced",
            "turn/end",
        ]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert h.model.requests == []


async def test_pre_step_may_rewrite_the_entered_messages(autojump_clock):
    async def rewrite(payload, next):
        return await next({**payload, "messages": (*payload["messages"], "added by hook")})

    async with harness([Reply.text("ok")]) as h:
        h.rt.hooks.waterfall("agent/pre-step", rewrite)
        await h.run("go")
        assert user_texts(h.model.requests[0].messages) == ["go", "added by hook"]
        ids = [e.data["message"]["id"] for e in h.of_type("user/message")]
        assert ids == ["m-1", "m-2"]  # a plain text message gets a fresh session id
        assert_well_formed(h.events)


async def test_turn_stopping_listener_that_steers_continues_the_turn(autojump_clock):
    calls = []

    async with harness([Reply.text("first"), Reply.text("second")]) as h:

        async def stopping(payload):
            calls.append(payload["turn"])
            if len(calls) == 1:
                h.agent.steer("keep going")

        h.rt.hooks.serial("agent/turn-stopping", stopping)
        await h.run("go")
        assert calls == [1, 1]
        assert [e.data["step"] for e in h.of_type("step/start")] == [1, 2]
        assert len(h.of_type("turn/start")) == 1
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert user_texts(h.model.requests[1].messages) == ["go", "keep going"]
        assert_well_formed(h.events)


async def test_max_tokens_is_sticky_for_the_turn(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return "noted"

    replies = [
        Reply.max_tokens("cut", tool_calls=[("note", {"text": "b"}, "c1")]),
        Reply.text("fine now"),
    ]
    async with harness(replies, tools=[note]) as h:
        await h.run("go")
        assert ran == ["b"]
        first = h.of_type("assistant/message")[0]
        assert first.data["stream"]["finish"] == "max-tokens"
        (result,) = h.of_type("tool/result")
        assert "error" not in result.data
        assert [e.data["step"] for e in h.of_type("step/start")] == [1, 2]
        assert turn_ends(h.events) == [{"kind": "max-tokens"}]
        assert_well_formed(h.events)


async def test_max_tokens_with_a_cut_call_ends_truncated(autojump_clock):
    ran = []

    @tool
    async def note(text: str) -> str:
        ran.append(text)
        return "noted"

    replies = [
        Reply.max_tokens(
            "partial",
            tool_calls=[("note", {"text": "a"}, "c1"), ("note", {"text": "b"}, "c2")],
            cut_tool_call=("note", '{"text": "unfin'),
        ),
        Reply.text("never"),
    ]
    async with harness(replies, tools=[note]) as h:
        await h.run("go")
        assert ran == []
        (message,) = h.of_type("assistant/message")
        calls = [b for b in message.data["message"]["content"] if b["type"] == "tool-call"]
        assert [c["call_id"] for c in calls] == ["c1", "c2"]  # the cut call is absent
        results = h.of_type("tool/result")
        assert [r.data["message"]["call_id"] for r in results] == ["c1", "c2"]
        for r in results:
            assert r.data["error"]["code"] == "ABORTED_BEFORE_DISPATCH"
            assert r.data["message"]["content"][0]["text"] == (
                "Error: tool call aborted before dispatch"
            )
        assert [e.data["call_id"] for e in h.of_type("tool/call")] == ["c1", "c2"]
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "TRUNCATED_TOOL_CALL"
        assert len(h.model.requests) == 1
        assert h.types()[-3:] == ["tool/result", "step/end", "turn/end"]
        assert_well_formed(h.events)


@pytest.mark.parametrize("hook", ["agent/pre-step", "agent/turn-stopping"])
async def test_hook_failure_ends_the_turn_error_and_the_next_turn_runs(autojump_clock, hook):
    errors = []
    failed = []

    async def failing_waterfall(payload, next):
        if not failed:
            failed.append(1)
            raise RuntimeError("hook broke")
        return await next(payload)

    async def failing_serial(payload):
        if not failed:
            failed.append(1)
            raise RuntimeError("hook broke")

    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        h.rt.hooks.on("agent/error", lambda e: errors.append(plain(e.data)))
        if hook == "agent/pre-step":
            h.rt.hooks.waterfall(hook, failing_waterfall)
        else:
            h.rt.hooks.serial(hook, failing_serial)
        await h.run("one")
        await h.run("two")
        first, second = turn_ends(h.events)
        assert first["kind"] == "error"
        assert "hook broke" in first["error"]["message"]
        assert second == {"kind": "completed"}
        (error,) = errors
        assert error["turn"] == 1
        assert error["error"] == first["error"]
        assert_well_formed(h.events)


async def test_concludes_turn_ends_after_the_tool_step(autojump_clock):
    @tool
    async def finish() -> ToolResult:
        return ToolResult("all done", concludes_turn=True)

    async with harness(
        [Reply.tool_calls(("finish", {}, "c1")), Reply.text("never")], tools=[finish]
    ) as h:
        await h.run("go")
        assert len(h.model.requests) == 1
        assert [e.data["step"] for e in h.of_type("step/start")] == [1]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert h.types()[-3:] == ["tool/result", "step/end", "turn/end"]
        assert_well_formed(h.events)


async def test_additional_contexts_are_admitted_at_the_next_step(autojump_clock):
    @tool
    async def look() -> ToolResult:
        return ToolResult("seen", additional_contexts=("ctx one", "ctx two"))

    async with harness([Reply.tool_calls(("look", {}, "c1")), Reply.text("ok")], tools=[look]) as h:
        await h.run("go")
        types = h.types()
        result_at = types.index("tool/result")
        # injected into next-step right after the result, before step/end
        splices = [
            e
            for e in h.of_type("agent/inbox/spliced")
            if e.data["target"] == "next-step" and e.data["inserted"]
        ]
        assert [s.seq for s in splices] == [result_at + 1, result_at + 2]
        assert types[result_at + 3] == "step/end"
        second = h.model.requests[1].messages
        assert [m["role"] for m in second] == ["user", "assistant", "tool", "user", "user"]
        assert user_texts(second)[1:] == ["ctx one", "ctx two"]
        assert len(h.agent.inbox) == 0
        assert_well_formed(h.events)


async def test_runtime_context_is_admitted_once_while_unchanged(autojump_clock):
    options = AgentOptions(id="main", provider="scripted", model="m", cwd="/work/project")
    async with harness([Reply.text("a"), Reply.text("b")], options=options) as h:
        await h.run("one")
        await h.run("two")
        users = h.of_type("user/message")
        assert [plain(u.data["message"]) for u in users] == [
            {
                "role": "user",
                "id": "m-2",
                "content": [{"type": "text", "text": "cwd: /work/project"}],
                "source": "runtime-context",
            },
            {"role": "user", "id": "m-1", "content": [{"type": "text", "text": "one"}]},
            {"role": "user", "id": "m-3", "content": [{"type": "text", "text": "two"}]},
        ]
        assert user_texts(h.model.requests[1].messages) == ["cwd: /work/project", "one", "two"]
        assert_well_formed(h.events)


async def test_runtime_context_change_and_clear(autojump_clock):
    contexts = iter(["ctx A", "ctx A", "ctx B", ""])

    async def collect(payload, next):
        return next_value()

    def next_value():
        return next(contexts)

    async with harness([Reply.text("1"), Reply.text("2"), Reply.text("3"), Reply.text("4")]) as h:
        h.rt.hooks.waterfall("runtime-context/collect", collect)
        for text in ("a", "b", "c", "d"):
            await h.run(text)
        runtime = [
            e.data["message"]["content"][0]["text"]
            for e in h.of_type("user/message")
            if e.data["message"].get("source") == "runtime-context"
        ]
        assert runtime == ["ctx A", "ctx B", "no runtime context"]
        assert_well_formed(h.events)


async def test_subscribe_receives_committed_events_and_notifications(autojump_clock):
    async with harness([Reply.text("hello there")]) as h:
        async with h.agent.subscribe() as recv:
            await h.run("go")
            got = []
            while True:
                try:
                    got.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
        committed = [e for e in got if e.seq is not None]
        notes = [e for e in got if e.seq is None]
        # every event of the turn arrives once, in seq order
        assert [e.seq for e in committed] == list(range(1, len(h.events)))
        assert [e.type for e in committed] == h.types()[1:]
        note_types = [e.type for e in notes]
        assert note_types.count("agent/inbox/inserted") == 1
        assert note_types.count("agent/inbox/claimed") == 1
        assert "agent/status" in note_types
        frames = [e.data["frame"] for e in notes if e.type == "agent/assistant-stream"]
        assert frames[0] == "start"
        assert frames[-1] == "end"
        assert set(frames[1:-1]) == {"chunk"}
        end = [e for e in notes if e.type == "agent/assistant-stream"][-1]
        assert end.data["outcome"] == "committed"
        assert end.data["seq"] == h.of_type("assistant/message")[0].seq


async def test_subscribe_filters_by_type(autojump_clock):
    async with harness([Reply.text("hello")]) as h:
        async with h.agent.subscribe(types=["turn/end", "agent/status"]) as recv:
            await h.run("go")
            got = []
            while True:
                try:
                    got.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
        assert [e.type for e in got if e.type == "turn/end"] == ["turn/end"]
        assert {e.type for e in got} == {"turn/end", "agent/status"}


async def test_slow_subscriber_overflows_loudly_and_the_agent_keeps_running(autojump_clock):
    async with harness([Reply.text("many words in this answer")]) as h:
        async with h.agent.subscribe(max_buffer=2) as recv:
            await h.run("go")
            assert turn_ends(h.events) == [{"kind": "completed"}]
            received = [recv.receive_nowait(), recv.receive_nowait()]
            assert len(received) == 2
            with pytest.raises(SubscriberOverflowError) as caught:
                await recv.receive()
            assert caught.value.missed > 0
        assert h.agent.statistics().subscribers == 0
        assert_well_formed(h.events)


async def test_a_steer_during_the_stream_continues_the_turn_without_turn_stopping(autojump_clock):
    stopping = []

    async def on_stopping(payload):
        stopping.append(payload["turn"])

    async def steer_later(agent):
        await trio.sleep(1.5)
        agent.steer("one more thing")

    replies = [Reply.text("a b c d"), Reply.text("second")]
    async with harness(replies, latency=1.0) as h:
        h.rt.hooks.serial("agent/turn-stopping", on_stopping)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steer_later, h.agent)
            await h.run("go")
        # the first step ended with next-step non-empty: no turn-stopping, straight to step 2
        assert stopping == [1]
        assert [e.data["step"] for e in h.of_type("step/start")] == [1, 2]
        assert user_texts(h.model.requests[1].messages) == ["go", "one more thing"]
        assert turn_ends(h.events) == [{"kind": "completed"}]


async def test_status_stays_running_between_queued_turns(autojump_clock):
    statuses = []
    async with harness([Reply.text("a"), Reply.text("b"), Reply.text("c")], latency=1.0) as h:
        h.rt.hooks.on("agent/status", lambda e: statuses.append((e.data["status"], e.time)))
        for text in ("1", "2", "3"):
            h.agent.followup(text)
        await h.agent.wait_idle()
        ends = h.of_type("turn/end")
        assert len(ends) == 3
        assert 0.0 < ends[0].time < ends[1].time < ends[2].time
        # no idle flicker between the queued turns
        assert statuses == [("running", 0.0), ("idle", ends[2].time)]


@pytest.mark.parametrize(
    ("budget", "message", "steps", "ended_at"),
    [
        ({"max_steps": 1}, "turn budget: maxSteps 1 reached", 1, 1.0),
        ({"max_tool_calls": 3}, "turn budget: maxToolCalls 3 exceeded", 2, 1.0),
        ({"max_seconds": 1.5}, "turn budget: maxSeconds 1.5 exceeded", 2, 1.5),
    ],
)
async def test_turn_budget_aborts_with_cause_hook(autojump_clock, budget, message, steps, ended_at):
    from dsh_agent_loop import TurnBudget

    @tool
    async def work(n: int) -> str:
        await trio.sleep(1)
        return "worked"

    batch = Reply.tool_calls(("work", {"n": 1}), ("work", {"n": 2}))
    options = AgentOptions(
        id="main", provider="scripted", model="m", turn_budget=TurnBudget(**budget)
    )
    async with harness([batch, batch, batch, Reply.text("x")], tools=[work], options=options) as h:
        h.agent.followup("go")
        h.agent.followup("next")
        await h.agent.wait_idle()
        ends = turn_ends(h.events)
        assert ends[0] == {"kind": "aborted", "cause": "hook", "message": message}
        assert len(ends) == 1  # an aborted turn leaves the queued follow-up for the next wake
        assert [m["id"] for m in h.agent.inbox.next_turn] == ["m-2"]
        assert len(h.of_type("step/start")) == steps
        assert h.of_type("turn/end")[0].time == ended_at
        assert_well_formed(h.events)


async def test_max_tokens_without_calls_ends_the_turn_max_tokens(autojump_clock):
    stopping = []

    async def on_stopping(payload):
        stopping.append(payload["turn"])

    async with harness([Reply.max_tokens("cut off mid sent")]) as h:
        h.rt.hooks.serial("agent/turn-stopping", on_stopping)
        await h.run("go")
        (answer,) = h.of_type("assistant/message")
        assert answer.data["message"]["content"][0]["text"] == "cut off mid sent"
        assert "interrupted" not in answer.data
        assert stopping == [1]
        assert turn_ends(h.events) == [{"kind": "max-tokens"}]


async def test_an_empty_answer_is_still_one_assistant_message(autojump_clock):
    async with harness([Reply.text("")]) as h:
        await h.run("go")
        (answer,) = h.of_type("assistant/message")
        assert answer.data["message"]["content"] == ()
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert_well_formed(h.events)


async def test_concludes_turn_still_runs_turn_stopping(autojump_clock):
    stopping = []

    @tool
    async def finish() -> ToolResult:
        return ToolResult("done", concludes_turn=True)

    async with harness(
        [Reply.tool_calls(("finish", {}, "c1")), Reply.text("never")], tools=[finish]
    ) as h:

        async def on_stopping(payload):
            stopping.append(payload["turn"])

        h.rt.hooks.serial("agent/turn-stopping", on_stopping)
        await h.run("go")
        assert stopping == [1]
        assert len(h.model.requests) == 1


async def test_a_raising_request_hook_ends_the_turn_and_records_the_users(autojump_clock):
    offered = []
    errors = []

    async def broken(payload, next):
        raise KeyError("no config today")

    async def request_error(payload, next):
        offered.append(payload)
        return await next(payload)

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/request", broken)
        h.rt.hooks.waterfall("agent/request-error", request_error)
        h.rt.hooks.on("agent/error", lambda e: errors.append(plain(e.data)))
        await h.run("what was asked")
        assert offered == []
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert "no config today" in end["error"]["message"]
        assert [e["turn"] for e in errors] == [1]
        # the turn ended before its first request: the claimed message is still recorded
        assert h.types()[-3:] == ["step/end", "user/message", "turn/end"]
        assert user_texts([e.data["message"] for e in h.of_type("user/message")]) == [
            "what was asked"
        ]
        assert_well_formed(h.events)


async def test_cancel_during_turn_stopping_aborts_after_the_step(autojump_clock):
    async with harness([Reply.text("answer")]) as h:

        async def slow(payload):
            await trio.sleep(10)
            h.agent.steer("never admitted")

        h.rt.hooks.serial("agent/turn-stopping", slow)
        h.agent.followup("go")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        assert h.types()[-3:] == ["assistant/message", "step/end", "turn/end"]
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert len(h.agent.inbox) == 0


async def test_a_scripted_model_without_a_request_log_streams_the_same_turn():
    from dsh_agent_loop import MemoryStore, ScriptedModel, open_runtime

    logs = []
    for record in (True, False):
        model = ScriptedModel([Reply.text("hello there")], record=record)
        async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
            h = await rt.agents.create(
                options=AgentOptions(id="main", provider="scripted", model="m")
            )
            h.agent.followup("hi")
            await h.agent.wait_idle()
            logs.append([(e.type, e.data) for e in h.agent.session.events if e.type != "turn/end"])
            assert len(model.requests) == (1 if record else 0)
    assert [t for t, _ in logs[0]] == [t for t, _ in logs[1]]
    assert (
        next(d for t, d in logs[1] if t == "assistant/message")["message"]["content"][0]["text"]
        == "hello there"
    )


async def test_sessions_share_their_small_position_records():
    # Thousands of simulated sessions hold one copy of `{turn, step}` (frozen, equal) records
    # and of the stream record; the values are what each session would have built itself.
    from dsh_agent_loop import MemoryStore, ScriptedModel, open_runtime

    model = ScriptedModel([Reply.text("a")], loop=True)
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        agents = []
        for name in ("one", "two"):
            h = await rt.agents.create(
                options=AgentOptions(id=name, provider="scripted", model="m")
            )
            h.agent.followup("hi")
            await h.agent.wait_idle()
            agents.append(h.agent)
        first, second = ([e for e in a.session.events if e.type == "step/start"] for a in agents)
        assert first[0].data == {"turn": 1, "step": 1}
        assert first[0].data is second[0].data
        messages = [
            next(e for e in a.session.events if e.type == "assistant/message") for a in agents
        ]
        assert messages[0].data["stream"] is messages[1].data["stream"]
        # equal routes share one prepared call, and each request carries an equal config
        assert model.requests[0].config == model.requests[1].config
