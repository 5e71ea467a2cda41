"""The default retry policy's timing (docs/design.md#retry-policy), measured in virtual time.

The openai adapter runs on ``httpx.MockTransport`` (in-process, no sockets), so a whole agent turn
runs under trio's autojump ``MockClock``: every backoff sleep is exact and instant. The handler
records ``trio.current_time()`` at each request, so the gaps between requests are the delays.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Retry, open_runtime, tool
from dsh_agent_loop.llm._openai import OpenAIAdapter

from .agent_helpers import (
    DONE,
    KEY_ENV,
    assert_well_formed,
    oai,
    oai_call,
    oai_text,
    of_type,
    plain,
    turn_ends,
    types,
)

SSE = {"content-type": "text/event-stream"}
Respond = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-mock")


def ok_response(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers=SSE, content=b"".join(oai_text("Done.")))


def status(code: int, *headers: tuple[str, str], message: str = "nope") -> Respond:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, headers=dict(headers), json={"error": {"message": message}})

    return respond


def raising(exc_type: type[httpx.TransportError]) -> Respond:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc_type("simulated", request=request)

    return respond


def tool_call_response(request: httpx.Request) -> httpx.Response:
    call = oai_call(0, "call_1", "ping", "{}")
    return httpx.Response(200, headers=SSE, content=call + oai({}, "tool_calls") + DONE)


@tool
async def ping() -> str:
    """Answer pong."""
    return "pong"


def cut_stream(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers=SSE, content=oai({"content": "par"}))


def not_sse(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html>hi</html>")


def malformed(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers=SSE, content=b"data: {broken\n\n")


@attrs.define
class Script:
    """The mock provider: one response per request, in order (the last repeats)."""

    responses: list[Respond]
    times: list[float] = attrs.Factory(list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(trio.current_time())
        respond = self.responses[min(len(self.times), len(self.responses)) - 1]
        return respond(request)

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


@attrs.define
class Mocked:
    rt: Any
    agent: Any
    script: Script

    @property
    def events(self) -> list[Any]:
        return list(self.agent.session.events)

    async def run(self, message: str = "go") -> None:
        self.agent.followup(message)
        await self.agent.wait_idle()


@asynccontextmanager
async def mocked(*responses: Respond, seed: int = 0, tools: Any = ()) -> AsyncIterator[Mocked]:
    script = Script(list(responses))
    adapter = OpenAIAdapter(
        "live",
        base_url="http://mock.invalid/v1",
        api_key_env=KEY_ENV,
        transport=httpx.MockTransport(script),
    )
    async with open_runtime(
        store=MemoryStore(),
        providers={"live": adapter},
        tools=tools,
        seed=seed,
        clock=trio.current_time,
    ) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="main", provider="live", model="gpt-4o")
        )
        yield Mocked(rt, handle.agent, script)


def backoff(seed: int, retries: int) -> list[float]:
    """The default delays before attempts 2..retries+1: one draw of ``u`` per retry, in order."""
    rng = random.Random(seed)
    return [min(8.0, 0.5 * 2 ** (n - 1)) * (1 + 0.25 * rng.random()) for n in range(1, retries + 1)]


EXACT = {"rel": 1e-12, "abs": 1e-9}


@pytest.mark.parametrize("seed", [0, 7, 2024])
async def test_backoff_is_exact_and_seeded(autojump_clock: Any, seed: int) -> None:
    server_error = status(500, message="internal")
    async with mocked(*[server_error] * 4, ok_response, seed=seed) as m:
        await m.run()
        assert len(m.script.times) == 5
        assert m.script.gaps == pytest.approx(backoff(seed, 4), **EXACT)
        attempts = of_type(m.events, "assistant/attempt")
        assert [a.data["stream"]["attempt"] for a in attempts] == [1, 2, 3, 4]
        assert [a.data["failure"]["code"] for a in attempts] == ["HTTP_5XX"] * 4
        assert [a.time for a in attempts] == pytest.approx(m.script.times[:4], **EXACT)
        (answer,) = of_type(m.events, "assistant/message")
        assert answer.data["stream"]["attempt"] == 5
        assert answer.time == pytest.approx(m.script.times[4], **EXACT)
        assert turn_ends(m.events) == [{"kind": "completed"}]
        assert_well_formed(m.events)


async def test_different_seeds_jitter_differently(autojump_clock: Any) -> None:
    gaps = []
    for seed in (1, 2):
        async with mocked(status(502), ok_response, seed=seed) as m:
            await m.run()
            gaps.append(m.script.gaps[0])
    assert gaps[0] != gaps[1]
    assert all(0.5 <= g <= 0.625 for g in gaps)


@pytest.mark.parametrize(
    ("respond", "code"),
    [
        (status(429, message="slow down"), "HTTP_429"),
        (status(503), "HTTP_5XX"),
        (status(529), "HTTP_5XX"),
        (raising(httpx.ConnectError), "CONNECTION"),
        (raising(httpx.ConnectTimeout), "TIMEOUT"),
        (raising(httpx.ReadTimeout), "TIMEOUT"),
        (cut_stream, "STREAM_CUT"),
    ],
)
async def test_transient_codes_are_retried_after_the_backoff(
    autojump_clock: Any, respond: Respond, code: str
) -> None:
    async with mocked(respond, ok_response, seed=3) as m:
        await m.run()
        (attempt,) = of_type(m.events, "assistant/attempt")
        assert attempt.data["failure"]["code"] == code
        assert m.script.gaps == pytest.approx(backoff(3, 1), **EXACT)
        assert turn_ends(m.events) == [{"kind": "completed"}]
        assert_well_formed(m.events)


async def test_retry_after_seconds_is_honoured(autojump_clock: Any) -> None:
    async with mocked(status(503, ("retry-after", "3")), ok_response) as m:
        await m.run()
        assert m.script.gaps == [3.0]
        (attempt,) = of_type(m.events, "assistant/attempt")
        assert plain(attempt.data["failure"]) == {
            "code": "HTTP_5XX",
            "message": "HTTP 503: nope",
            "status": 503,
            "retry_after": 3.0,
        }
        assert turn_ends(m.events) == [{"kind": "completed"}]


async def test_retry_after_does_not_consume_a_jitter_draw(autojump_clock: Any) -> None:
    # 429 with Retry-After, then a 500 without: the second delay uses the first draw of u.
    async with mocked(status(429, ("retry-after", "3")), status(500), ok_response, seed=11) as m:
        await m.run()
        u = random.Random(11).random()
        assert m.script.gaps == pytest.approx([3.0, 1.0 * (1 + 0.25 * u)], **EXACT)


async def test_retry_after_http_date_is_honoured(autojump_clock: Any) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    async with mocked(status(429, ("retry-after", when)), ok_response) as m:
        await m.run()
        (attempt,) = of_type(m.events, "assistant/attempt")
        retry_after = attempt.data["failure"]["retry_after"]
        assert 28.0 <= retry_after <= 30.0
        assert m.script.gaps == pytest.approx([retry_after], **EXACT)


@pytest.mark.parametrize(
    "value",
    ["3600", "61", email.utils.formatdate(time.time() + 7200, usegmt=True)],
)
async def test_retry_after_above_sixty_is_capped(autojump_clock: Any, value: str) -> None:
    async with mocked(status(503, ("retry-after", value)), ok_response) as m:
        await m.run()
        assert m.script.gaps == [60.0]
        assert turn_ends(m.events) == [{"kind": "completed"}]


async def test_at_most_five_attempts_then_the_turn_ends_error(autojump_clock: Any) -> None:
    async with mocked(status(500, message="still broken"), seed=5) as m:
        await m.run()
        assert len(m.script.times) == 5
        assert m.script.gaps == pytest.approx(backoff(5, 4), **EXACT)
        attempts = of_type(m.events, "assistant/attempt")
        assert [a.data["stream"]["attempt"] for a in attempts] == [1, 2, 3, 4, 5]
        assert of_type(m.events, "assistant/message") == []
        (end,) = turn_ends(m.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "HTTP_5XX"
        assert "still broken" in end["error"]["message"]
        await trio.sleep(120)
        assert len(m.script.times) == 5  # nothing further
        assert_well_formed(m.events)


@pytest.mark.parametrize(
    ("respond", "code"),
    [
        (status(400, message="bad request"), "HTTP_4XX"),
        (status(404, message="no such model"), "HTTP_4XX"),
        (status(401, message="bad key"), "AUTH"),
        (status(403, message="forbidden"), "AUTH"),
        (not_sse, "BAD_STREAM"),
        (malformed, "BAD_STREAM"),
    ],
)
async def test_other_codes_are_not_retried(
    autojump_clock: Any, respond: Respond, code: str
) -> None:
    async with mocked(respond, ok_response) as m:
        await m.run()
        await trio.sleep(120)
        assert len(m.script.times) == 1
        (attempt,) = of_type(m.events, "assistant/attempt")
        assert attempt.data["failure"]["code"] == code
        (end,) = turn_ends(m.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == code
        assert_well_formed(m.events)


async def test_missing_key_is_not_retried(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    async with mocked(ok_response) as m:
        await m.run()
        await trio.sleep(120)
        assert m.script.times == []
        (attempt,) = of_type(m.events, "assistant/attempt")
        assert attempt.data["failure"]["code"] == "AUTH"
        assert KEY_ENV in attempt.data["failure"]["message"]
        assert turn_ends(m.events)[0]["error"]["code"] == "AUTH"


async def test_user_listener_runs_before_the_default_and_attempts_still_cap_at_five(
    autojump_clock: Any,
) -> None:
    seen: list[tuple[Any, ...]] = []

    async def fixed_delay(payload: Any, next: Any) -> Retry:
        seen.append((payload["turn"], payload["step"], payload["provider"], payload["attempt"]))
        return Retry(delay=2)  # never reaches the default policy

    async with mocked(status(500), seed=9) as m:
        m.rt.hooks.waterfall("agent/request-error", fixed_delay)
        await m.run()
        assert seen == [(1, 1, "live", n) for n in range(1, 6)]
        assert m.script.gaps == [2.0, 2.0, 2.0, 2.0]
        assert len(of_type(m.events, "assistant/attempt")) == 5
        (end,) = turn_ends(m.events)
        assert end["error"]["code"] == "HTTP_5XX"
        assert_well_formed(m.events)


async def test_user_listener_can_retry_a_code_the_default_would_not(autojump_clock: Any) -> None:
    async def retry_4xx(payload: Any, next: Any) -> Any:
        if payload["failure"].code == "HTTP_4XX":
            return Retry(delay=2)
        return await next(payload)

    async with mocked(status(400), status(400), ok_response) as m:
        m.rt.hooks.waterfall("agent/request-error", retry_4xx)
        await m.run()
        assert m.script.gaps == [2.0, 2.0]
        assert turn_ends(m.events) == [{"kind": "completed"}]


async def test_the_default_policy_is_innermost(autojump_clock: Any) -> None:
    order: list[str] = []
    from_default: list[Any] = []

    async def outer(payload: Any, next: Any) -> Any:
        order.append("outer")
        return await next(payload)

    async def inner(payload: Any, next: Any) -> Any:
        order.append("inner")
        result = await next(payload)
        from_default.append(result)
        return result

    async with mocked(status(500), seed=4) as m:
        m.rt.hooks.waterfall("agent/request-error", outer)
        m.rt.hooks.waterfall("agent/request-error", inner)
        await m.run()
        assert len(m.script.times) == 5
        assert sorted(set(order)) == ["inner", "outer"]
        assert len(order) == 10  # both listeners saw each of the 5 failures
        delays = backoff(4, 4)
        assert from_default[:4] == [Retry(delay=d) for d in delays]
        assert from_default[4] is None  # the fifth attempt is the last
        assert m.script.gaps == pytest.approx(delays, **EXACT)


async def test_cancel_during_the_backoff_wins_over_retry(autojump_clock: Any) -> None:
    backing_off = trio.Event()

    async def spy(payload: Any, next: Any) -> Any:
        result = await next(payload)
        assert isinstance(result, Retry)
        assert result.delay >= 0.5
        backing_off.set()
        return result

    async with mocked(status(500), ok_response) as m:
        m.rt.hooks.waterfall("agent/request-error", spy)
        m.agent.followup("go")
        await backing_off.wait()
        await trio.sleep(0.1)  # inside the backoff sleep
        m.agent.cancel(cause="user")
        await m.agent.wait_idle()
        await trio.sleep(120)
        assert len(m.script.times) == 1  # no further request
        assert types(m.events)[-3:] == ["assistant/attempt", "step/end", "turn/end"]
        assert turn_ends(m.events) == [{"kind": "aborted", "cause": "user"}]
        assert of_type(m.events, "assistant/message") == []
        assert_well_formed(m.events)


async def test_the_attempt_cap_and_the_backoff_restart_at_each_step(autojump_clock: Any) -> None:
    server_error = status(500)
    # step 1: two failures, then a tool call; step 2: five failures, the cap of that step
    async with mocked(
        server_error, server_error, tool_call_response, *[server_error] * 5, ok_response,
        seed=8, tools=[ping],
    ) as m:  # fmt: skip
        await m.run()
        assert len(m.script.times) == 8
        rng = random.Random(8)
        draws = [rng.random() for _ in range(6)]
        step1 = [0.5 * (1 + 0.25 * draws[0]), 1.0 * (1 + 0.25 * draws[1])]
        step2 = [min(8.0, 0.5 * 2 ** (n - 1)) * (1 + 0.25 * u) for n, u in enumerate(draws[2:], 1)]
        gaps = m.script.gaps
        assert gaps[:2] == pytest.approx(step1, **EXACT)
        assert gaps[2] == 0.0  # the tool ran in no virtual time
        assert gaps[3:] == pytest.approx(step2, **EXACT)
        attempts = of_type(m.events, "assistant/attempt")
        assert [(a.data["step"], a.data["stream"]["attempt"]) for a in attempts] == [
            (1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4), (2, 5),
        ]  # fmt: skip
        (end,) = turn_ends(m.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "HTTP_5XX"
        assert_well_formed(m.events)


async def test_the_key_is_checked_again_at_the_retry(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def drop_key(payload: Any, next: Any) -> Any:
        monkeypatch.delenv(KEY_ENV, raising=False)  # the key goes away during the backoff
        return await next(payload)

    async with mocked(status(500), ok_response) as m:
        m.rt.hooks.waterfall("agent/request-error", drop_key)
        await m.run()
        assert len(m.script.times) == 1
        attempts = of_type(m.events, "assistant/attempt")
        assert [a.data["failure"]["code"] for a in attempts] == ["HTTP_5XX", "AUTH"]
        assert KEY_ENV in attempts[1].data["failure"]["message"]
        (end,) = turn_ends(m.events)
        assert end["error"]["code"] == "AUTH"
        assert_well_formed(m.events)
