"""Log rendering for the CLI (``cli/_render.py``): snippets, reasons and one line per event."""

from __future__ import annotations

import pytest

from dsh_agent_loop.cli._render import (
    SNIPPET,
    describe,
    event_line,
    message_text,
    reason_text,
    snippet,
)
from dsh_agent_loop.events import Event


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


@pytest.mark.parametrize(
    ("event", "detail"),
    [
        (Event("turn/start", 0, 0.0, {"turn": 2}), "turn 2"),
        (Event("step/start", 1, 0.0, {"turn": 2, "step": 3}), "turn 2 step 3"),
        (
            Event("turn/end", 2, 0.0, {"turn": 2, "reason": {"kind": "completed"}}),
            "turn 2  completed",
        ),
        (
            Event("user/message", 3, 0.0, {"message": {"content": [text("hi")], "source": "cli"}}),
            '"hi"  (cli)',
        ),
        (
            Event(
                "system/message",
                4,
                0.0,
                {"message": {"content": []}},
                surface_op={"op": "replace", "start_seq": 1, "end_seq": 2},
            ),
            "(empty)  replaces 1..2",
        ),
        (
            Event(
                "assistant/message",
                5,
                0.0,
                {
                    "message": {
                        "content": [
                            {"type": "reasoning", "text": "hmm"},
                            text("ok"),
                            {"type": "tool-call", "name": "read"},
                            {"type": "tool-call", "name": "write"},
                        ]
                    },
                    "stream": {"finish": "max-tokens"},
                    "interrupted": True,
                },
            ),
            'reasoning 3 chars  "ok"  calls read, write  finish max-tokens  INTERRUPTED',
        ),
        (Event("assistant/message", 6, 0.0, {"message": {"content": []}}), "(empty)"),
        (
            Event(
                "assistant/attempt",
                7,
                0.0,
                {"failure": {"code": "TIMEOUT", "message": "slow\nserver"}},
            ),
            "TIMEOUT: slow server",
        ),
        (Event("tool/call", 8, 0.0, {"name": "read", "arguments": '{"p": 1}'}), 'read {"p": 1}'),
        (
            Event(
                "tool/result",
                9,
                0.0,
                {"message": {"name": "read", "content": [text("no")]}, "error": {"code": "DENIED"}},
            ),
            'read  DENIED: "no"',
        ),
        (
            Event(
                "agent/inbox/spliced",
                10,
                0.0,
                {
                    "target": "next-turn",
                    "start": 0,
                    "removed_count": 1,
                    "inserted": [{"content": [text("a")]}, {"content": [text("b")]}],
                },
            ),
            'next-turn  +2 "a | b"  -1 claimed',
        ),
        (
            Event(
                "request/header",
                11,
                0.0,
                {
                    "reason": "initial",
                    "header": {"config": {"provider": "p", "model": "m"}, "tools": [{}, {}]},
                },
            ),
            "initial  p/m  2 tools",
        ),
        (Event("request/context", 12, 0.0, {"provider": "p", "model": "m"}), "p/m"),
        (Event("session/end-seed", 13, 0.0, {"inherited": True}), "inherited"),
        (Event("future/x", 14, 0.0, {"k": [1]}, ignorable=True), '{"k": [1]}'),
    ],
)
def test_describe_each_event_type(event, detail):
    assert describe(event) == detail


def test_event_line_pads_seq_and_type_and_strips_trailing_space():
    assert event_line(Event("turn/start", 3, 0.0, {"turn": 1})) == (
        f"    3  {'turn/start':<20}  turn 1"
    )
    seed = event_line(Event("session/end-seed", None, 0.0, {}))
    assert seed == "    -  session/end-seed"
