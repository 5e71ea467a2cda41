"""``Agent.run_stream`` (``_agent/calls.py``, docs/design.md#awaitable-turns): one turn, streamed,
nothing lost."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentClosedError,
    Reply,
    SubscriberOverflowError,
    TurnFailedError,
    TurnResult,
)
from dsh_agent_loop._agent.output import FINAL_RESULT
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, turn_ends, user_texts, wait_until

WORDS = 5_000
LONG_ANSWER = " ".join(f"w{i}" for i in range(WORDS))


def echo(request: Any) -> Reply:
    last = [m for m in request.messages if m["role"] == "user"][-1]
    return Reply.text("echo " + last["content"][0]["text"])


async def test_text_deltas_and_result(autojump_clock):
    async with harness([Reply.text("one two three", reasoning="hidden thoughts")]) as h:
        async with h.agent.run_stream("count") as stream:
            deltas = [text async for text in stream.text_deltas()]
            result = await stream.result()
        assert deltas == ["one ", "two ", "three"]
        assert isinstance(result, TurnResult)
        assert result.text == "one two three"
        assert "hidden" not in "".join(deltas)
        assert result.message_id == stream.message_id
        assert h.agent.statistics().subscribers == 0  # the stream left with its block
        assert h.agent.status.value == "idle"


async def test_run_stream_with_output_type(autojump_clock):
    @attrs.frozen
    class Point:
        x: int
        y: int

    async with harness([Reply.tool_calls((FINAL_RESULT, {"x": 1, "y": 2}))]) as h:
        async with h.agent.run_stream("where?", output_type=Point) as stream:
            result = await stream.result()
        assert result.output == Point(1, 2)


async def test_a_slow_reader_of_a_5000_chunk_answer_loses_nothing(autojump_clock):
    async with harness([Reply.text(LONG_ANSWER)]) as h:
        got: list[str] = []
        async with h.agent.run_stream("talk") as stream:
            async for text in stream.text_deltas():
                got.append(text)
                await trio.sleep(1)  # far slower than the model
            result = await stream.result()
        assert len(got) == WORDS
        assert "".join(got) == LONG_ANSWER
        assert result.text == LONG_ANSWER
        assert trio.current_time() >= WORDS  # the reader really was slow


async def test_the_same_slow_reader_on_a_bounded_subscription_overflows(autojump_clock):
    # The contrast that shows the test above could fail: a bounded subscriber loses, loudly.
    async with harness([Reply.text(LONG_ANSWER)]) as h:
        got = 0
        sent: list[Any] = []
        h.rt.hooks.on("agent/assistant-stream", sent.append)

        async def read_slowly(frames: Any) -> None:
            nonlocal got
            async for _ in frames:
                got += 1
                await trio.sleep(1)

        async with h.agent.subscribe(types=["agent/assistant-stream"]) as frames:
            h.agent.followup("talk")
            with pytest.raises(SubscriberOverflowError) as caught:
                await read_slowly(frames)
        assert got == 1 + 1024  # the first frame was taken at once, then the buffer filled
        assert len(sent) > WORDS  # start, a chunk frame per chunk, end
        assert caught.value.missed == len(sent) - got


async def test_events_are_exactly_this_turns_events_and_frames(autojump_clock):
    async with harness([Reply.hang(after_text="busy"), Reply.text("mine")], latency=1.0) as h:

        async def other() -> None:
            with trio.move_on_after(10):
                await h.agent.run("before")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            async with h.agent.run_stream("my turn") as stream:
                seen = [event async for event in stream.events()]
                result = await stream.result()
        assert result.turn == 2
        committed = [e for e in seen if e.seq is not None]
        notes = [e for e in seen if e.seq is None]
        stored = h.events
        start = next(e.seq for e in stored if e.type == "turn/start" and e.data["turn"] == 2)
        end = next(e.seq for e in stored if e.type == "turn/end" and e.data["turn"] == 2)
        assert [e.seq for e in committed] == list(range(start, end + 1))
        assert committed[-1].type == "turn/end"
        assert {e.data["turn"] for e in notes} == {2}
        frames = [e.data["frame"] for e in notes if e.type == "agent/assistant-stream"]
        assert frames[0] == "start"
        assert frames[-1] == "end"


async def test_leaving_the_block_early_cancels_the_turn(autojump_clock):
    def queue_then_hang(request: Any) -> Reply:
        h.agent.send("next", wake=False)  # queued behind, with no wake of its own
        return Reply.hang(after_text="a b c")

    async with harness([queue_then_hang, echo]) as h:
        async with h.agent.run_stream("first") as stream:
            async for text in stream.text_deltas():
                if text == "b ":
                    break
        # left the block: the turn was aborted and its turn/end stored before we got here
        assert turn_ends(h.events)[0] == {"kind": "aborted", "cause": "user"}
        stored = await h.stored()
        assert [e.type for e in stored].count("turn/end") >= 1
        await h.agent.wait_idle()
        # the other queued message ran next
        assert turn_ends(h.events)[1] == {"kind": "completed"}
        assert user_texts(h.agent.session.derive_messages())[-1] == "next"
        assert_well_formed(h.events)


async def test_leaving_the_block_while_queued_removes_the_message(autojump_clock):
    async with harness([Reply.hang(after_text="busy")]) as h:
        h.agent.followup("busy work")
        await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
        async with h.agent.run_stream("never mind") as stream:
            message_id = stream.message_id
            assert [m["id"] for m in h.agent.inbox.next_turn] == [message_id]
        assert h.agent.inbox.next_turn == ()
        h.agent.cancel()
        await h.agent.wait_idle()
        assert "never mind" not in user_texts(h.agent.session.derive_messages())


async def test_result_raises_the_turn_error(autojump_clock):
    async with harness([Reply.error("AUTH", "bad key", after_text="par")]) as h:
        async with h.agent.run_stream("go") as stream:
            deltas = [text async for text in stream.text_deltas()]
            with pytest.raises(TurnFailedError) as caught:
                await stream.result()
            with pytest.raises(TurnFailedError):
                await stream.result()  # the outcome is kept
        assert deltas == ["par"]
        assert caught.value.code == "AUTH"


async def test_disposal_while_queued_ends_the_stream_and_raises_closed(autojump_clock):
    async with harness([Reply.hang()]) as h:
        h.agent.followup("busy")
        await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
        async with h.agent.run_stream("queued") as stream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(h.handle.dispose)
                seen = [event async for event in stream.events()]
            with pytest.raises(AgentClosedError):
                await stream.result()
        assert seen == []
