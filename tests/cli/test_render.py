"""Rendering for the CLI (``cli/_render.py``): snippets, reasons, streams and panels."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.cli._render import (
    SNIPPET,
    StreamRenderer,
    message_text,
    reason_text,
    snippet,
    store_failure_line,
)
from dsh_agent_loop.cli._terminal import visible
from dsh_agent_loop.cli._transcript import plain_line
from dsh_agent_loop.events import (
    AGENT_ERROR,
    ASSISTANT_STREAM,
    HOOK_TOOLS_RESULT,
    TOOL_RESULT,
    Event,
    make_event,
)
from dsh_agent_loop.llm._base import BlockEnd, BlockStart, TextDelta, ToolCallDelta


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def test_snippet_flattens_whitespace_and_cuts_with_an_ellipsis():
    assert snippet("a\n  b\tc") == "a b c"
    assert snippet("x" * SNIPPET) == "x" * SNIPPET
    cut = snippet("y" * (SNIPPET + 10))
    assert len(cut) == SNIPPET
    assert cut.endswith("…")
    assert snippet("abcdef", 4) == "abc…"


def test_message_text_joins_blocks_of_the_asked_kinds():
    message = {"content": [text("a"), {"type": "reasoning", "text": "r"}, text("b"), "not a block"]}
    assert message_text(message) == "ab"
    assert message_text(message, ("reasoning",)) == "r"
    assert message_text({"content": None}) == ""
    assert message_text({}) == ""


@pytest.mark.parametrize(
    ("reason", "short"),
    [
        (None, "-"),
        ({"kind": "completed"}, "completed"),
        ({"kind": "aborted", "cause": "user"}, "aborted:user"),
        ({"kind": "aborted"}, "aborted:?"),
        ({"kind": "error", "error": {"code": "HTTP_5XX"}}, "error:HTTP_5XX"),
        ({"kind": "error"}, "error:?"),
        ({}, "?"),
    ],
)
def test_reason_text(reason, short):
    assert reason_text(reason) == short


HOSTILE = "a\x1b[2Jb\x1b]52;c;Zm9v\x07c\x9bd\u202ee"
SHOWN = "a␛[2Jb␛]52;c;Zm9v␇c\\x9bd\\u202ee"


def _terminal_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, color_system="standard", width=200), out


def _raw_controls(written: str) -> list[str]:
    """What is left besides rich's own SGR styling that a terminal would act on."""
    return re.findall(
        "[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", SGR.sub("", written)
    )


SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_the_renderer_shows_hostile_stream_tool_and_error_text_without_a_guard() -> None:
    console, out = _terminal_console()
    renderer = StreamRenderer(console, prefix=False)

    def frame(chunk: object) -> Event:
        data = FrozenDict(agent_id="a", frame="chunk", chunk=chunk)
        return make_event(ASSISTANT_STREAM, None, 0.0, data)

    renderer.on_stream(frame(TextDelta(0, HOSTILE)))
    renderer.on_stream(frame(BlockEnd(0)))
    renderer.on_stream(frame(BlockStart(1, "tool-call", call_id="c", name=f"n{HOSTILE}")))
    renderer.on_stream(frame(ToolCallDelta(1, "not json " + HOSTILE)))
    renderer.on_stream(frame(BlockEnd(1)))
    stored = Event(TOOL_RESULT, 3, 0.0, {"message": {"name": "t", "content": [text(HOSTILE)]}})
    renderer.on_tool_result(make_event(HOOK_TOOLS_RESULT, None, 0.0, FrozenDict(event=stored)))
    renderer.on_error(
        Event(
            AGENT_ERROR,
            None,
            0.0,
            {"agent_id": "a", "turn": 1, "error": {"code": "X", "message": HOSTILE}},
        )
    )
    written = out.getvalue()
    assert renderer.failures == []
    assert _raw_controls(written) == []
    assert written.count(SHOWN) == 5, written  # text, call name, arguments, result, error
    assert renderer.store_failures == {}


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("OWNERSHIP_LOST", "another process took its session over"),
        ("STORE_FAILED", "its session store failed"),
    ],
)
def test_a_store_failure_is_one_line_and_is_kept(code: str, words: str) -> None:
    console, out = _terminal_console()
    renderer = StreamRenderer(console, prefix=True)
    error = {"code": code, "message": "session 's': the write\n lease was lost"}
    renderer.on_error(Event(AGENT_ERROR, None, 0.0, {"agent_id": "a", "turn": 2, "error": error}))
    (line,) = SGR.sub("", out.getvalue()).splitlines()
    assert line == (
        f"a: stopped, {words}; its events not yet stored are lost"
        f" ({code}: session 's': the write lease was lost)"
    )
    assert renderer.store_failures == {"a": code}
    assert (
        store_failure_line("a", code, "m")
        == f"a: stopped, {words}; its events not yet stored are lost ({code}: m)"
    )


def test_event_lines_show_control_characters() -> None:
    event = Event("x/custom", 4, 0.0, {"text": HOSTILE})
    line = visible(plain_line(4, event))  # as ``sessions show`` and ``run`` print it
    assert _raw_controls(line) == []
    assert "\\u001b[2J" in line  # JSON-quoted C0
    assert "\\u009bd\\u202ee" in line  # JSON-quoted C1 and bidi


def test_a_tool_call_panel_shows_the_whole_arguments_wrapped() -> None:
    command = "echo " + " ".join(f"word{n}" for n in range(100)) + "; touch HIDDEN"
    assert len(command) > 500
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    renderer = StreamRenderer(console, prefix=False)

    def frame(chunk: object) -> Event:
        data = FrozenDict(agent_id="a", frame="chunk", chunk=chunk)
        return make_event(ASSISTANT_STREAM, None, 0.0, data)

    arguments = '{"command": "' + command + '\\u009b"}'
    renderer.on_stream(frame(BlockStart(0, "tool-call", call_id="c", name="run_command")))
    renderer.on_stream(frame(ToolCallDelta(0, arguments)))
    renderer.on_stream(frame(BlockEnd(0)))
    written = out.getvalue()
    assert "…" not in written
    lines = written.splitlines()
    assert all(len(line) <= 80 for line in lines)  # wrapped to the terminal, not one long line
    inside = "".join(line.strip("│ ") for line in lines[1:-1])  # the panel's text, unwrapped
    assert "".join(command.split()) + "\\u009b" in "".join(inside.split())
    assert inside.rstrip().endswith('; touch HIDDEN\\u009b"}')
