"""``agui_translate``: a session's log as the AG-UI events of one run.

Each test runs a real agent in-process on the scripted model (``agui_checks.session_log``),
translates its log with ``translate_run``/``RunTranslator`` and holds every event to the
protocol's own models (``agui_checks``) and to the conformance validator ``ag-ui-validate``
(docs/design.md#ag-ui).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from dsh_agent_loop import AgentOptions, Event, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._serve.agui_translate import Continuation, RunTranslator, agui_message_id
from dsh_agent_loop.events import TURN_END

from .agui_checks import (
    FULL_RUN,
    LOOK,
    THREAD,
    check_run,
    conformant,
    encoded,
    run_of,
    session_log,
    types,
)


async def test_a_turn_with_reasoning_text_and_a_tool_call_translates_in_order(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("x")
    log = await session_log(
        tmp_path, [LOOK, Reply.text("Done listing.")], ["r1"], tools=["list_dir"]
    )
    run = run_of(log, "r1")
    assert types(run) == FULL_RUN
    check_run(run, THREAD, "r1")
    conformant(run)
    by = {t: [e for e in run if e["type"] == t] for t in set(types(run))}
    assert [e["delta"] for e in by["REASONING_MESSAGE_CONTENT"]] == ["I should list the folder."]
    assert [e["delta"] for e in by["TEXT_MESSAGE_CONTENT"]] == ["Let me look.", "Done listing."]
    assert all(e["role"] == "assistant" for e in by["TEXT_MESSAGE_START"])
    (start,) = by["TOOL_CALL_START"]
    (args,) = by["TOOL_CALL_ARGS"]
    (result,) = by["TOOL_CALL_RESULT"]
    assert (start["toolCallName"], json.loads(args["delta"])) == ("list_dir", {"path": "."})
    assert start["toolCallId"] == args["toolCallId"] == result["toolCallId"]
    assert start["parentMessageId"] == by["TEXT_MESSAGE_START"][0]["messageId"]
    assert (result["content"], result["role"]) == ("notes.txt", "tool")
    assert [e["stepName"] for e in by["STEP_STARTED"]] == ["step-1", "step-2"]
    assert run[-1]["outcome"] == {"type": "success"}
    (usage,) = run[-1]["usage"]
    assert (usage["provider"], usage["model"]) == ("scripted", "m")
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
    # ids are the log's positions: a replay of the same log says the same thing
    seqs = {e.seq for e in log if e.type == "assistant/message"}
    assert {int(e["messageId"].split(":")[1]) for e in by["TEXT_MESSAGE_START"]} == seqs
    assert run_of(log, "r1") == run


async def test_each_run_is_the_turn_that_claimed_its_message(tmp_path: Path) -> None:
    replies = [Reply.text("first answer"), Reply.tool_calls(("list_dir", {})), Reply.text("two")]
    log = await session_log(tmp_path, replies, ["r1", "r2"], tools=["list_dir"])
    first, second = run_of(log, "r1"), run_of(log, "r2")
    for run, run_id in ((first, "r1"), (second, "r2")):
        check_run(run, THREAD, run_id)
        conformant(run)
    texts = [
        [e["delta"] for e in run if e["type"] == "TEXT_MESSAGE_CONTENT"] for run in (first, second)
    ]
    assert texts == [["first answer"], ["two"]]
    # a call with no text before it hangs off the assistant message's own id
    (call,) = [e for e in second if e["type"] == "TOOL_CALL_START"]
    assert call["parentMessageId"].count(":") == 1
    assert "TOOL_CALL_ARGS" in types(second)  # "{}": arguments are sent as they are
    # a message no turn has claimed yet: only RUN_STARTED so far
    assert types(run_of(log, "never-sent")) == ["RUN_STARTED"]


async def test_feeding_event_by_event_gives_the_same_run_and_ends_it_once(tmp_path: Path) -> None:
    log = await session_log(tmp_path, [LOOK, Reply.text("ok")], ["r1"], tools=["list_dir"])
    translator = RunTranslator(THREAD, "r1", agui_message_id("r1"))
    pieces = [translator.start()]
    done_at = None
    for event in log:
        pieces.append(translator.feed(event))
        if translator.done and done_at is None:
            done_at = event
    assert done_at is not None
    assert (done_at.type, done_at.seq) == (TURN_END, log[-1].seq)
    assert translator.feed(log[-1]) == []
    assert translator.fail("X", "late") == []
    flat = [e for piece in pieces for e in piece]
    assert encoded(flat) == run_of(log, "r1")


async def test_a_turn_waiting_for_approval_finishes_with_an_interrupt_per_call(
    tmp_path: Path,
) -> None:
    replies = [Reply.tool_calls(("list_dir", {"path": "."}), ("list_dir", {"path": ".."}))]
    log = await session_log(
        tmp_path, replies, ["r1"], tools=["list_dir"], require_approval=["list_dir"]
    )
    assert log[-1].data["reason"]["kind"] == "awaiting-approval"
    run = run_of(log, "r1")
    check_run(run, THREAD, "r1")
    conformant(run)
    outcome = run[-1]["outcome"]
    assert outcome["type"] == "interrupt"
    calls = [e["toolCallId"] for e in run if e["type"] == "TOOL_CALL_START"]
    assert (
        [i["toolCallId"] for i in outcome["interrupts"]]
        == calls
        == list(log[-1].data["reason"]["call_ids"])
    )
    assert [i["id"] for i in outcome["interrupts"]] == calls
    assert all("list_dir" in i["message"] for i in outcome["interrupts"])
    assert "TOOL_CALL_RESULT" not in types(run)
    # a next run would wait behind the calls: it finishes at once with the same interrupts
    later = RunTranslator(THREAD, "r2", agui_message_id("r2"))
    for event in log:
        assert later.feed(event) == []
    (refused,) = encoded(later.refuse_behind_approvals())
    assert later.done
    assert refused["outcome"]["interrupts"] == outcome["interrupts"]
    # ... unless the run's own turn already ended: that is replayed, not refused
    done = RunTranslator(THREAD, "r1", agui_message_id("r1"))
    for event in log:
        done.feed(event)
    assert done.done
    assert done.refuse_behind_approvals() == []


GUARDED_LIST: dict[str, Any] = {"tools": ["list_dir"], "require_approval": ["list_dir"]}


async def test_a_continuation_turn_translates_from_a_real_log(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    calls = Reply.tool_calls(("list_dir", {"path": "."}), ("list_dir", {"path": "missing"}))
    model = ScriptedModel([calls, Reply.text("one listed, one denied")])
    async with open_runtime(providers={"scripted": model}, seed=1) as rt:
        handle = await rt.agents.create(
            session_id=THREAD,
            options=AgentOptions(
                id="helper",
                provider="scripted",
                model="m",
                cwd=str(tmp_path),
                **GUARDED_LIST,
            ),
        )
        agent = handle.agent
        agent.followup("look", message_id=agui_message_id("r1"))
        await agent.wait_idle()
        interrupted = list(agent.session.events)
        agent.approve("call-1")
        agent.deny("call-2", "not that one")
        await agent.wait_idle()
        log = list(agent.session.events)
    checked = interrupted[-1].seq  # where the resuming run checked its entries
    assert checked is not None
    waiting = RunTranslator(THREAD, "r2", Continuation(["call-1", "call-2"], checked))
    for event in interrupted:
        assert waiting.feed(event) == []
    assert waiting.waiting() == ("call-1", "call-2")
    # the interrupted run's log alone: the continuation has not started
    resumed = Continuation(["call-1", "call-2"], checked)
    assert types(run_of(interrupted, "r2", resumed)) == ["RUN_STARTED"]

    run = run_of(log, "r2", Continuation(["call-1", "call-2"], checked))
    check_run(run, THREAD, "r2")
    conformant(run)
    announced = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert types(run) == [
        "RUN_STARTED",
        "STEP_STARTED",
        *announced,
        *announced,
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    starts = [e for e in run if e["type"] == "TOOL_CALL_START"]
    args = [json.loads(e["delta"]) for e in run if e["type"] == "TOOL_CALL_ARGS"]
    results = [e for e in run if e["type"] == "TOOL_CALL_RESULT"]
    assert [(e["toolCallId"], e["toolCallName"]) for e in starts] == [
        ("call-1", "list_dir"),
        ("call-2", "list_dir"),
    ]
    assert all(e.get("parentMessageId") is None for e in starts)  # made in the earlier run
    assert args == [{"path": "."}, {"path": "missing"}]
    assert [e["toolCallId"] for e in results] == ["call-1", "call-2"]
    assert results[0]["content"] == "notes.txt"
    assert results[1]["content"] == "Error: tool call denied: not that one"
    (text,) = [e["delta"] for e in run if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert text == "one listed, one denied"
    assert run[-1]["outcome"] == {"type": "success"}
    # usage is the continuation's own model call, not the interrupted run's
    (answer,) = [e for e in log[checked + 1 :] if e.type == "assistant/message"]
    (usage,) = run[-1]["usage"]
    assert usage["outputTokens"] == answer.data["usage"]["output_tokens"]
    assert usage["inputTokens"] == answer.data["usage"]["input_tokens"]
    # decisions logged before the bound are not this run's: nothing is claimed
    assert types(run_of(log, "r3", Continuation(["call-1", "call-2"], log[-1].seq or 0))) == [
        "RUN_STARTED"
    ]


async def test_unanswered_calls_end_the_run_with_their_interrupts(tmp_path: Path) -> None:
    replies = [Reply.tool_calls(("list_dir", {"path": "."}), ("list_dir", {"path": ".."}))]
    log = await session_log(
        tmp_path, replies, ["r1"], tools=["list_dir"], require_approval=["list_dir"]
    )
    translator = RunTranslator(THREAD, "r2", Continuation(["call-1"], log[-1].seq or 0))
    head = translator.start()
    for event in log:
        head += translator.feed(event)
    assert translator.interrupt([]) == []  # none left: no interrupt outcome
    head += translator.interrupt(["call-2"])
    assert translator.done
    assert translator.interrupt(["call-2"]) == []
    run = encoded(head)
    check_run(run, THREAD, "r2")
    conformant(run)
    (interrupt,) = run[-1]["outcome"]["interrupts"]
    assert (interrupt["id"], interrupt["toolCallId"]) == ("call-2", "call-2")
    assert "list_dir" in interrupt["message"]
    assert '".."' in interrupt["message"]


async def test_empty_blocks_say_nothing(tmp_path: Path) -> None:
    log = await session_log(tmp_path, [Reply.text("fine", reasoning="think")], ["r1"])
    (answer,) = [e for e in log if e.type == "assistant/message"]
    blocks = [{"type": "reasoning", "text": ""}, {"type": "text", "text": ""},
              *answer.data["message"]["content"]]  # fmt: skip
    data = {**answer.data, "message": {"role": "assistant", "content": blocks}}
    shaped = [e if e is not answer else Event(e.type, e.seq, e.time, data) for e in log]
    run = run_of(shaped, "r1")
    conformant(run)
    assert [e["delta"] for e in run if "delta" in e] == ["think", "fine"]
    # the blocks keep their positions in the ids
    assert [e["messageId"].rsplit(":", 1)[1] for e in run if e["type"].endswith("START")
            and "messageId" in e and not e["messageId"].endswith("span")] == ["2", "3"]  # fmt: skip


async def test_failed_and_aborted_turns_and_a_removed_message(tmp_path: Path) -> None:
    failed = await session_log(tmp_path, [Reply.error("HTTP_4XX", "model not found")], ["r1"])
    run = run_of(failed, "r1")
    check_run(run, THREAD, "r1")
    conformant(run)
    assert (run[-1]["type"], run[-1]["code"]) == ("RUN_ERROR", "HTTP_4XX")
    assert "model not found" in run[-1]["message"]
    assert types(run).count("STEP_FINISHED") == types(run).count("STEP_STARTED") == 1

    model = ScriptedModel([Reply.hang(after_text="partial")])
    async with open_runtime(providers={"scripted": model}, seed=1) as rt:
        handle = await rt.agents.create(
            session_id=THREAD, options=AgentOptions(id="helper", provider="scripted", model="m")
        )
        agent = handle.agent
        agent.followup("hang", message_id="agui-r1")
        with trio.fail_after(10):
            while not any(e.type == "step/start" for e in agent.session.events):
                await trio.sleep(0.01)
        agent.followup("queued", message_id="agui-r2")
        agent.cancel()
        await agent.wait_idle()
        log = list(agent.session.events)
    aborted, removed = run_of(log, "r1"), run_of(log, "r2")
    for run, run_id in ((aborted, "r1"), (removed, "r2")):
        check_run(run, THREAD, run_id)
        conformant(run)
        assert run[-1]["outcome"] == {"type": "cancelled"}
    assert types(removed) == ["RUN_STARTED", "RUN_FINISHED"]
