"""Attempt failures and retry (docs/design.md#failures-and-retry): the request-error hook and the
default policy."""

from __future__ import annotations

import random

import pytest
import trio

from dsh_agent_loop import AgentOptions, Reply, Retry

from .conftest import assert_well_formed, harness, plain, turn_ends, user_texts


def backoff(seed: int, retries: int) -> list[float]:
    """The default policy's delays before attempts 2..retries+1 (one draw per retry)."""
    rng = random.Random(seed)
    return [min(8.0, 0.5 * 2 ** (n - 1)) * (1 + 0.25 * rng.random()) for n in range(1, retries + 1)]


def cumulative(delays: list[float]) -> list[float]:
    out, now = [0.0], 0.0
    for d in delays:
        now += d
        out.append(now)
    return out


async def test_retry_through_the_request_error_hook(autojump_clock):
    offered = []

    async def retry_once(payload, next):
        offered.append(payload)
        return Retry(delay=0)

    replies = [Reply.error("HTTP_4XX", "bad request", after_text="par tial"), Reply.text("whole")]
    async with harness(replies) as h:
        h.rt.hooks.waterfall("agent/request-error", retry_once)
        await h.run("go")
        assert h.types()[4:] == [
            "step/start",
            "system/message",
            "user/message",
            "request/header",
            "request/context",
            "assistant/attempt",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        (attempt,) = h.of_type("assistant/attempt")
        assert plain(attempt.data["stream"]) == {"attempt": 1, "text": "par tial"}
        assert plain(attempt.data["failure"]) == {"code": "HTTP_4XX", "message": "bad request"}
        (answer,) = h.of_type("assistant/message")
        assert answer.data["stream"]["attempt"] == 2
        (payload,) = offered
        assert (payload["turn"], payload["step"], payload["attempt"]) == (1, 1, 1)
        assert payload["provider"] == "scripted"
        assert payload["failure"].code == "HTTP_4XX"
        # what the failed attempt delivered never reaches the model
        assert [m["role"] for m in h.model.requests[1].messages] == ["user"]
        assert h.model.requests[1].messages == h.model.requests[0].messages
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert_well_formed(h.events)


@pytest.mark.parametrize("seed", [0, 7, 12345])
async def test_default_policy_backs_off_exactly_and_stops_after_five_attempts(autojump_clock, seed):
    replies = [Reply.error("HTTP_5XX", "bad gateway", status=502) for _ in range(6)]
    async with harness(replies, seed=seed) as h:
        await h.run("go")
        attempts = h.of_type("assistant/attempt")
        assert len(attempts) == 5
        assert len(h.model.requests) == 5
        assert [a.data["stream"]["attempt"] for a in attempts] == [1, 2, 3, 4, 5]
        expected = cumulative(backoff(seed, 4))
        assert [a.time for a in attempts] == pytest.approx(expected, rel=1e-12, abs=1e-12)
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "HTTP_5XX"
        assert h.of_type("turn/end")[0].time == pytest.approx(expected[-1])
        assert_well_formed(h.events)


def test_default_backoff_is_capped_at_eight_seconds_before_jitter():
    # min(8, 0.5 * 2**(n-1)): 0.5, 1, 2, 4, 8, 8 ... times (1 + 0.25u), u in [0, 1)
    from dsh_agent_loop._agent.request import default_retry_delay
    from dsh_agent_loop.llm._base import Failure

    failure = Failure("HTTP_5XX", "x")
    rng = random.Random(3)
    ref = random.Random(3)
    for attempt in range(1, 5):
        base = min(8.0, 0.5 * 2 ** (attempt - 1))
        assert default_retry_delay(failure, attempt, rng) == base * (1 + 0.25 * ref.random())
    assert default_retry_delay(failure, 5, rng) is None


async def test_a_transient_failure_then_success(autojump_clock):
    replies = [Reply.error("HTTP_5XX", "overloaded", after_text="half"), Reply.text("ok")]
    async with harness(replies, seed=42) as h:
        await h.run("go")
        (attempt,) = h.of_type("assistant/attempt")
        (answer,) = h.of_type("assistant/message")
        assert answer.time == pytest.approx(backoff(42, 1)[0])
        assert answer.data["message"]["content"][0]["text"] == "ok"
        assert attempt.data["stream"]["text"] == "half"
        assert len(h.of_type("user/message")) == 1
        assert len(h.of_type("system/message")) == 1
        assert len(h.of_type("request/header")) == 1
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert_well_formed(h.events)


@pytest.mark.parametrize("code", ["HTTP_429", "HTTP_5XX", "TIMEOUT", "CONNECTION", "STREAM_CUT"])
async def test_transient_codes_are_retried(autojump_clock, code):
    async with harness([Reply.error(code, "transient"), Reply.text("ok")], seed=1) as h:
        await h.run("go")
        assert len(h.model.requests) == 2
        assert turn_ends(h.events) == [{"kind": "completed"}]


@pytest.mark.parametrize("code", ["HTTP_4XX", "AUTH", "BAD_STREAM", "PROVIDER_ERROR"])
async def test_other_codes_are_not_retried(autojump_clock, code):
    async with harness([Reply.error(code, "permanent"), Reply.text("never")], seed=1) as h:
        await h.run("go")
        assert len(h.model.requests) == 1
        (end,) = turn_ends(h.events)
        assert end == {"kind": "error", "error": {"code": code, "message": "permanent"}}
        assert h.of_type("turn/end")[0].time == 0.0
        assert_well_formed(h.events)


@pytest.mark.parametrize(("retry_after", "waited"), [(7, 7.0), (0.25, 0.25), (120, 60.0)])
async def test_retry_after_is_honoured_and_capped(autojump_clock, retry_after, waited):
    replies = [
        Reply.error("HTTP_429", "slow down", status=429, retry_after=retry_after),
        Reply.text("ok"),
    ]
    async with harness(replies, seed=1) as h:
        await h.run("go")
        (attempt,) = h.of_type("assistant/attempt")
        assert attempt.data["failure"]["retry_after"] == retry_after
        assert attempt.data["failure"]["status"] == 429
        assert h.of_type("assistant/message")[0].time == pytest.approx(waited)


async def test_user_retries_count_toward_the_five_attempts(autojump_clock):
    async def always(payload, next):
        return Retry(delay=1)

    async with harness([Reply.error("HTTP_4XX", "no") for _ in range(8)]) as h:
        h.rt.hooks.waterfall("agent/request-error", always)
        await h.run("go")
        assert len(h.model.requests) == 5
        assert [a.time for a in h.of_type("assistant/attempt")] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert turn_ends(h.events)[0]["error"]["code"] == "HTTP_4XX"


async def test_the_default_policy_is_the_innermost_listener(autojump_clock):
    seen = []

    async def observe(payload, next):
        result = await next(payload)
        seen.append((payload["attempt"], result))
        return result

    async with harness(
        [Reply.error("HTTP_5XX", "x"), Reply.error("AUTH", "key"), Reply.text("never")], seed=5
    ) as h:
        h.rt.hooks.waterfall("agent/request-error", observe)
        await h.run("go")
        assert seen == [(1, Retry(backoff(5, 1)[0])), (2, None)]
        assert turn_ends(h.events)[0]["error"]["code"] == "AUTH"


async def test_a_listener_that_does_not_call_next_stops_the_default_policy(autojump_clock):
    async def give_up(payload, next):
        return None

    async with harness([Reply.error("HTTP_5XX", "x"), Reply.text("never")]) as h:
        h.rt.hooks.waterfall("agent/request-error", give_up)
        await h.run("go")
        assert len(h.model.requests) == 1
        assert turn_ends(h.events)[0]["error"]["code"] == "HTTP_5XX"


async def test_no_adapter_is_an_attempt_failure_and_users_are_still_recorded(autojump_clock):
    frames = []

    async def unrouted(payload, next):  # create() refuses an unregistered provider
        return await next({**payload, "config": {**payload["config"], "provider": "nowhere"}})

    async with harness([]) as h:
        h.rt.hooks.waterfall("agent/request", unrouted)
        h.rt.hooks.on("agent/assistant-stream", frames.append)
        await h.run("hello?")
        assert h.types() == [
            "session/end-seed",
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "assistant/attempt",
            "step/end",
            "user/message",
            "turn/end",
        ]
        (attempt,) = h.of_type("assistant/attempt")
        assert attempt.data["failure"]["code"] == "NO_ADAPTER"
        assert frames == []  # no stream was obtained
        assert turn_ends(h.events)[0]["error"]["code"] == "NO_ADAPTER"
        assert user_texts([e.data["message"] for e in h.of_type("user/message")]) == ["hello?"]
        assert_well_formed(h.events)


async def test_a_missing_model_is_a_clear_attempt_failure(autojump_clock):
    options = AgentOptions(id="main", provider="scripted")
    async with harness([Reply.text("never")], options=options) as h:
        await h.run("go")
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert "model" in end["error"]["message"]
        assert h.model.requests == []


async def test_a_retry_reruns_the_request_hook_but_not_pre_step(autojump_clock):
    counts = {"pre-step": 0, "request": 0}

    async def pre_step(payload, next):
        counts["pre-step"] += 1
        return await next(payload)

    async def request(payload, next):
        counts["request"] += 1
        return await next(payload)

    async with harness([Reply.error("TIMEOUT", "slow"), Reply.text("ok")], seed=2) as h:
        h.rt.hooks.waterfall("agent/pre-step", pre_step)
        h.rt.hooks.waterfall("agent/request", request)
        await h.run("go")
        assert counts == {"pre-step": 1, "request": 2}
        assert len(h.of_type("user/message")) == 1


async def test_script_exhausted_is_an_error_not_a_hang(autojump_clock):
    async with harness([]) as h:
        await h.run("go")
        assert turn_ends(h.events)[0]["error"]["code"] == "SCRIPT_EXHAUSTED"
        assert trio.current_time() == 0.0


async def test_stream_frames_per_attempt(autojump_clock):
    frames = []

    async def retry(payload, next):
        return Retry(0)

    async with harness([Reply.error("HTTP_4XX", "x", after_text="a b"), Reply.text("c")]) as h:
        h.rt.hooks.waterfall("agent/request-error", retry)
        h.rt.hooks.on("agent/assistant-stream", lambda e: frames.append(plain(e.data)))
        await h.run("go")
        ends = [f for f in frames if f["frame"] in ("start", "end")]
        assert [(f["frame"], f["attempt"], f.get("outcome")) for f in ends] == [
            ("start", 1, None),
            ("end", 1, "abandoned"),
            ("start", 2, None),
            ("end", 2, "committed"),
        ]
        assert ends[-1]["seq"] == h.of_type("assistant/message")[0].seq
        assert all(f["turn"] == 1 and f["step"] == 1 for f in frames)


async def test_an_attempt_failure_before_streaming_is_offered_to_the_hook(autojump_clock):
    from dsh_agent_loop import ScriptedModel

    late = ScriptedModel([Reply.text("routed now")])
    offered = []

    async def register_and_retry(payload, next):
        offered.append(payload["failure"].code)
        h.rt.router.register("late", late)
        return Retry(0)

    async def to_late(payload, next):  # create() refuses an unregistered provider
        return await next({**payload, "config": {**payload["config"], "provider": "late"}})

    async with harness([]) as h:
        h.rt.hooks.waterfall("agent/request", to_late)
        h.rt.hooks.waterfall("agent/request-error", register_and_retry)
        await h.run("go")
        assert offered == ["NO_ADAPTER"]
        assert [e.type for e in h.of_type("assistant/attempt", "assistant/message")] == [
            "assistant/attempt",
            "assistant/message",
        ]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert len(h.of_type("user/message")) == 1
        assert_well_formed(h.events)
