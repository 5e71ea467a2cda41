"""``_agent/subscription.py``: a subscriber that falls behind is told, never cut off silently."""

from __future__ import annotations

import math

import pytest
import trio

from dsh_agent_loop import Reply, SubscriberOverflowError
from dsh_agent_loop._agent.subscription import Subscriber, Subscription
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.events import Event, make_event

from .conftest import harness


def note(kind: str, n: int = 0) -> Event:
    return make_event(kind, None, 0.0, FrozenDict(n=n))


def subscription(max_buffer: float, types: frozenset[str] | None = None, **kwargs):
    send, recv = trio.open_memory_channel[Event](max_buffer)
    sub = Subscriber(send, types, max_buffer, **kwargs)
    return sub, Subscription(recv, sub)


# --- sans agent ---------------------------------------------------------------------------------


async def test_buffered_events_then_the_overflow_error_with_the_count():
    sub, channel = subscription(2)
    for n in range(5):
        assert sub.offer(note("x", n)) is True
    assert sub.missed == 3
    assert [channel.receive_nowait().data["n"], (await channel.receive()).data["n"]] == [0, 1]
    with pytest.raises(SubscriberOverflowError) as caught:
        await channel.receive()
    assert caught.value.missed == 3
    assert caught.value.code == "SUBSCRIBER_OVERFLOW"
    assert "missed 3" in str(caught.value)
    with pytest.raises(SubscriberOverflowError):  # again on every later receive
        channel.receive_nowait()


async def test_async_for_ends_with_the_error_not_a_clean_end():
    sub, channel = subscription(1)
    for n in range(3):
        sub.offer(note("x", n))
    got = []
    with pytest.raises(SubscriberOverflowError):  # noqa: PT012 (the loop is what is tested)
        async for event in channel:
            got.append(event.data["n"])
    assert got == [0]


async def test_filtered_out_events_are_not_counted_as_missed():
    sub, _ = subscription(1, frozenset({"x"}))
    sub.offer(note("x"))
    sub.offer(note("x"))
    sub.offer(note("y"))
    sub.offer(note("x"))
    assert sub.missed == 2


async def test_the_agent_drops_the_subscriber_once_the_reader_saw_the_overflow():
    sub, channel = subscription(0)
    sub.offer(note("x"))
    assert sub.offer(note("x")) is True  # still counting
    with pytest.raises(SubscriberOverflowError):
        channel.receive_nowait()
    assert sub.offer(note("x")) is False


async def test_closing_the_sender_is_a_clean_end():
    sub, channel = subscription(math.inf)
    sub.offer(note("x"))
    channel.close_sender()
    assert channel.receive_nowait().type == "x"
    with pytest.raises(trio.EndOfChannel):
        await channel.receive()
    assert channel.missed == 0


async def test_a_closed_reader_is_dropped():
    sub, channel = subscription(4)
    await channel.aclose()
    assert sub.offer(note("x")) is False


async def test_accept_filters_before_delivery():
    sub, channel = subscription(4, accept=lambda e: e.data["n"] % 2 == 0)
    for n in range(4):
        sub.offer(note("x", n))
    assert channel.statistics().current_buffer_used == 2


# --- through an agent ---------------------------------------------------------------------------


async def test_a_slow_subscriber_gets_the_buffer_then_the_count(autojump_clock):
    async with harness([Reply.text("one two three four five six seven eight")]) as h:
        frames: list[Event] = []
        h.rt.hooks.on("agent/assistant-stream", frames.append)
        async with h.agent.subscribe(types=["agent/assistant-stream"], max_buffer=3) as recv:
            await h.run("go")
            received = [recv.receive_nowait() for _ in range(3)]
            with pytest.raises(SubscriberOverflowError) as caught:
                await recv.receive()
        assert [e.data for e in received] == [e.data for e in frames[:3]]
        assert caught.value.missed == len(frames) - 3
        assert h.agent.statistics().subscribers == 0


async def test_a_subscriber_that_keeps_up_loses_nothing(autojump_clock):
    async with harness([Reply.text("one two three four five six seven eight")]) as h:
        got: list[Event] = []
        async with h.agent.subscribe(types=["turn/end"], max_buffer=1) as recv:
            h.agent.followup("go")
            got.append(await recv.receive())
        assert got[0].type == "turn/end"
