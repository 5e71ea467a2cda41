"""Token accounting, surface replacement and compaction (docs/design.md#context-and-compaction)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    CompactionPolicy,
    ContextUsage,
    InvalidOptionError,
    ScriptedModel,
    SqliteStore,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop._agent.compaction import SUMMARY_PROMPT, CompactionError, transcript
from dsh_agent_loop._agent.context import CHARS_PER_TOKEN, MESSAGE_OVERHEAD, estimate_tokens
from dsh_agent_loop.llm._base import ModelRequest, Usage
from dsh_agent_loop.llm._scripted import Reply
from dsh_agent_loop.testing import explore_cancellation_async

WINDOW = 4000


def is_summary_request(request: ModelRequest) -> bool:
    first = request.messages[0] if request.messages else None
    if first is None or first["role"] != "system" or not first["content"]:
        return False
    return str(first["content"][0]["text"]) == SUMMARY_PROMPT


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}: " + "v" * 300


def chatty(request: ModelRequest) -> Reply:
    """Long answers; every third prompt asks for a tool call first; summaries are short."""
    if is_summary_request(request):
        return Reply.text("the user asked numbered questions and got long answers")
    last = request.messages[-1]
    if last["role"] == "user":
        text = str(last["content"][0].get("text", ""))
        if text.startswith("tool"):
            return Reply.tool_calls(("lookup", {"key": text[:12]}))
    return Reply.text("answer " + "x" * 600)


def request_tokens(request: ModelRequest) -> int:
    """The request's size by the documented estimate (messages and tool schemas)."""
    schemas = sum(len(str(t)) for t in request.tools)
    return estimate_tokens(request.messages) + -(-schemas // CHARS_PER_TOKEN)


def pairs_intact(messages: Sequence[Any]) -> bool:
    calls: list[str] = []
    results: list[str] = []
    for message in messages:
        for block in message["content"]:
            if block["type"] == "tool-call":
                calls.append(block["call_id"])
        if message["role"] == "tool":
            results.append(message["call_id"])
    return sorted(calls) == sorted(results)


def prompt(n: int) -> str:
    kind = "tool" if n % 3 == 0 else "question"
    return f"{kind} {n} " + "q" * 300


async def test_a_200_turn_conversation_stays_under_a_4k_window_across_a_resume(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    model = ScriptedModel([chatty], loop=True, context_window=WINDOW)
    compacted: list[dict[str, Any]] = []
    session_id = ""
    for half in range(2):
        async with open_runtime(
            store=SqliteStore(path),
            providers={"scripted": model},
            tools=[lookup],
            compaction=CompactionPolicy(trigger_ratio=0.7, keep_recent_turns=2),
        ) as rt:
            rt.hooks.on("context/compacted", lambda e: compacted.append(dict(e.data)))
            if half == 0:
                options = AgentOptions(id="long", provider="scripted", model="m")
                handle = await rt.agents.create(options=options)
                session_id = handle.session_id
            else:
                handle = await rt.agents.resume(session_id)
            for n in range(half * 100, half * 100 + 100):
                await handle.agent.run(prompt(n))
            if half == 1:
                events = list(handle.agent.session.events)
    assert len(compacted) >= 10
    for request in model.requests:
        assert request_tokens(request) < WINDOW
        assert pairs_intact(request.messages)
    assert invariants.check(events) == []
    async with SqliteStore(path) as store:
        reader = await store.open(session_id)
        stored = await reader.read()
        await reader.close()
    assert invariants.check(stored) == []
    summaries = [
        e
        for e in stored
        if e.type == "user/message" and e.data["message"].get("source") == "compaction"
    ]
    assert len(summaries) == len(compacted)
    assert all(e.surface_op["op"] == "replace" for e in summaries)
    headers = [e for e in stored if e.type == "request/header"]
    assert [h.data["reason"] for h in headers].count("series") >= len(compacted) - 1


# -- helpers for the smaller tests ------------------------------------------------------------
def by_type(events: Sequence[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


async def run_turns(agent: Any, *prompts: str) -> None:
    for text in prompts:
        await agent.run(text)


class Recorder:
    """A summarizer that records what it was given."""

    def __init__(self, text: str = "short summary") -> None:
        self.text = text
        self.calls: list[tuple[list[Any], str | None]] = []

    async def __call__(self, messages: Sequence[Any], instructions: str | None) -> str:
        self.calls.append((list(messages), instructions))
        return self.text


def texts_reply(request: ModelRequest) -> Reply:
    if is_summary_request(request):
        return Reply.text("model summary")
    return Reply.text("answer " + "x" * 200)


# -- token accounting -------------------------------------------------------------------------
async def test_usage_is_the_reported_input_plus_an_estimate_of_what_came_after() -> None:
    reply = Reply.text("fine", usage=Usage(input_tokens=1500, output_tokens=3))
    model = ScriptedModel([reply], loop=True, context_window=WINDOW)
    async with open_runtime(providers={"scripted": model}) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        before = agent.context_usage()
        assert before.window is None
        assert before.ratio is None
        await agent.run("hello there")
        usage = agent.context_usage()
        answer = agent.session.derive_messages()[-1]
        expected = 1500 + estimate_tokens([answer])
        assert usage == ContextUsage(expected, WINDOW, expected / WINDOW)
        assert estimate_tokens([answer]) == -(-len("fine") // CHARS_PER_TOKEN) + MESSAGE_OVERHEAD


async def test_the_estimate_is_a_floor_when_the_provider_under_reports() -> None:
    reply = Reply.text("y" * 4000, usage=Usage(input_tokens=1, output_tokens=1))
    model = ScriptedModel([reply], loop=True, context_window=WINDOW)
    async with open_runtime(providers={"scripted": model}) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        await handle.agent.run("z" * 400)
        usage = handle.agent.context_usage()
        assert usage.tokens >= estimate_tokens(handle.agent.session.derive_messages())
        assert usage.tokens >= 1000


async def test_a_token_counter_counts_the_whole_request() -> None:
    seen: list[int] = []

    def counter(messages: Sequence[Any]) -> int:
        seen.append(len(messages))
        return 7 * len(messages)

    model = ScriptedModel([Reply.text("ok")], loop=True, context_window=WINDOW)
    policy = CompactionPolicy(token_counter=counter)
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        await run_turns(handle.agent, "one", "two")
        n = len(handle.agent.session.derive_messages())
        assert handle.agent.context_usage().tokens == 7 * n
        assert seen  # consulted before each request too


def test_compaction_policy_values_are_checked() -> None:
    for bad in (
        CompactionPolicy(trigger_ratio=0),
        CompactionPolicy(trigger_ratio=1.5),
        CompactionPolicy(keep_recent_turns=-1),
        CompactionPolicy(summarizer="no"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidOptionError):
            bad.validate()
    with pytest.raises(InvalidOptionError):
        AgentOptions(id="a", compaction=CompactionPolicy(trigger_ratio=2)).validate()


# -- replace_history --------------------------------------------------------------------------
async def test_replace_history_between_turns_shows_in_history_and_starts_a_series() -> None:
    model = ScriptedModel([Reply.text("first answer"), Reply.text("second answer")], loop=True)
    async with open_runtime(providers={"scripted": model}) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        await run_turns(agent, "first question", "second question")
        events = list(agent.session.events)
        user = by_type(events, "user/message")[0]
        answer = by_type(events, "assistant/message")[0]
        event = agent.replace_history(user.seq, answer.seq, "we talked about the first thing")
        assert event.type == "user/message"
        assert event.surface_op == {"op": "replace", "start_seq": user.seq, "end_seq": answer.seq}
        texts = [m["content"][0]["text"] for m in agent.session.derive_messages()]
        assert texts[:1] == ["we talked about the first thing"]
        assert "first question" not in texts
        assert "second question" in texts
        await agent.run("third question")
        headers = by_type(agent.session.events, "request/header")
        assert headers[-1].data["reason"] == "series"
        assert model.requests[-1].messages[0]["content"][0]["text"].startswith("we talked")
        assert invariants.check(list(agent.session.events)) == []


async def test_replace_history_refuses_node_0_a_split_tool_pair_and_off_surface_seqs() -> None:
    model = ScriptedModel(
        [Reply.tool_calls(("lookup", {"key": "k"})), Reply.text("done")], loop=True
    )
    async with open_runtime(providers={"scripted": model}, tools=[lookup]) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m", persona="be brief")
        )
        agent = handle.agent
        await agent.run("look it up")
        events = list(agent.session.events)
        node0 = by_type(events, "system/message")[0]
        user = by_type(events, "user/message")[0]
        call = by_type(events, "assistant/message")[0]
        result = by_type(events, "tool/result")[0]
        turn_start = by_type(events, "turn/start")[0]
        n = len(events)
        with pytest.raises(InvalidOptionError, match="node 0"):
            agent.replace_history(node0.seq, user.seq, "x")
        with pytest.raises(InvalidOptionError, match="splits a tool call"):
            agent.replace_history(user.seq, call.seq, "x")
        with pytest.raises(InvalidOptionError, match="splits a tool call"):
            agent.replace_history(result.seq, result.seq, "x")
        with pytest.raises(InvalidOptionError, match="not on the surface"):
            agent.replace_history(turn_start.seq, user.seq, "x")
        with pytest.raises(InvalidOptionError):
            agent.replace_history(user.seq, result.seq, {"role": "tool", "content": "x"})
        with pytest.raises(InvalidOptionError, match="tool calls"):
            agent.replace_history(
                user.seq,
                result.seq,
                {"role": "assistant", "content": [{"type": "tool-call", "call_id": "c"}]},
            )
        assert len(agent.session.events) == n  # every refusal appended nothing
        done = agent.replace_history(
            user.seq, result.seq, {"role": "assistant", "content": "I looked it up."}
        )
        assert done.type == "assistant/message"
        with pytest.raises(InvalidOptionError, match="not on the surface"):
            agent.replace_history(user.seq, user.seq, "x")  # replaced already
        assert invariants.check(list(agent.session.events)) == []


async def test_replace_history_is_refused_during_a_step_and_allowed_in_pre_step() -> None:
    outcomes: list[str] = []

    @tool
    async def meddle() -> str:
        """Try to rewrite history from inside a tool."""
        agent = rt.agents.get("a")
        first = by_type(agent.session.events, "user/message")[0]
        try:
            agent.replace_history(first.seq, first.seq, "rewritten")
        except InvalidOptionError:
            outcomes.append("refused in a tool")
        return "ok"

    model = ScriptedModel(
        [Reply.text("a"), Reply.tool_calls(("meddle", {})), Reply.text("b"), Reply.text("c")]
    )
    async with open_runtime(providers={"scripted": model}, tools=[meddle]) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        await agent.run("first")
        await agent.run("second")

        async def pre_step(payload: Any, next: Any) -> Any:
            first = by_type(agent.session.events, "user/message")[0]
            if first.data["message"]["content"][0]["text"] == "first":
                agent.replace_history(first.seq, first.seq, "rewritten in pre-step")
                outcomes.append("allowed in pre-step")
            return await next(payload)

        rt.hooks.waterfall("agent/pre-step", pre_step)
        await agent.run("third")
    assert outcomes == ["refused in a tool", "allowed in pre-step"]
    sent = model.requests[-1].messages
    assert sent[0]["content"][0]["text"] == "rewritten in pre-step"
    assert invariants.check(list(agent.session.events)) == []


# -- compaction -------------------------------------------------------------------------------
async def test_auto_compaction_uses_the_summarizer_and_keeps_recent_turns() -> None:
    model = ScriptedModel([texts_reply], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1, instructions="keep names")
    notes: list[dict[str, Any]] = []
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        rt.hooks.on("context/compacted", lambda e: notes.append(dict(e.data)))
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        await run_turns(agent, *(f"question {n} " + "q" * 200 for n in range(6)))
        events = list(agent.session.events)
    assert notes, "the history passed the trigger"
    note = notes[0]
    assert note["tokens_after"] < note["tokens_before"]
    summary = next(e for e in events if e.seq == note["seq"])
    assert summary.type == "user/message"
    assert summary.data["message"]["source"] == "compaction"
    assert "model summary" in summary.data["message"]["content"][0]["text"]
    summary_requests = [r for r in model.requests if is_summary_request(r)]
    assert len(summary_requests) == len(notes)
    assert "keep names" in summary_requests[0].messages[1]["content"][0]["text"]
    assert invariants.check(events) == []


async def test_a_custom_summarizer_gets_the_older_messages_and_instructions() -> None:
    recorder = Recorder("custom summary")
    model = ScriptedModel([texts_reply], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1, summarizer=recorder)
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        await run_turns(agent, *(f"question {n} " + "q" * 200 for n in range(6)))
        history = agent.session.derive_messages()
    assert recorder.calls
    messages, instructions = recorder.calls[0]
    assert instructions is None
    assert messages[0]["role"] == "user"
    assert "question 0" in messages[0]["content"][0]["text"]
    assert not any(is_summary_request(r) for r in model.requests)
    texts = [m["content"][0]["text"] for m in history if m["role"] == "user"]
    assert any(t.endswith("custom summary") for t in texts)
    assert "question 5" in texts[-1]  # the running turn is kept


async def test_compact_now_between_turns_and_refused_during_a_turn() -> None:
    recorder = Recorder()
    gate = trio.Event()
    release = trio.Event()

    @tool
    async def wait_here() -> str:
        """Park until released."""
        gate.set()
        await release.wait()
        return "ok"

    model = ScriptedModel(
        [Reply.text("a"), Reply.text("b"), Reply.tool_calls(("wait_here", {})), Reply.text("c")]
    )
    policy = CompactionPolicy(keep_recent_turns=1, summarizer=recorder)
    async with open_runtime(
        providers={"scripted": model}, tools=[wait_here], compaction=policy
    ) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        assert await agent.compact() is None  # nothing old enough yet
        await run_turns(agent, "one", "two")
        done = await agent.compact("focus on numbers")
        assert done is not None
        assert recorder.calls[-1][1] == "focus on numbers"
        assert [m["role"] for m in recorder.calls[-1][0]] == ["user", "assistant"]
        agent.followup("three")
        await gate.wait()
        with pytest.raises(InvalidOptionError):
            await agent.compact()
        release.set()
        await agent.wait_idle()
        assert invariants.check(list(agent.session.events)) == []


async def test_a_failing_summary_leaves_the_history_and_the_step_goes_on() -> None:
    async def broken(messages: Sequence[Any], instructions: str | None) -> str:
        raise RuntimeError("summary service down")

    model = ScriptedModel([texts_reply], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1, summarizer=broken)
    errors: list[Any] = []
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        rt.hooks.on("agent/error", lambda e: errors.append(e.data["error"]))
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        await run_turns(agent, *(f"question {n} " + "q" * 200 for n in range(6)))
        with pytest.raises(CompactionError, match="summary service down"):
            await agent.compact()
        events = list(agent.session.events)
    assert errors
    assert errors[0]["code"] == "COMPACTION_FAILED"
    assert not [e for e in events if e.surface_op not in (None, "append")]
    ends = [e.data["reason"]["kind"] for e in by_type(events, "turn/end")]
    assert ends == ["completed"] * 6


async def test_a_cancel_during_the_summary_appends_no_replacement(autojump_clock: Any) -> None:
    started = trio.Event()

    async def slow(messages: Sequence[Any], instructions: str | None) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    model = ScriptedModel([texts_reply], loop=True, context_window=1000)
    policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1, summarizer=slow)
    async with open_runtime(providers={"scripted": model}, compaction=policy) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="a", provider="scripted", model="m")
        )
        agent = handle.agent
        for n in range(6):
            agent.followup(f"question {n} " + "q" * 200)
        await started.wait()
        agent.cancel()
        await agent.wait_idle()
        events = list(agent.session.events)
    assert not [e for e in events if e.surface_op not in (None, "append")]
    assert by_type(events, "turn/end")[-1].data["reason"]["kind"] == "aborted"
    assert invariants.check(events) == []


async def test_explore_cancellation_over_a_compacting_turn() -> None:
    def providers() -> dict[str, Any]:
        return {"scripted": ScriptedModel([texts_reply], loop=True, context_window=500)}

    async def scenario(rt: Any) -> None:
        policy = CompactionPolicy(trigger_ratio=0.5, keep_recent_turns=1)
        options = AgentOptions(id="a", provider="scripted", model="m", compaction=policy)
        handle = await rt.agents.create(options=options)
        for n in range(5):
            handle.agent.followup(f"q{n} " + "q" * 150)
        await handle.agent.wait_idle()

    report = await explore_cancellation_async(scenario, providers=providers)
    assert report.checkpoints >= 10
    assert report.failures == []


def test_the_transcript_cuts_the_middle_past_its_limit() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a" * 100}]},
        {"role": "assistant", "content": [{"type": "reasoning", "text": "secret"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "name": "f", "arguments": '{"x": 1}'}],
        },
        {"role": "tool", "content": [{"type": "tool-result", "name": "f", "text": "b" * 100}]},
    ]
    full = transcript(messages, None)
    assert "secret" not in full
    assert 'called tool f({"x": 1})' in full
    cut = transcript(messages, 60)
    assert "characters omitted" in cut
    assert len(cut) < len(full)


# -- CONTEXT_OVERFLOW from a real HTTP server -------------------------------------------------
OVERFLOW_BODIES = {
    "openai": {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. However, your "
            "messages resulted in 5120 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "anthropic": {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 208310 tokens > 200000 maximum",
        },
    },
}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_context_overflow_compacts_once_and_retries_the_step(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..llm.agent_helpers import CLAUDE_KEY_ENV, KEY_ENV, an_text, live_agent, oai_text
    from ..llm.server import Reply as HttpReply

    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv(CLAUDE_KEY_ENV, "sk-ant-test")

    def answer(*words: str) -> HttpReply:
        pieces = oai_text(*words) if kind == "openai" else an_text(*words)
        return HttpReply(pieces=list(pieces))

    policy = CompactionPolicy(keep_recent_turns=1)
    notes: list[Any] = []
    async with live_agent(kind, compaction=policy) as live:
        live.rt.hooks.on("context/compacted", lambda e: notes.append(dict(e.data)))
        live.server.push(answer("first", " answer"))
        await live.agent.run("first question")
        live.server.push(
            HttpReply.error(400, OVERFLOW_BODIES[kind]),
            answer("the", " summary"),
            answer("second", " answer"),
        )
        result = await live.agent.run("second question")
        bodies = live.bodies()
        events = live.events
    assert result.text == "second answer"
    assert len(notes) == 1
    failed = by_type(events, "assistant/attempt")
    assert [e.data["failure"]["code"] for e in failed] == ["CONTEXT_OVERFLOW"]
    assert len(bodies) == 4  # first turn, the rejected request, the summary, the retry
    retried = json_text(bodies[3])
    assert "the summary" in retried
    assert "first question" not in retried
    assert "second question" in retried
    assert invariants.check(events) == []


async def test_context_overflow_without_a_policy_ends_the_turn_with_its_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_agent_loop import TurnFailedError

    from ..llm.agent_helpers import KEY_ENV, live_agent
    from ..llm.server import Reply as HttpReply

    monkeypatch.setenv(KEY_ENV, "sk-test")
    async with live_agent("openai") as live:
        live.server.push(HttpReply.error(400, OVERFLOW_BODIES["openai"]))
        with pytest.raises(TurnFailedError) as caught:
            await live.agent.run("question")
        assert len(live.bodies()) == 1  # not transient: no retry
    assert caught.value.code == "CONTEXT_OVERFLOW"


def json_text(body: Any) -> str:
    import json

    return json.dumps(body)
