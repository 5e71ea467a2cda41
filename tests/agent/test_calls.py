"""``_agent/calls.py``: ``Agent.run`` and ``Agent.run_stream`` (docs/design.md#awaitable-turns)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import (
    AgentClosedError,
    PreStepDecision,
    Reply,
    Retry,
    ScriptedModel,
    ToolCallRecord,
    TurnAbortedError,
    TurnBlockedError,
    TurnError,
    TurnFailedError,
    TurnResult,
    Usage,
    tool,
)
from dsh_agent_loop._agent.calls import CALL_CANCEL_TIMEOUT
from dsh_agent_loop._agent.output import FINAL_RESULT
from dsh_agent_loop._session.writer import SessionWriter
from dsh_agent_loop.testing import actor_of, explore_cancellation

from .conftest import OPTIONS, assert_well_formed, harness, plain, turn_ends, user_texts, wait_until


def echo(request: Any) -> Reply:
    """Answer with the text of the newest user message."""
    last = [m for m in request.messages if m["role"] == "user"][-1]
    return Reply.text("echo " + last["content"][0]["text"])


def spliced(h: Any) -> list[dict[str, Any]]:
    return [plain(dict(e.data)) for e in h.of_type("agent/inbox/spliced")]


async def stored_types(h: Any) -> list[str]:
    return [e.type for e in await h.stored()]


# --- results ------------------------------------------------------------------------------------


async def test_run_returns_the_turn_result_built_from_the_stored_log(autojump_clock):
    async with harness([Reply.text("The answer is 4.", reasoning="two plus two")]) as h:
        result = await h.agent.run("2+2?")
        assert isinstance(result, TurnResult)
        assert result.turn == 1
        assert result.message_id == "m-1"
        assert result.reason == {"kind": "completed"}
        assert result.text == "The answer is 4."
        assert result.reasoning == "two plus two"  # never in .text
        assert result.output is None
        assert result.tool_calls == ()
        assert result.pending_approvals == ()
        assert [m["role"] for m in result.messages] == ["user", "assistant"]
        assert user_texts(result.messages) == ["2+2?"]
        assert result.usage.requests == 1
        assert result.usage.output_tokens > 0
        # turn/end was stored before run() returned
        assert (await stored_types(h))[-1] == "turn/end"


async def test_text_is_the_last_assistant_message_and_tool_calls_are_in_model_order(
    autojump_clock,
):
    @tool
    async def weather(city: str) -> str:
        """Weather of a city."""
        return f"sunny in {city}"

    @tool
    async def broken(x: int) -> str:
        """Always fails."""
        raise RuntimeError("boom")

    replies = [
        Reply.tool_calls(
            ("weather", {"city": "Paris"}, "c-1"),
            ("broken", {"x": 1}, "c-2"),
            ("weather", '{"city": ', "c-3"),
            text="let me look",
        ),
        Reply.text("Sunny.", reasoning="the tool said so"),
    ]
    async with harness(replies, tools=[weather, broken]) as h:
        result = await h.agent.run("weather?")
        assert result.text == "Sunny."
        assert result.reasoning == "the tool said so"
        first, second, third = result.tool_calls
        assert first == ToolCallRecord("c-1", "weather", {"city": "Paris"}, "sunny in Paris", None)
        assert (second.call_id, second.name, second.arguments) == ("c-2", "broken", {"x": 1})
        assert second.error == "TOOL_ERROR"
        assert "boom" in (second.content or "")
        assert third.arguments == '{"city": '  # not JSON: the raw text
        assert third.error == "INVALID_ARGUMENTS"
        roles = [m["role"] for m in result.messages]
        assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"]
        assert result.usage.requests == 2


async def test_usage_is_summed_over_every_attempt_of_the_turn(autojump_clock):
    @tool
    async def noop() -> str:
        """Does nothing."""
        return "ok"

    async def retry(payload: Any, next: Any) -> Retry:
        return Retry(delay=0)

    replies = [
        Reply.error("HTTP_5XX", "bad gateway"),
        attrs.evolve(Reply.tool_calls(("noop", {})), usage=Usage(10, 2, cache_read_tokens=4)),
        Reply.text("done", usage=Usage(20, 3, reasoning_tokens=1)),
    ]
    async with harness(replies, tools=[noop]) as h:
        h.rt.hooks.waterfall("agent/request-error", retry)
        result = await h.agent.run("go")
        assert result.usage == Usage(
            input_tokens=30,
            output_tokens=5,
            cache_read_tokens=4,
            reasoning_tokens=1,
            requests=3,  # the failed attempt counts as a request
        )


async def test_max_tokens_returns_normally(autojump_clock):
    async with harness([Reply.max_tokens("cut sho")]) as h:
        result = await h.agent.run("go")
        assert result.reason == {"kind": "max-tokens"}
        assert result.text == "cut sho"


async def test_concurrent_runs_each_get_their_own_turn(autojump_clock):
    async with harness(model=None, latency=1.0, replies=[echo, echo, echo]) as h:
        results: dict[str, TurnResult] = {}

        async def ask(text: str) -> None:
            results[text] = await h.agent.run(text)

        async with trio.open_nursery() as nursery:
            for text in ("a", "b", "c"):
                nursery.start_soon(ask, text)
        assert {t: r.text for t, r in results.items()} == {
            "a": "echo a",
            "b": "echo b",
            "c": "echo c",
        }
        assert sorted(r.turn for r in results.values()) == [1, 2, 3]
        for text, result in results.items():
            assert user_texts(result.messages) == [text]
        assert len({r.message_id for r in results.values()}) == 3
        assert_well_formed(h.events)


async def test_a_given_message_id_is_used(autojump_clock):
    async with harness([Reply.text("ok")]) as h:
        result = await h.agent.run("go", message_id="mine")
        assert result.message_id == "mine"
        assert user_texts(result.messages) == ["go"]


async def test_a_turn_awaiting_approval_returns_with_the_pending_calls(autojump_clock):
    @tool(requires_approval=True)
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    replies = [Reply.tool_calls(("delete", {"path": "/tmp/x"}, "c-1")), Reply.text("Deleted.")]
    async with harness(replies, tools=[delete]) as h:
        result = await h.agent.run("clean up")
        assert result.reason["kind"] == "awaiting-approval"
        assert [(r.call_id, r.name) for r in result.pending_approvals] == [("c-1", "delete")]
        after = await h.agent.resolve_approvals({"c-1": True})
        assert after.text == "Deleted."
        assert after.pending_approvals == ()


async def test_each_run_follows_its_own_message_when_the_inbox_is_reordered(autojump_clock):
    async with harness([Reply.hang(after_text="busy"), echo, echo]) as h:
        results: dict[str, TurnResult | TurnAbortedError] = {}

        async def ask(text: str) -> None:
            try:
                results[text] = await h.agent.run(text)
            except TurnAbortedError as exc:
                results[text] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "plain")  # turn 1, hangs
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            nursery.start_soon(ask, "a")
            await wait_until(lambda: len(h.agent.inbox.next_turn) == 1)
            nursery.start_soon(ask, "b")
            await wait_until(lambda: len(h.agent.inbox.next_turn) == 2)
            first, second = h.agent.inbox.next_turn
            h.agent.inbox.splice("next-turn", 0, 2, (second, first))  # b now runs before a
            actor_of(h.agent).abort_turn(1)
        assert isinstance(results["plain"], TurnAbortedError)
        assert (results["b"].turn, results["b"].text) == (2, "echo b")
        assert (results["a"].turn, results["a"].text) == (3, "echo a")


# --- errors -------------------------------------------------------------------------------------


async def test_a_failed_turn_raises_turn_failed_error_with_code_and_result(autojump_clock):
    async with harness([Reply.error("AUTH", "bad key", after_text="par")]) as h:
        with pytest.raises(TurnFailedError) as caught:
            await h.agent.run("go")
        error = caught.value
        assert isinstance(error, TurnError)
        assert error.code == "AUTH"
        assert error.result.reason["kind"] == "error"
        assert error.result.reason["error"]["code"] == "AUTH"
        assert error.result.usage.requests == 1
        assert "bad key" in str(error)


async def test_a_blocked_turn_raises_turn_blocked_error(autojump_clock):
    async def reject(payload: Any, next: Any) -> PreStepDecision:
        return PreStepDecision.reject("no")

    async with harness([Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/pre-step", reject)
        with pytest.raises(TurnBlockedError) as caught:
            await h.agent.run("go")
        assert caught.value.code == "TURN_BLOCKED"
        assert caught.value.result.reason == {"kind": "blocked"}
        assert h.model.requests == []


async def test_an_abort_by_someone_else_raises_turn_aborted_error(autojump_clock):
    async with harness([Reply.hang(after_text="partial")]) as h:

        async def cancel_later() -> None:
            await trio.sleep(5)
            h.agent.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_later)
            with pytest.raises(TurnAbortedError) as caught:
                await h.agent.run("go")
        result = caught.value.result
        assert result.reason == {"kind": "aborted", "cause": "user"}
        assert result.text == "partial"  # the interrupted anchor: what the user saw
        assert trio.current_time() == 5.0
        assert (await stored_types(h))[-1] == "turn/end"


async def test_run_on_a_disposed_agent_raises_agent_closed(autojump_clock):
    async with harness([Reply.text("x")]) as h:
        await h.handle.dispose()
        with pytest.raises(AgentClosedError):
            await h.agent.run("go")


async def test_disposal_ends_the_running_call_aborted_and_the_queued_one_closed(autojump_clock):
    async with harness([Reply.hang(after_text="partial")]) as h:
        outcomes: dict[str, BaseException] = {}

        async def ask(text: str) -> None:
            try:
                await h.agent.run(text)
            except Exception as exc:
                outcomes[text] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "first")
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            nursery.start_soon(ask, "second")
            await trio.sleep(1)
            await h.handle.dispose()
        assert isinstance(outcomes["first"], TurnAbortedError)
        assert outcomes["first"].result.reason["cause"] == "disposed"
        assert isinstance(outcomes["second"], AgentClosedError)
        assert [m["content"][0]["text"] for m in h.agent.inbox.next_turn] == ["second"]


async def test_a_queued_message_discarded_by_someone_else_raises_aborted(autojump_clock):
    async with harness([Reply.hang(after_text="busy")]) as h:
        outcomes: dict[str, BaseException] = {}

        async def ask(text: str) -> None:
            try:
                await h.agent.run(text)
            except TurnAbortedError as exc:
                outcomes[text] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "first")
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            nursery.start_soon(ask, "second")
            await wait_until(lambda: len(h.agent.inbox.next_turn) == 1)
            h.agent.cancel()  # aborts turn 1 and clears the inbox
        assert outcomes["first"].result is not None
        assert outcomes["first"].result.reason == {"kind": "aborted", "cause": "user"}
        assert outcomes["second"].result is None  # no turn ever ran it
        assert "removed from the inbox" in str(outcomes["second"])


# --- the caller's cancellation is the turn's ----------------------------------------------------


async def test_cancel_while_queued_removes_the_message(autojump_clock):
    async with harness([Reply.hang(after_text="busy"), echo], latency=1.0) as h:
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                with trio.move_on_after(50):
                    await h.agent.run("first")

            nursery.start_soon(first)
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            with trio.move_on_after(5) as scope:
                await h.agent.run("second")
            assert scope.cancelled_caught
            assert h.agent.inbox.next_turn == ()
            removal = spliced(h)[-1]
            assert removal["outcome"] == "canceled"
            assert removal["target"] == "next-turn"
        # the queued message never ran: only "first" was ever a user message
        assert user_texts(h.agent.session.derive_messages()) == ["first"]
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        assert_well_formed(h.events)


async def test_cancel_while_running_aborts_that_turn_and_the_next_queued_runs(autojump_clock):
    async with harness([Reply.hang(after_text="slow"), echo]) as h:
        done_at: list[float] = []
        stored_when_cancelled: list[str] = []
        second: list[TurnResult] = []

        async def first() -> None:
            with trio.move_on_after(5) as scope:
                await h.agent.run("first")
            assert scope.cancelled_caught
            done_at.append(trio.current_time())
            stored_when_cancelled.extend(await stored_types(h))

        async def queued() -> None:
            second.append(await h.agent.run("second"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await wait_until(lambda: actor_of(h.agent).log.state.turn == 1)
            nursery.start_soon(queued)
        assert done_at == [5.0]
        # Cancelled propagated only after the aborted turn's turn/end was stored
        assert "turn/end" in stored_when_cancelled
        ends = turn_ends(h.events)
        assert ends == [{"kind": "aborted", "cause": "user"}, {"kind": "completed"}]
        assert second[0].text == "echo second"
        assert second[0].turn == 2
        assert_well_formed(h.events)


async def test_a_cancelled_run_waits_shielded_but_bounded_for_turn_end(autojump_clock, monkeypatch):
    async def never(self: Any) -> None:
        await trio.sleep_forever()

    async with harness([Reply.hang()]) as h:
        with trio.move_on_after(1) as scope:
            monkeypatch.setattr(SessionWriter, "flush", never)  # nothing commits any more
            await h.agent.run("go")
        monkeypatch.undo()
        assert scope.cancelled_caught
        # it waited past its cancel (shielded), and gave up after CALL_CANCEL_TIMEOUT
        assert trio.current_time() == 1 + CALL_CANCEL_TIMEOUT
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]


async def test_a_message_queued_without_wake_runs_after_the_cancelled_turn(autojump_clock):
    def queue_then_hang(request: Any) -> Reply:
        h.agent.send("queued earlier", wake=False)  # the run's own wake is spent by now
        return Reply.hang(after_text="slow")

    async with harness([queue_then_hang, echo]) as h:
        with trio.move_on_after(5):
            await h.agent.run("first")
        await h.agent.wait_idle()
        ends = turn_ends(h.events)
        assert ends == [{"kind": "aborted", "cause": "user"}, {"kind": "completed"}]
        assert user_texts(h.agent.session.derive_messages())[-1] == "queued earlier"
        assert_well_formed(h.events)


async def _run_one_prompt(rt: Any) -> None:
    h = await rt.agents.create(options=OPTIONS)
    aborted: TurnAbortedError | None = None
    try:
        result = await h.agent.run("go")
    except TurnAbortedError as exc:  # the explorer's cancel landed inside the turn
        aborted = exc
    if aborted is not None:
        assert aborted.result is not None
        assert aborted.result.reason["kind"] == "aborted"
    else:
        assert result.text == "Hello there, friend"
        assert result.reasoning == "think it over"
    assert h.agent.status.value == "idle"  # the driver finished the turn before run() returned


def test_run_is_well_formed_at_every_cancel_point():
    def providers() -> dict[str, Any]:
        return {
            "scripted": ScriptedModel(
                [Reply.text("Hello there, friend", reasoning="think it over")]
            )
        }

    report = explore_cancellation(_run_one_prompt, providers=providers, seed=1)
    assert report.failures == []
    # 7 when the store commits inline (the closing flush then parks no task; writer.py)
    assert report.runs == report.checkpoints >= 7


# --- structured output (_agent/output.py) --------------------------------------------------------


@attrs.frozen
class City:
    name: str
    population: int


async def test_run_with_output_type_returns_the_structured_value(autojump_clock):
    replies = [
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": "many"})),
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 709_000})),
    ]
    async with harness(replies) as h:
        result = await h.agent.run("biggest city?", output_type=City)
        assert result.output == City("Oslo", 709_000)
        assert [c.error for c in result.tool_calls] == ["INVALID_ARGUMENTS", None]


async def test_output_retries_used_up_raise_with_the_code(autojump_clock):
    async with harness([Reply.text("plain"), Reply.text("still plain")]) as h:
        with pytest.raises(TurnFailedError) as caught:
            await h.agent.run("go", output_type=City, output_retries=0)
        assert caught.value.code == "NO_STRUCTURED_OUTPUT"
        assert caught.value.result.output is None
