"""A ``TIMEOUT`` failure names which timeout expired and its seconds."""

from __future__ import annotations

import httpx
import pytest

from dsh_agent_loop.llm._http import make_timeout, transport_failure


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (
            httpx.ReadTimeout,
            "read timeout (7.5 s) expired while waiting for the server to send more",
        ),
        (httpx.ConnectTimeout, "connect timeout (3 s) expired while connecting to the server"),
        (httpx.WriteTimeout, "write timeout (7.5 s) expired while sending the request"),
        (httpx.PoolTimeout, "pool timeout (3 s) expired while waiting for a free connection"),
    ],
)
async def test_the_message_names_the_timeout_and_its_seconds(
    error: type[httpx.TimeoutException], words: str
) -> None:
    def stall(request: httpx.Request) -> httpx.Response:
        raise error("timed out", request=request)

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(stall), timeout=make_timeout({"connect": 3, "read": 7.5})
    ) as client:
        with pytest.raises(httpx.TimeoutException) as caught:
            await client.get("http://127.0.0.1:9/v1/chat/completions")
    failure = transport_failure(caught.value, started=False)
    assert failure.code == "TIMEOUT"
    assert failure.message == words


def test_a_timeout_without_a_request_still_reads_well() -> None:
    failure = transport_failure(httpx.ReadTimeout("slow"), started=True)
    assert failure.code == "TIMEOUT"
    assert failure.message == "read timeout expired while waiting for the server to send more"
