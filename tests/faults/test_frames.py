"""Fault corpus: malformed provider frames over real loopback HTTP (docs/design.md#failure-mapping).

The victim's provider is configured the public way (``open_runtime(config={"providers": ...})``,
``api_key_env: null``: a keyless local server) and posts to a real loopback HTTP/1.1 server that
replays the frames. Real HTTP cannot run under an autojump clock, so each case is bounded by
``trio.fail_after`` in real seconds. Every malformed frame is a coded attempt failure
(``BAD_STREAM``, ``PROVIDER_ERROR``, ...), never a ``HOOK_FAILED`` turn; the tolerated shapes
(list-valued content, ``[DONE]`` without ``finish_reason``, ``refusal``) complete cleanly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from ..llm.agent_helpers import DONE, an, an_start, an_text, an_text_block, oai, oai_call
from ..llm.agent_helpers import oai_text as oai_answer
from ..llm.server import LoopbackServer, open_loopback_server
from ..llm.server import Reply as Http
from ._kit import (
    LIMIT,
    answer_text,
    check_stored,
    last_assistant,
    make_store,
    open_pair,
    plain,
    results,
    turn_ends,
)

GOOD_TEXT = "All good."
MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-20250514"}


def good(kind: str) -> Http:
    pieces = oai_answer("All", " good.") if kind == "openai" else an_text("All", " good.")
    return Http(pieces=pieces)


@asynccontextmanager
async def live_pair(
    kind: str,
    server: LoopbackServer,
    *,
    store: Any,
    model: str | None = None,
    extra: Mapping[str, Any] | None = None,
    victim_setup: Any = None,
) -> AsyncIterator[Any]:
    provider = {"kind": kind, "base_url": server.url, "api_key_env": None, **dict(extra or {})}
    config = {"providers": {"live": provider}}
    async with open_pair(
        None,
        store=store,
        config=config,
        victim_provider="live",
        victim_model_name=model or MODELS[kind],
        victim_setup=victim_setup,
    ) as pair:
        yield pair


def attempts(events: list[Any]) -> list[dict[str, Any]]:
    return [plain(e.data) for e in events if e.type == "assistant/attempt"]


@attrs.frozen
class Frames:
    pieces: tuple[bytes, ...]
    outcome: str
    """``error`` (turn ends error with ``code``), ``completed`` (clean, answer ``text``),
    ``retried`` (an attempt failed with ``code``, then the good reply completed)."""
    code: str | None = None
    text: str = ""
    kind: str = "openai"
    stop_reason: str | None = None
    says: str | None = None
    tool_ran: bool = False
    http: Mapping[str, Any] = attrs.field(factory=dict)


def _data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _choice(delta: Any, finish: str | None = None) -> bytes:
    return _data({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


HI = oai({"role": "assistant", "content": "Hi"})
STOP = oai({}, "stop")


def bad(*pieces: bytes, kind: str = "openai") -> Frames:
    return Frames(tuple(pieces), "error", "BAD_STREAM", kind=kind)


NOTE_CALL = oai_call(0, "call-1", "note", json.dumps({"text": "v"}))

CASES: dict[str, Frames] = {
    # --- unreadable frames: BAD_STREAM, never HOOK_FAILED ---
    "invalid_json_frame": bad(HI, b"data: {not json\n\n", STOP, DONE),
    "frame_is_json_list": bad(HI, b"data: [1, 2, 3]\n\n", STOP, DONE),
    "frame_is_number": bad(b"data: 42\n\n", STOP, DONE),
    "frame_is_string": bad(b'data: "hello"\n\n', STOP, DONE),
    "choices_not_a_list": bad(_data({"choices": {"0": {"delta": {"content": "x"}}}}), DONE),
    "choice_not_an_object": bad(_data({"choices": ["x"]}), DONE),
    "delta_is_string": bad(_data({"choices": [{"index": 0, "delta": "Hi"}]}), STOP, DONE),
    "delta_is_list": bad(_data({"choices": [{"index": 0, "delta": ["Hi"]}]}), STOP, DONE),
    "content_is_number": bad(_choice({"content": 5}), STOP, DONE),
    "content_part_not_object": bad(_choice({"content": [42]}), STOP, DONE),
    "content_text_part_not_string": bad(
        _choice({"content": [{"type": "text", "text": 7}]}), STOP, DONE
    ),
    "tool_calls_not_a_list": bad(_choice({"tool_calls": {"index": 0}}), DONE),
    "tool_call_index_not_int": bad(
        _choice({"tool_calls": [{"index": "x", "id": "c1", "function": {"name": "note"}}]}),
        oai({}, "tool_calls"),
        DONE,
    ),
    "tool_call_function_is_string": bad(
        _choice({"tool_calls": [{"index": 0, "id": "c1", "function": "note"}]}),
        oai({}, "tool_calls"),
        DONE,
    ),
    "refusal_not_string": bad(_choice({"refusal": {"text": "no"}}), STOP, DONE),
    "html_200_body": Frames(
        (b"<html><body>Service page</body></html>",),
        "error",
        "BAD_STREAM",
        http={"headers": (("content-type", "text/html; charset=utf-8"),)},
    ),
    # --- tolerated shapes: clean answers ---
    "content_list_text_parts": Frames(
        (
            _choice({"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}),
            _choice({"content": [{"type": "text", "text": " world"}]}),
            STOP,
            DONE,
        ),
        "completed",
        text="Hello world",
    ),
    "content_list_with_non_text_parts": Frames(
        (
            _choice(
                {
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                        {"type": "text", "text": "Seen"},
                        {"type": "audio", "data": "AAAA"},
                    ]
                }
            ),
            STOP,
            DONE,
        ),
        "completed",
        text="Seen",
    ),
    "done_without_finish_reason": Frames(
        (HI, oai({"content": " there"}), DONE), "completed", text="Hi there"
    ),
    "done_without_finish_after_tool_call": Frames(
        (NOTE_CALL, DONE), "completed", text=GOOD_TEXT, tool_ran=True
    ),
    "refusal_text_kept": Frames(
        (
            _choice({"role": "assistant", "refusal": "I can't"}),
            _choice({"refusal": " help with that."}),
            oai({}, "stop"),
            DONE,
        ),
        "completed",
        text="I can't help with that.",
        stop_reason="refusal",
    ),
    # --- provider error events ---
    "error_event_json_body": Frames(
        (
            HI,
            b'event: error\ndata: {"error": {"message": "quota exceeded for today", '
            b'"type": "invalid_request_error"}}\n\n',
        ),
        "error",
        "PROVIDER_ERROR",
        says="quota exceeded for today",
    ),
    "error_event_overloaded": Frames(
        (
            b'event: error\ndata: {"error": {"message": "Overloaded", '
            b'"type": "overloaded_error"}}\n\n',
        ),
        "retried",
        "HTTP_5XX",
        text=GOOD_TEXT,
    ),
    # --- transport faults ---
    "stream_cut_mid_body": Frames(
        (HI, oai({"content": " the"})[:25]),
        "retried",
        "STREAM_CUT",
        text=GOOD_TEXT,
        http={"cut_after": 2},
    ),
    # --- anthropic ---
    "anthropic_delta_is_string": bad(
        an_start(),
        *an_text_block(0, "Hi"),
        an("content_block_delta", index=0, delta="oops"),
        kind="anthropic",
    ),
    "anthropic_event_not_json": bad(
        an_start(), b"event: content_block_start\ndata: {nope\n\n", kind="anthropic"
    ),
    "anthropic_text_not_string": bad(
        an_start(),
        an("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        an("content_block_delta", index=0, delta={"type": "text_delta", "text": 5}),
        kind="anthropic",
    ),
    "anthropic_error_event": Frames(
        (
            an_start(),
            b'event: error\ndata: {"type": "error", "error": {"type": "api_error", '
            b'"message": "Something broke upstream"}}\n\n',
        ),
        "error",
        "PROVIDER_ERROR",
        kind="anthropic",
        says="Something broke upstream",
    ),
    "anthropic_overloaded_event": Frames(
        (
            an_start(),
            b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
            b'"message": "Overloaded"}}\n\n',
        ),
        "retried",
        "HTTP_5XX",
        kind="anthropic",
        text=GOOD_TEXT,
    ),
    "anthropic_keyless_clean": Frames(
        tuple(an_text("Key", "less.")), "completed", kind="anthropic", text="Keyless."
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_frames(case: str, tmp_path: Path) -> None:
    spec = CASES[case]
    store_kind = "sqlite" if len(case) % 2 else "memory"
    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_loopback_server(good(spec.kind)) as server:
            server.push(Http(pieces=list(spec.pieces), **dict(spec.http)))
            async with live_pair(spec.kind, server, store=store) as pair:
                await pair.run_both()
                live_errors = pair.victim_errors()
                assert pair.bystander_errors() == []
            recorded = list(server.requests)
    victim, _ = await check_stored(store, store_kind, tmp_path)
    ends = turn_ends(victim)
    assert len(ends) == 1, ends
    assert all(e["error"]["code"] != "HOOK_FAILED" for e in live_errors), live_errors
    if spec.outcome == "error":
        assert ends[0]["kind"] == "error", ends
        assert ends[0]["error"]["code"] == spec.code, ends
        failures = [a["failure"] for a in attempts(victim)]
        assert [f["code"] for f in failures] == [spec.code], failures
        if spec.says is not None:
            message = ends[0]["error"]["message"]
            assert spec.says in message, message
            assert "{" not in message, f"raw JSON in the message: {message}"
        return
    assert ends[0] == {"kind": "completed"}, ends
    assert answer_text(victim) == spec.text
    if spec.outcome == "retried":
        failures = [a["failure"]["code"] for a in attempts(victim)]
        assert failures == [spec.code], failures
        assert len(recorded) == 2
    else:
        assert [a for a in attempts(victim) if a.get("failure")] == []
    if spec.stop_reason is not None:
        stream = last_assistant(victim)["stream"]
        assert stream.get("stop_reason") == spec.stop_reason, stream
    if spec.tool_ran:
        (result,) = results(victim)
        assert result.get("error") is None, result
    if spec.kind == "anthropic":
        assert all("x-api-key" not in r.headers for r in recorded)
    else:
        assert all("authorization" not in r.headers for r in recorded)


async def test_arguments_as_object(tmp_path: Path) -> None:
    """Tool-call ``arguments`` sent as an object: BAD_STREAM, or read as those arguments."""
    frame = _choice(
        {
            "tool_calls": [
                {"index": 0, "id": "c1", "function": {"name": "note", "arguments": {"text": "v"}}}
            ]
        }
    )
    store = make_store("sqlite", tmp_path)
    with trio.fail_after(LIMIT):
        async with open_loopback_server(good("openai")) as server:
            server.push(Http(pieces=[frame, oai({}, "tool_calls"), DONE]))
            async with live_pair("openai", server, store=store) as pair:
                await pair.run_both()
                assert all(e["error"]["code"] != "HOOK_FAILED" for e in pair.victim_errors())
    victim, _ = await check_stored(store, "sqlite", tmp_path)
    (end,) = turn_ends(victim)
    if end["kind"] == "error":
        assert end["error"]["code"] == "BAD_STREAM", end
    else:
        assert end == {"kind": "completed"}
        (result,) = results(victim)
        assert result.get("error") is None, result
        assert "noted v" in json.dumps(result["message"]["content"])


# --- reasoning replay (docs/design.md#reasoning-replay) ---------------------------------------


def _tool_turn(reasoning: str | None) -> list[bytes]:
    out = []
    if reasoning is not None:
        out.append(_choice({"role": "assistant", "reasoning_content": reasoning}))
    return [*out, NOTE_CALL, oai({}, "tool_calls"), DONE]


@pytest.mark.parametrize(
    ("model", "extra", "reasoning", "expected"),
    [
        ("deepseek-v4-flash", {}, None, ""),
        ("deepseek-v4-pro", {}, "Let me call the tool.", "Let me call the tool."),
        ("deepseek-v4-flash", {"reasoning_replay": "never"}, "thinking", None),
        (
            "deepseek-v4-pro",
            {"models": {"deepseek-v4-pro": {"reasoning_replay": "never"}}},
            "thinking",
            None,
        ),
        ("deepseek-reasoner", {}, "thinking", None),
        ("gpt-4o", {"reasoning_replay": "tool-turns"}, None, ""),
    ],
    ids=["v4_flash_empty", "v4_pro_kept", "provider_never", "model_never", "reasoner", "forced"],
)
async def test_reasoning_replay(
    model: str, extra: dict[str, Any], reasoning: str | None, expected: str | None, tmp_path: Path
) -> None:
    store = make_store("memory", tmp_path)
    with trio.fail_after(LIMIT):
        async with open_loopback_server(good("openai")) as server:
            server.push(Http(pieces=_tool_turn(reasoning)))
            async with live_pair("openai", server, store=store, model=model, extra=extra) as pair:
                await pair.run_both()
            bodies = [r.json() for r in server.requests]
    victim, _ = await check_stored(store, "memory", tmp_path)
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert len(bodies) == 2
    (assistant,) = [m for m in bodies[1]["messages"] if m["role"] == "assistant"]
    assert assistant.get("tool_calls"), assistant
    if expected is None:
        assert "reasoning_content" not in assistant, assistant
    else:
        assert assistant.get("reasoning_content") == expected, assistant
    # Never on messages without tool calls (there are none in the first body).
    assert all("reasoning_content" not in m for m in bodies[0]["messages"])


async def test_anthropic_key_env_empty(tmp_path: Path) -> None:
    """``api_key_env: ""`` disables the key for an anthropic provider: no AUTH, no header."""
    store = make_store("memory", tmp_path)
    with trio.fail_after(LIMIT):
        async with open_loopback_server(good("anthropic")) as server:
            async with live_pair(
                "anthropic", server, store=store, extra={"api_key_env": ""}
            ) as pair:
                await pair.run_both()
            recorded = list(server.requests)
    victim, _ = await check_stored(store, "memory", tmp_path)
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == GOOD_TEXT
    assert recorded
    assert all("x-api-key" not in r.headers for r in recorded)
