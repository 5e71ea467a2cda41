"""The ``context/compaction`` record: every summary call is in the log, with its usage."""

from __future__ import annotations

from typing import Any

from dsh_agent_loop import (
    AgentOptions,
    CompactionPolicy,
    Event,
    ScriptedModel,
    invariants,
    open_runtime,
)
from dsh_agent_loop._agent.compaction import SUMMARY_PROMPT
from dsh_agent_loop.cli._transcript import totals
from dsh_agent_loop.llm._base import ModelRequest, Usage
from dsh_agent_loop.llm._scripted import Reply

SUMMARY_USAGE = Usage(input_tokens=700, output_tokens=42)


def is_summary(request: ModelRequest) -> bool:
    first = request.messages[0] if request.messages else None
    return bool(first and first["content"] and first["content"][0]["text"] == SUMMARY_PROMPT)


def replies(fail_summary: bool = False) -> Any:
    def reply(request: ModelRequest) -> Reply:
        if is_summary(request):
            if fail_summary:
                return Reply.error("HTTP_5XX", "summariser overloaded", status=503)
            return Reply.text("model summary", usage=SUMMARY_USAGE)
        return Reply.text("answer " + "x" * 200)

    return reply


async def run(policy: CompactionPolicy, model: ScriptedModel, turns: int = 6) -> Any:
    notes: list[dict[str, Any]] = []
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        rt.hooks.on("context/compacted", lambda e: notes.append(dict(e.data)))
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        for n in range(turns):
            await handle.agent.run(f"question {n} " + "q" * 200)
        return handle.agent, list(handle.agent.session.events), notes


async def test_each_summary_call_leaves_a_record_with_its_usage() -> None:
    model = ScriptedModel([replies()], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1)
    _, events, notes = await run(policy, model)
    records = [e for e in events if e.type == "context/compaction"]
    summaries = [r for r in model.requests if is_summary(r)]
    assert notes
    assert len(records) == len(notes) == len(summaries)
    for record, note in zip(records, notes, strict=True):
        assert record.ignorable
        assert record.seq == note["seq"] + 1  # right after its summary
        assert dict(record.data) == {
            "start_seq": note["start_seq"],
            "end_seq": note["end_seq"],
            "tokens_before": note["tokens_before"],
            "summary_seq": note["seq"],
            "tokens_after": note["tokens_after"],
            "call": {"provider": "scripted", "model": "m", "usage": SUMMARY_USAGE.to_data()},
        }
    assert invariants.check(events) == []
    # The totals count what the model was asked: every answer and every summary.
    found = totals(events)
    assert found.model_calls == len(model.requests)
    assert found.summary_calls == len(summaries)
    assert found.compactions == len(records)
    answers = sum(e.data["usage"]["input_tokens"] for e in events if e.type == "assistant/message")
    assert found.input_tokens == answers + 700 * len(summaries)


async def test_a_failed_summary_call_is_recorded_and_counted_as_failed() -> None:
    model = ScriptedModel([replies(fail_summary=True)], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1)
    _agent, events, notes = await run(policy, model)
    assert notes == []
    records = [e for e in events if e.type == "context/compaction"]
    assert records, "the history passed the trigger"
    data = records[0].data
    assert "summary_seq" not in data
    assert "tokens_after" not in data
    assert data["failure"]["code"] == "COMPACTION_FAILED"
    assert "summariser overloaded" in data["failure"]["message"]
    assert dict(data["call"]) == {"provider": "scripted", "model": "m"}
    assert invariants.check(events) == []
    assert totals(events).failed_calls == len(records)
    assert totals(events).compactions == 0


async def test_a_custom_summarizer_leaves_a_record_without_a_call() -> None:
    async def summarise(messages: Any, instructions: str | None) -> str:
        return "custom"

    model = ScriptedModel([replies()], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1, summarizer=summarise)
    _, events, notes = await run(policy, model)
    records = [e for e in events if e.type == "context/compaction"]
    assert notes
    assert len(records) == len(notes)
    assert all("call" not in r.data for r in records)
    assert totals(events).summary_calls == 0


def test_a_record_must_name_the_summary_of_its_range() -> None:
    def e(seq: int, type: str, **data: Any) -> Event:
        return Event(type=type, seq=seq, time=0.0, data=data)

    text = {"role": "user", "id": "m-1", "content": [{"type": "text", "text": "hi"}]}
    summary = dict(text, id="m-2", source="compaction")
    log = [
        e(0, "session/end-seed"),
        e(1, "user/message", message=text),
        Event(
            "user/message",
            2,
            0.0,
            {"message": summary},
            surface_op={"op": "replace", "start_seq": 1, "end_seq": 1},
        ),
    ]
    good = Event(
        "context/compaction",
        3,
        0.0,
        {"start_seq": 1, "end_seq": 1, "summary_seq": 2, "tokens_before": 9, "tokens_after": 3},
        ignorable=True,
    )
    assert invariants.check([*log, good]) == []
    wrong = Event("context/compaction", 3, 0.0, {**good.data, "summary_seq": 1}, ignorable=True)
    found = invariants.check([*log, wrong])
    assert [(v.kind, v.seq) for v in found] == [("compaction", 3)]
    failed = Event("context/compaction", 3, 0.0, {"start_seq": 1, "end_seq": 1}, ignorable=True)
    assert invariants.check([*log, failed]) == []
