"""``ScriptedModel`` and ``Reply`` (``llm/_scripted.py``): the exact chunks a script streams."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import trio
import trio.testing

from dsh_agent_loop._frozen import freeze
from dsh_agent_loop.llm._base import (
    BlockEnd,
    BlockStart,
    Failure,
    Finish,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh_agent_loop.llm._scripted import Reply, ScriptedModel

CONFIG = freeze({"provider": "scripted", "model": "m"})


def request(*texts: str) -> ModelRequest:
    messages = [freeze({"role": "user", "content": [{"type": "text", "text": t}]}) for t in texts]
    return ModelRequest(config=CONFIG, messages=messages)


async def chunks(model: ScriptedModel, req: ModelRequest | None = None) -> list[Any]:
    call = await model.prepare_call(CONFIG)
    return [c async for c in call.stream(req or request("hi"))]


async def test_a_text_reply_streams_reasoning_then_text_word_by_word():
    model = ScriptedModel([Reply.text("hello big world", reasoning="think")])
    out = await chunks(model, request("12345678"))
    assert out == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "think"),
        BlockEnd(0),
        BlockStart(1, "text"),
        TextDelta(1, "hello "),
        TextDelta(1, "big "),
        TextDelta(1, "world"),
        BlockEnd(1),
        UsageChunk(Usage(10 + 8 // 4, 4)),  # 10 a message + newest / 4; 4 words out
        Finish("stop", stop_reason="stop"),
    ]


async def test_tool_calls_get_numbered_ids_that_avoid_the_scripted_ones():
    model = ScriptedModel(
        [Reply.tool_calls(("a", {"x": 1}), ("b", "{}", "call-1"), ("c", ""), text="ok")]
    )
    out = await chunks(model)
    starts = [c for c in out if isinstance(c, BlockStart)]
    assert [(s.kind, s.call_id, s.name) for s in starts] == [
        ("text", None, None),
        ("tool-call", "call-2", "a"),
        ("tool-call", "call-1", "b"),
        ("tool-call", "call-3", "c"),
    ]
    assert [c for c in out if isinstance(c, ToolCallDelta)] == [
        ToolCallDelta(1, '{"x":1}'),
        ToolCallDelta(2, "{}"),
    ]  # empty arguments stream no delta
    assert out[-1] == Finish("tool-calls", stop_reason="tool_calls")


async def test_an_error_reply_streams_its_text_then_fails():
    model = ScriptedModel([Reply.error("HTTP_429", after_text="par", status=429, retry_after=2)])
    out = await chunks(model)
    assert out == [
        BlockStart(0, "text"),
        TextDelta(0, "par"),
        BlockEnd(0),
        Finish("error", failure=Failure("HTTP_429", "HTTP_429", status=429, retry_after=2)),
    ]


async def test_max_tokens_may_cut_a_tool_call():
    model = ScriptedModel([Reply.max_tokens("t", cut_tool_call=("write", '{"pa'))])
    out = await chunks(model)
    assert out[-4:-2] == [
        BlockStart(1, "tool-call", call_id="call-1", name="write"),
        ToolCallDelta(1, '{"pa'),
    ]
    assert not any(isinstance(c, BlockEnd) and c.index == 1 for c in out)
    assert out[-1] == Finish("max-tokens", stop_reason="max_tokens")


async def test_an_exhausted_script_fails_unless_it_loops():
    model = ScriptedModel([Reply.text("one")])
    await chunks(model)
    out = await chunks(model)
    assert out[-1].failure.code == "SCRIPT_EXHAUSTED"
    looping = ScriptedModel([Reply.text("a"), Reply.text("b")], loop=True)
    texts = []
    for _ in range(3):
        texts.append(next(c.text for c in await chunks(looping) if isinstance(c, TextDelta)))
    assert texts == ["a", "b", "a"]
    assert (await chunks(ScriptedModel(loop=True)))[-1].failure.code == "SCRIPT_EXHAUSTED"


async def test_callable_entries_see_the_request_and_requests_are_recorded():
    model = ScriptedModel([lambda req: Reply.text(f"{len(req.messages)} messages")])
    model.add(Reply.text("added"))
    first = request("a", "b")
    out = await chunks(model, first)
    assert TextDelta(0, "2 ") in out
    await chunks(model)
    assert model.requests[0] is first
    assert len(model.requests) == 2
    quiet = ScriptedModel([Reply.text("x")], record=False)
    await chunks(quiet)
    assert quiet.requests == []


async def test_an_explicit_usage_is_used_as_is():
    model = ScriptedModel([Reply.text("x", usage=Usage(7, 8))])
    assert UsageChunk(Usage(7, 8)) in await chunks(model)


async def test_latency_is_slept_before_each_word(autojump_clock):
    model = ScriptedModel([Reply.text("a b c")], latency=0.5)
    start = trio.current_time()
    await chunks(model)
    assert trio.current_time() - start == pytest.approx(1.5)


async def test_a_hang_streams_its_text_then_waits_for_cancel(autojump_clock):
    model = ScriptedModel([Reply.hang("wait")])
    seen: list[Any] = []
    with trio.move_on_after(100) as scope:
        call = await model.prepare_call(CONFIG)
        async for chunk in call.stream(request("x")):
            seen.append(chunk)
    assert scope.cancelled_caught
    assert seen == [BlockStart(0, "text"), TextDelta(0, "wait"), BlockEnd(0)]


async def test_a_stream_takes_its_reply_when_iterated_pauses_per_word_and_is_not_gc_tracked():
    model = ScriptedModel([Reply.text("one two"), Reply.text("later")])
    call = await model.prepare_call(CONFIG)
    stream = call.stream(request("x"))
    assert not gc.is_tracked(stream)  # what a stream holds while paused is not walked
    assert model.requests == []  # nothing taken before the first chunk is asked for
    with trio.testing.assert_checkpoints():
        first = [await stream.__anext__() for _ in range(2)]  # BlockStart, then a paused word
    assert first == [BlockStart(0, "text"), TextDelta(0, "one ")]
    assert len(model.requests) == 1
    await stream.aclose()  # ends it: no further chunk, and the next reply stays unused
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert await chunks(model) == [
        BlockStart(0, "text"),
        TextDelta(0, "later"),
        BlockEnd(0),
        UsageChunk(Usage(10 + 1 // 4, 1)),
        Finish("stop", stop_reason="stop"),
    ]


async def test_a_stream_closed_before_it_started_takes_no_reply():
    model = ScriptedModel([Reply.text("unused")])
    call = await model.prepare_call(CONFIG)
    stream = call.stream(request("x"))
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert model.requests == []
    assert len(await chunks(model)) == 5  # the reply is still the next one


async def test_a_paused_stream_is_a_cancel_point():
    model = ScriptedModel([Reply.tool_calls(("t", {"a": 1}))])
    call = await model.prepare_call(CONFIG)
    stream = call.stream(request("x"))
    assert isinstance(await stream.__anext__(), BlockStart)  # the call starts: no pause
    with trio.CancelScope() as scope:
        scope.cancel()
        await stream.__anext__()  # the arguments come after a pause
    assert scope.cancelled_caught


async def test_prepare_call_reuses_the_route_for_an_equal_config():
    model = ScriptedModel(context_window=1000, system_prompt_update="in-history")
    first = await model.prepare_call(CONFIG)
    assert await model.prepare_call(dict(CONFIG)) is first
    assert (first.context_window, first.system_prompt_update) == (1000, "in-history")
    other = await model.prepare_call({"provider": "scripted", "model": "n"})
    assert other is not first


async def test_plans_live_with_their_replies_and_the_model_keeps_none():
    # A reply's plan is kept on the reply: a reused reply is planned once, and a reply function
    # that builds a new reply per request (distinct text each time) leaves nothing behind.
    import weakref

    reused = Reply.text("the same words")
    model = ScriptedModel([reused, reused])
    await chunks(model)
    plan = reused._plan
    assert plan is not None
    await chunks(model)
    assert reused._plan is plan

    made: list[weakref.ref[Reply]] = []

    def fresh(req: ModelRequest) -> Reply:
        reply = Reply.text(f"answer number {len(made)} of many")
        made.append(weakref.ref(reply))
        return reply

    model = ScriptedModel([fresh], loop=True, record=False)
    for _ in range(2_000):
        out = await chunks(model)
        assert isinstance(out[-1], Finish)
    gc.collect()
    assert len(made) == 2_000
    assert [ref for ref in made if ref() is not None] == []
    assert model.requests == []
