"""``sessions show`` wording (``cli/_transcript.py``): turn endings, totals, one line per event."""

from __future__ import annotations

import pytest

from dsh_agent_loop.cli._transcript import (
    Reading,
    Totals,
    pending_approvals,
    plain_line,
    totals,
    transcript_lines,
    turn_end_words,
)
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
        "2 turns (1 completed, 1 cancelled) · 2 model calls (+1 failed) · 1 tool call",
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


def _ev(seq: int, type: str, data: dict, **kw: object) -> Event:
    return Event(type, seq, 0.0, data, **kw)  # type: ignore[arg-type]


CALL = {"turn": 1, "step": 1, "call_id": "c1", "name": "write_file", "arguments": '{"p":1}'}
ASKED = {"turn": 1, "step": 1, "call_id": "c1", "name": "write_file", "arguments": {"p": 1}}
ASKING_LOG = [
    _ev(0, "turn/start", {"turn": 1}),
    _ev(1, "tool/call", CALL),
    _ev(2, "tool/approval-requested", ASKED),
    _ev(3, "turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "call_ids": ["c1"]}}),
]


def test_a_call_waiting_for_approval_reads_as_waiting() -> None:
    assert transcript_lines(ASKING_LOG)[1:] == [
        '    1  tool write_file {"p":1} is waiting for approval',
        '    2  waiting for approval: write_file {"p": 1} (c1)',
        "    3  turn 1 stopped to wait for approval of 1 tool call",
    ]
    assert [dict(d) for d in pending_approvals(ASKING_LOG)] == [ASKED]
    assert totals(ASKING_LOG).lines()[-1] == "waiting for approval: 1 tool call"


def test_decisions_read_as_words() -> None:
    denied = [
        *ASKING_LOG,
        _ev(4, "tool/approval", {"call_id": "c1", "decision": "deny", "message": "no"}),
    ]
    lines = transcript_lines(denied)
    assert lines[1:3] == [
        '    1  tool write_file {"p":1} needs approval',
        '    2  approval asked: write_file {"p": 1} (c1)',
    ]
    assert lines[4] == "    4  denied: write_file (c1): no"
    assert pending_approvals(denied) == []
    cancelled = {"call_id": "c1", "decision": "deny", "message": "cancelled", "cause": "user"}
    assert plain_line(4, _ev(4, "tool/approval", cancelled), Reading.of(ASKING_LOG)) == (
        "    4  denied: write_file (c1): cancelled (by user)"
    )
    approved = _ev(5, "tool/approval", {"call_id": "c1", "decision": "approve"})
    assert plain_line(5, approved, Reading.of(ASKING_LOG)).endswith("approved: write_file (c1)")
    rule = _ev(6, "permissions/allowed", {"rule": "write_file(out.txt)"}, ignorable=True)
    assert plain_line(6, rule) == "    6  always allowed from now on: write_file(out.txt)"


def test_a_compaction_reads_as_one_with_its_summary_call() -> None:
    summary = _ev(
        5,
        "user/message",
        {
            "message": {
                "role": "user",
                "id": "m-3",
                "source": "compaction",
                "content": [
                    {"type": "text", "text": "[Summary of the earlier conversation]\nthey talked"}
                ],
            }
        },
        surface_op={"op": "replace", "start_seq": 1, "end_seq": 4},
    )
    call = {"provider": "p", "model": "m", "usage": {"input_tokens": 1500, "output_tokens": 40}}
    record = _ev(
        6,
        "context/compaction",
        {
            "start_seq": 1,
            "end_seq": 4,
            "tokens_before": 12345,
            "summary_seq": 5,
            "tokens_after": 210,
            "call": call,
        },
        ignorable=True,
    )
    assert transcript_lines([summary, record], 0) == [
        '    0  compaction: events 1..4 replaced by a summary, 12,345 → 210 tokens: "they talked"',
        "    1  summary call for the compaction at 5: p/m [1,500 in, 40 out]",
    ]
    found = totals([summary, record])
    assert (found.model_calls, found.summary_calls, found.compactions) == (1, 1, 1)
    assert (
        found.lines()[0]
        == "0 turns · 1 model call (1 for compaction) · 0 tool calls · 1 compaction"
    )
    failed = _ev(
        7,
        "context/compaction",
        {
            "start_seq": 1,
            "end_seq": 4,
            "tokens_before": 9,
            "call": {"provider": "p", "model": "m"},
            "failure": {"code": "COMPACTION_FAILED", "message": "the summary call failed: down"},
        },
        ignorable=True,
    )
    assert plain_line(7, failed) == (
        "    7  compaction of events 1..4 failed: the summary call failed: down (summary call p/m)"
    )
    assert (totals([failed]).model_calls, totals([failed]).failed_calls) == (0, 1)


def test_a_forks_first_request_says_so() -> None:
    header = {"reason": "resume", "header": {"config": {"provider": "p", "model": "m"}}}
    log = [
        _ev(0, "request/header", {"reason": "initial", "header": header["header"]}),
        _ev(1, "session/end-seed", {"inherited": True}),
        _ev(2, "request/header", header),
        _ev(3, "request/header", {**header, "reason": "series"}),
    ]
    assert [line[7:] for line in transcript_lines(log)] == [
        "model settings (first request): p/m, 0 tools",
        "session forked here",
        "model settings (first request of this fork): p/m, 0 tools",
        "model settings (new request series): p/m, 0 tools",
    ]
