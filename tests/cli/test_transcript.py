"""``sessions show`` wording (``cli/_transcript.py``): turn endings, totals, one line per event."""

from __future__ import annotations

import pytest

from dsh_agent_loop.cli._transcript import Totals, plain_line, totals, turn_end_words
from dsh_agent_loop.events import Event


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ({"kind": "completed"}, "completed"),
        ({"kind": "aborted", "cause": "user"}, "cancelled by the user"),
        ({"kind": "aborted", "cause": "disposed"}, "cancelled by shutdown"),
        (
            {"kind": "error", "error": {"code": "TIMEOUT", "message": "read timeout (300 s)"}},
            "failed: TIMEOUT: read timeout (300 s)",
        ),
        ({"kind": "interrupted"}, "interrupted (the process stopped during the turn)"),
        ({"kind": "blocked", "reason": "quota"}, "not started: quota"),
        (None, "ended"),
    ],
)
def test_turn_end_words(reason: dict | None, words: str) -> None:
    assert turn_end_words(reason) == words


def usage(n_in: int, n_out: int, text: str = "hi") -> Event:
    return Event(
        "assistant/message",
        3,
        0.0,
        {
            "turn": 1,
            "step": 1,
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
            "stream": {"attempt": 1, "finish": "stop"},
            "usage": {"input_tokens": n_in, "output_tokens": n_out},
        },
    )


def test_totals_add_up_turns_calls_and_tokens() -> None:
    events = [
        Event("turn/start", 0, 0.0, {"turn": 1}),
        Event(
            "assistant/attempt",
            1,
            0.0,
            {
                "turn": 1,
                "step": 1,
                "stream": {"attempt": 1},
                "failure": {"code": "HTTP_5XX", "message": "x", "status": 502},
            },
        ),
        usage(1200, 300),
        Event(
            "tool/call",
            4,
            0.0,
            {"turn": 1, "step": 1, "call_id": "c", "name": "f", "arguments": "{}"},
        ),
        usage(1500, 34),
        Event("turn/end", 6, 0.0, {"turn": 1, "reason": {"kind": "completed"}}),
        Event("turn/start", 7, 0.0, {"turn": 2}),
        Event("turn/end", 8, 0.0, {"turn": 2, "reason": {"kind": "aborted", "cause": "user"}}),
    ]
    found = totals(events)
    assert found == Totals(2, {"completed": 1, "aborted": 1}, 2, 1, 1, 2700, 334)
    assert found.lines() == [
        "2 turns (1 completed, 1 aborted) · 2 model calls (+1 failed) · 1 tool call",
        "tokens: 2,700 in, 334 out, 3,034 total",
    ]


def test_plain_lines_avoid_log_vocabulary() -> None:
    assert plain_line(3, usage(12, 5, "Hello")) == '    3  assistant: "Hello" [12 in, 5 out]'
    failed = Event(
        "assistant/attempt",
        9,
        0.0,
        {
            "turn": 1,
            "step": 1,
            "stream": {"attempt": 1},
            "failure": {"code": "HTTP_429", "message": "HTTP 429: slow", "status": 429},
        },
    )
    assert plain_line(9, failed) == "    9  model call failed: HTTP 429 from the model: slow"
    unknown = Event("x/custom", 10, 0.0, {"a": 1})
    assert plain_line(10, unknown) == '   10  x/custom: {"a": 1}'
