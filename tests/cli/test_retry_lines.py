"""Failed model calls in plain words: retry lines, give-up lines and the turn's error."""

from __future__ import annotations

import pytest
import trio
from rich.console import Console

from dsh_agent_loop import AgentOptions, Reply, Retry, ScriptedModel, open_runtime
from dsh_agent_loop.cli._render import StreamRenderer, failure_words, retry_line
from dsh_agent_loop.llm._base import Failure


@pytest.mark.parametrize(
    ("failure", "words"),
    [
        (Failure("HTTP_429", "HTTP 429: slow down", 429), "HTTP 429 from deepseek: slow down"),
        (Failure("HTTP_5XX", "HTTP 502", 502), "HTTP 502 from deepseek"),
        (
            Failure("TIMEOUT", "read timeout (300 s) expired while waiting for the server"),
            "deepseek timed out: read timeout (300 s) expired while waiting for the server",
        ),
        (
            Failure("CONNECTION", "ConnectError: refused"),
            "cannot reach deepseek: ConnectError: refused",
        ),
        (
            Failure("STREAM_CUT", "stream cut: RemoteProtocolError"),
            "deepseek cut the reply off: RemoteProtocolError",
        ),
        (Failure("AUTH", "HTTP 401: bad key", 401), "HTTP 401 from deepseek: bad key"),
        (Failure("NO_ROUTE", "no provider"), "NO_ROUTE from deepseek: no provider"),
    ],
)
def test_failure_words(failure: Failure, words: str) -> None:
    assert failure_words(failure.to_data(), "deepseek") == words


def test_retry_line_says_what_happens_next() -> None:
    rate = Failure("HTTP_429", "HTTP 429: Too Many Requests", 429, retry_after=1.2)
    assert retry_line(rate, "deepseek", 1, Retry(1.2)) == (
        "HTTP 429 from deepseek, retrying in 1.2 s (attempt 2 of 5): Too Many Requests"
    )
    assert retry_line(rate, "deepseek", 5, Retry(1.2)) == (
        "HTTP 429 from deepseek, giving up after 5 attempts: Too Many Requests"
    )
    assert retry_line(rate, "deepseek", 1, None) is None  # the turn's error line follows
    timeout = Failure("TIMEOUT", "connect timeout (10 s) expired while connecting to the server")
    assert retry_line(timeout, "local", 2, Retry(0.25)) == (
        "local timed out: connect timeout (10 s) expired while connecting to the server,"
        " retrying in 0.2 s (attempt 3 of 5)"
    )


async def test_the_renderer_reports_each_retry_without_changing_the_decision(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [
            Reply.error("HTTP_429", "HTTP 429: rate limited", status=429, retry_after=1.2),
            Reply.error("HTTP_5XX", "HTTP 503: busy", status=503, retry_after=2.0),
            Reply.text("made it"),
        ]
    )
    out = Console(record=True, width=200)
    err = Console(record=True, width=200)
    async with open_runtime(providers={"deepseek": model}) as rt:
        renderer = StreamRenderer(out, prefix=False, errors=err)
        disposers = renderer.attach(rt.hooks)
        h = await rt.agents.create(options=AgentOptions(id="main", provider="deepseek", model="m"))
        start = trio.current_time()
        h.agent.followup("go")
        await h.agent.wait_idle()
        waited = trio.current_time() - start
        for dispose in disposers:
            dispose()
    assert renderer.failures == []
    assert err.export_text().splitlines() == [
        "HTTP 429 from deepseek, retrying in 1.2 s (attempt 2 of 5): rate limited",
        "HTTP 503 from deepseek, retrying in 2.0 s (attempt 3 of 5): busy",
    ]
    assert "made it" in out.export_text()
    assert waited == pytest.approx(3.2)  # the provider's Retry-After, as decided without us
    assert len(model.requests) == 3
