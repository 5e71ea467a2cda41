"""``llm/_secrets.py``: keys from the environment, header checks, and redaction end to end.

A key or a configured header value must never reach a failure message, the session log or a
log line. These tests read keys the way a CRLF ``.env`` leaves them, make servers and httpx
echo the key back, and search every stored event's JSON for it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dsh_agent_loop import ConfigError, OpenAIProvider, load_config
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.llm._anthropic import AnthropicAdapter
from dsh_agent_loop.llm._base import Failure, Finish, ModelError
from dsh_agent_loop.llm._http import endpoint
from dsh_agent_loop.llm._openai import OpenAIAdapter
from dsh_agent_loop.llm._secrets import (
    REDACTED,
    check_headers,
    read_api_key,
    redact,
    secret_forms,
)

from .agent_helpers import KEY_ENV, fast_transient_retry, live_agent, oai_text, of_type
from .server import LoopbackServer, Reply, closing, collect, open_loopback_server

ENV = "DSH_SECRETS_TEST_KEY"
KEY = "sk-secret-0123456789abcdef"
CONFIG = {"model": "gpt-4o"}
CLAUDE = {"model": "claude-sonnet-4-20250514"}
OK = b"".join(oai_text("Hi"))


def failure_of(chunks: list[Any]) -> Failure:
    last = chunks[-1]
    assert isinstance(last, Finish), chunks
    assert last.failure is not None, chunks
    return last.failure


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as server:
        yield server


# --- reading the key ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [f"{KEY}\r\n", f"  {KEY}\n", f"\t{KEY} \r"])
def test_surrounding_whitespace_is_stripped(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(ENV, raw)
    assert read_api_key(ENV) == KEY


@pytest.mark.parametrize(
    "raw",
    [
        f"{KEY[:8]}\r\n{KEY[8:]}",
        f"{KEY}\x7fx",
        f"{KEY[:5]}\x1b{KEY[5:]}",
        f"{KEY}é",
        f"\ufeff{KEY}",
    ],
)
def test_a_control_or_non_ascii_character_inside_is_auth(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(ModelError) as info:
        read_api_key(ENV)
    assert info.value.failure.code == "AUTH"
    assert ENV in info.value.failure.message
    assert KEY[:5] not in info.value.failure.message
    assert KEY[8:] not in info.value.failure.message


def test_a_blank_key_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, " \r\n")
    with pytest.raises(ModelError, match=f"missing API key: environment variable {ENV}"):
        read_api_key(ENV)


# --- headers and redaction ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"x-token": "tok-123\r\nx-evil: 1"}, "'x-token' must be printable ASCII"),
        ({"x-token": "tok-é"}, "'x-token' must be printable ASCII"),
        ({"bad name": "tok-123"}, "'bad name' is not a valid HTTP header name"),
    ],
)
def test_headers_that_cannot_be_sent_are_refused_without_their_value(
    headers: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=says) as info:
        check_headers(headers)
    assert "tok-" not in str(info.value)
    with pytest.raises(ValueError, match=says):
        OpenAIAdapter("p", base_url="http://127.0.0.1:9", headers=headers)
    with pytest.raises(ValueError, match=says):
        AnthropicAdapter("p", base_url="http://127.0.0.1:9", headers=headers)


def test_redact_covers_bearer_tokens_and_byte_reprs() -> None:
    forms = secret_forms(["Bearer sk-a'b\\c", "plain"])
    for text in (
        'Illegal header value b"Bearer sk-a\'b\\\\c"',
        "echo: sk-a'b\\c and plain",
        "repr: 'sk-a\\'b\\\\c'",
    ):
        out = redact(text, forms)
        assert "sk-a" not in out
        assert "plain" not in out or "plain" not in text
        assert REDACTED in out


# --- base_url with a user name or password ------------------------------------------------------


@pytest.mark.parametrize("url", ["http://user:hunter2@127.0.0.1:9/v1", "https://:hunter2@h"])
def test_a_base_url_with_userinfo_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(ValueError, match=r"user:pass@") as info:
        endpoint(url, "/p")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match=r"user:pass@"):
        OpenAIAdapter("p", base_url=url)
    with pytest.raises(ValueError, match=r"user:pass@"):
        AnthropicAdapter("p", base_url=url)
    with pytest.raises(ConfigError, match=r"OpenAIProvider: base_url: must not carry") as error:
        OpenAIProvider(base_url=url)
    assert "hunter2" not in str(error.value)
    raw = {"providers": {"ds": {"kind": "openai", "base_url": url}}}
    with pytest.raises(ConfigError, match=r"providers\.ds\.base_url: must not carry") as error:
        load_config(raw)
    assert "hunter2" not in str(error.value)


# --- on the wire --------------------------------------------------------------------------------


async def test_a_crlf_key_is_sent_stripped(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, f"{KEY}\r\n")
    server.push(Reply(pieces=[OK]))
    async with closing(OpenAIAdapter("p", base_url=server.url, api_key_env=ENV)) as adapter:
        chunks = await collect(adapter, CONFIG)
    assert chunks[-1] == Finish("stop", stop_reason="stop")
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_a_crlf_key_is_sent_stripped_to_anthropic(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, f"{KEY}\r\n")
    server.push(Reply.error(529, {"type": "error", "error": {"message": "overloaded"}}))
    async with closing(AnthropicAdapter("c", base_url=server.url, api_key_env=ENV)) as adapter:
        chunks = await collect(adapter, CLAUDE)
    assert failure_of(chunks).code == "HTTP_5XX"
    assert server.requests[0].headers["x-api-key"] == KEY


async def test_an_embedded_control_character_fails_auth_before_any_request(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, f"{KEY}\r\nx")
    async with closing(OpenAIAdapter("p", base_url=server.url, api_key_env=ENV)) as adapter:
        with pytest.raises(ModelError) as info:
            await adapter.prepare_call(CONFIG)
        assert info.value.failure.code == "AUTH"
        assert ENV in info.value.failure.message
        assert KEY not in info.value.failure.message
    assert server.requests == []


@pytest.mark.parametrize(
    "reply",
    [
        Reply.error(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}),
        Reply.error(500, f"upstream said: authorization=Bearer {KEY}"),
        Reply.error(400, {"error": {"message": f"bad header x-team-token: tok-{KEY[-6:]}"}}),
        Reply(pieces=[b"data: {not json, key " + KEY.encode() + b"}\n\n"]),
        Reply(pieces=[b'data: {"error": {"message": "key ' + KEY.encode() + b' revoked"}}\n\n']),
    ],
    ids=["401 echo", "500 echo", "header echo", "malformed frame echo", "error frame echo"],
)
async def test_a_server_echoing_the_key_or_a_header_is_redacted(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, reply: Reply
) -> None:
    monkeypatch.setenv(ENV, KEY)
    server.push(reply)
    headers = {"x-team-token": f"tok-{KEY[-6:]}"}
    adapter = OpenAIAdapter("p", base_url=server.url, api_key_env=ENV, headers=headers)
    async with closing(adapter):
        failure = failure_of(await collect(adapter, CONFIG))
    assert KEY not in failure.message
    assert f"tok-{KEY[-6:]}" not in failure.message
    assert REDACTED in failure.message


async def test_an_httpx_exception_quoting_the_header_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """h11 refuses a bad header value by quoting it whole (how the key used to leak)."""
    monkeypatch.setenv(ENV, KEY)

    def handler(request: httpx.Request) -> httpx.Response:
        value = request.headers["authorization"].encode()
        raise httpx.LocalProtocolError(f"Illegal header value {value!r}")

    transport = httpx.MockTransport(handler)
    adapter = OpenAIAdapter("p", base_url="http://h", api_key_env=ENV, transport=transport)
    async with closing(adapter):
        failure = failure_of(await collect(adapter, CONFIG))
    assert failure.code == "CONNECTION"
    assert KEY not in failure.message
    assert failure.message == f"LocalProtocolError: Illegal header value b'Bearer {REDACTED}'"


async def test_a_provider_objects_key_is_redacted_too(server: LoopbackServer) -> None:
    server.push(Reply.error(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    provider = OpenAIProvider(base_url=server.url, api_key=f" {KEY}\r\n")
    async with closing(provider.adapter("p")) as adapter:
        failure = failure_of(await collect(adapter, CONFIG))
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert failure.code == "AUTH"
    assert KEY not in failure.message
    with pytest.raises(ValueError, match="api_key holds a control or non-ASCII") as info:
        OpenAIProvider(base_url=server.url, api_key=f"{KEY}\nx")
    assert KEY not in str(info.value)


# --- the session log ----------------------------------------------------------------------------


def _log_text(events: list[Any]) -> str:
    return "\n".join(event_to_json(event) for event in events)


@pytest.mark.parametrize(
    ("key", "reply", "code"),
    [
        (f"{KEY}\r\nx", None, "AUTH"),
        (f"{KEY}\r\n", Reply.error(503, {"error": {"message": f"no capacity for {KEY}"}}), None),
    ],
    ids=["control character in the key", "server echoes the key, retried"],
)
async def test_no_key_in_the_session_log_or_the_log_lines(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    key: str,
    reply: Reply | None,
    code: str | None,
) -> None:
    monkeypatch.setenv(KEY_ENV, key)
    caplog.set_level(logging.DEBUG)
    async with live_agent("openai", default=Reply(pieces=[OK])) as h:
        h.rt.hooks.waterfall("agent/request-error", fast_transient_retry)
        if reply is not None:
            h.server.push(reply, reply)
        await h.run("go")
        events = h.events
        attempts = of_type(events, "assistant/attempt")
        if code == "AUTH":
            assert [a.data["failure"]["code"] for a in attempts] == ["AUTH"]
            assert KEY_ENV in attempts[0].data["failure"]["message"]
            assert h.server.requests == []
        else:
            assert [a.data["failure"]["code"] for a in attempts] == ["HTTP_5XX"] * 2
            assert of_type(events, "assistant/message")  # then the answer came
            assert {r.headers["authorization"] for r in h.server.requests} == {f"Bearer {KEY}"}
    assert KEY not in _log_text(events)
    assert KEY not in caplog.text
