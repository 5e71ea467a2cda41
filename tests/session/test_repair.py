"""Crash repair (docs/reliability.md#crash-repair-outcomes): closers for an interrupted turn;
sans-I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import invariants
from dsh_agent_loop._session.repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, repair_events

from .logs import LogBuilder


def types(events):
    return [e.type for e in events]


def repaired(events, now=9.0):
    return list(events) + repair_events(events, now)


def test_a_closed_log_needs_nothing():
    b = LogBuilder()
    b.seed_end()
    b.turn_start(1)
    b.turn_end(1)
    b.seed_end()
    assert repair_events(b.events, 0.0) == []
    assert repair_events([], 0.0) == []


def test_an_open_turn_gets_results_step_end_and_turn_end():
    b = LogBuilder()
    b.seed_end()
    b.turn_start(3)
    b.step_start(3, 1)
    b.user("m-1", "go")
    b.assistant(3, 1, "x", calls=[("c1", "t1", {}), ("c2", "t2", {"a": 1}), ("c3", "t3", {})])
    c1 = b.tool_call(3, 1, "c1", "t1")
    c2 = b.tool_call(3, 1, "c2", "t2", '{"a": 1}')
    b.tool_result(3, 1, "c1", c1, "t1")
    closers = repair_events(b.events, 42.0)
    n = len(b.events)
    assert [e.seq for e in closers] == list(range(n, n + 5))
    assert all(e.time == 42.0 for e in closers)
    assert types(closers) == ["tool/result", "tool/call", "tool/result", "step/end", "turn/end"]
    unknown, synthetic, not_started, step_end, turn_end = closers
    assert unknown.data["message"]["call_id"] == "c2"
    assert unknown.source_event_seqs == (c2,)
    assert dict(unknown.data["error"]) == {"name": "OutcomeUnknown", "code": "TOOL_OUTCOME_UNKNOWN"}
    assert unknown.data["message"]["content"][0]["text"] == OUTCOME_UNKNOWN_TEXT
    assert unknown.data["message"]["content"][0]["is_error"] is True
    assert (unknown.data["turn"], unknown.data["step"]) == (3, 1)
    assert dict(synthetic.data) == {
        "turn": 3,
        "step": 1,
        "call_id": "c3",
        "name": "t3",
        "arguments": "{}",
    }
    assert not_started.source_event_seqs == (synthetic.seq,)
    assert not_started.data["error"]["code"] == "TOOL_NOT_STARTED"
    assert not_started.data["message"]["content"][0]["text"] == NOT_STARTED_TEXT
    assert dict(step_end.data) == {"turn": 3, "step": 1}
    assert turn_end.data["turn"] == 3
    assert dict(turn_end.data["reason"]) == {"kind": "interrupted"}
    assert invariants.check(repaired(b.events), allow_open_turn=False) == []


def test_a_closed_step_is_not_closed_again():
    b = LogBuilder()
    b.turn_start(1)
    b.step_start(1, 1)
    b.assistant(1, 1, "done")
    b.step_end(1, 1)
    assert types(repair_events(b.events, 0.0)) == ["turn/end"]


def test_only_the_open_turn_is_repaired():
    b = LogBuilder()
    b.turn_start(1)
    b.step_start(1, 1)
    b.assistant(1, 1, calls=[("old", "t", {})])
    call = b.tool_call(1, 1, "old")
    b.tool_result(1, 1, "old", call)
    b.step_end(1, 1)
    b.turn_end(1)
    b.turn_start(2)
    b.step_start(2, 1)
    b.assistant(2, 1, calls=[("new", "t", {})])
    closers = repair_events(b.events, 0.0)
    assert [
        e.data.get("call_id") or e.data.get("message", {}).get("call_id") for e in closers[:2]
    ] == [
        "new",
        "new",
    ]
    assert closers[-1].data["turn"] == 2


# -- property: any crash prefix of a well-formed log repairs into a well-formed log, once ---------


@st.composite
def crashed_logs(draw):
    """A well-formed session (several turns, steps, tool batches), cut at a random point."""
    b = LogBuilder()
    b.seed_end()
    n_turns = draw(st.integers(1, 3))
    ids = 0
    for turn in range(1, n_turns + 1):
        b.turn_start(turn)
        b.user(f"m-{turn}", "go")
        n_steps = draw(st.integers(1, 3))
        for step in range(1, n_steps + 1):
            b.step_start(turn, step)
            n_calls = draw(st.integers(0, 3))
            calls = []
            for _ in range(n_calls):
                ids += 1
                calls.append((f"c{ids}", "t", {"i": ids}))
            b.assistant(turn, step, "text" if draw(st.booleans()) else "", calls=calls)
            # dispatch and commit: calls and results each in model order, results after calls
            call_seqs = {}
            pending = [c[0] for c in calls]
            results_done = 0
            while pending or results_done < len(calls):
                can_result = results_done < len(call_seqs)
                if pending and (not can_result or draw(st.booleans())):
                    cid = pending.pop(0)
                    call_seqs[cid] = b.tool_call(turn, step, cid, "t", '{"i": 0}')
                else:
                    cid = calls[results_done][0]
                    b.tool_result(turn, step, cid, call_seqs[cid])
                    results_done += 1
            b.step_end(turn, step)
        b.turn_end(turn)
        if draw(st.booleans()):
            b.seed_end()
    events = b.events
    assert invariants.check(events, allow_open_turn=False) == []
    cut = draw(st.integers(0, len(events)))
    return events[:cut]


@settings(max_examples=300, deadline=None)
@given(crashed_logs())
def test_repair_makes_any_crash_prefix_well_formed_and_is_idempotent(prefix):
    once = repaired(prefix)
    assert invariants.check(once, allow_open_turn=False) == []
    # repair(repair(x)) adds nothing
    assert repair_events(once, 1.0) == []
    assert once[: len(prefix)] == prefix
    # a repaired turn ends interrupted; a log that needed nothing is unchanged
    closers = once[len(prefix) :]
    if closers:
        assert closers[-1].type == "turn/end"
        assert closers[-1].data["reason"]["kind"] == "interrupted"
        assert all(e.type in {"tool/call", "tool/result", "step/end", "turn/end"} for e in closers)
    else:
        assert invariants.check(prefix, allow_open_turn=False) == []
    # every model tool call has exactly one result afterwards
    results = [e.data["message"]["call_id"] for e in once if e.type == "tool/result"]
    assert len(results) == len(set(results))


def _deferred_turn(b: LogBuilder, open_turn: bool) -> tuple[int, int]:
    """Turn 1 defers c2 for approval (c1 ran); returns the tool/call seqs of c1 and c2."""
    b.seed_end()
    b.turn_start(1)
    b.step_start(1, 1)
    b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c1", "t", {}), ("c2", "t", {"x": 1})])
    c1 = b.tool_call(1, 1, "c1")
    c2 = b.tool_call(1, 1, "c2", args='{"x": 1}')
    b.add(
        "tool/approval-requested",
        {"turn": 1, "step": 1, "call_id": "c2", "name": "t", "arguments": {"x": 1}},
    )
    b.tool_result(1, 1, "c1", c1)
    if not open_turn:
        b.step_end(1, 1)
        b.add("turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "call_ids": ["c2"]}})
    return c1, c2


def test_repair_leaves_a_call_awaiting_approval_alone():
    b = LogBuilder()
    _deferred_turn(b, open_turn=True)
    closers = repair_events(b.events, 1.0)
    # no TOOL_OUTCOME_UNKNOWN / TOOL_NOT_STARTED for c2: it never ran and may still be decided
    assert types(closers) == ["step/end", "turn/end"]
    reason = closers[-1].data["reason"]
    assert reason == {"kind": "awaiting-approval", "call_ids": ("c2",)}
    log = repaired(b.events)
    assert invariants.check(log, allow_open_turn=False) == []
    assert repair_events(log, 2.0) == []  # idempotent


def test_repair_settles_what_an_open_continuation_did_not_answer():
    b = LogBuilder()
    b.seed_end()
    b.turn_start(1)
    b.step_start(1, 1)
    b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c1", "t", {}), ("c2", "t", {}), ("c3", "t", {})])
    seqs = {}
    for call_id in ("c1", "c2", "c3"):
        seqs[call_id] = b.tool_call(1, 1, call_id)
        b.add(
            "tool/approval-requested",
            {"turn": 1, "step": 1, "call_id": call_id, "name": "t", "arguments": {}},
        )
    b.step_end(1, 1)
    reason = {"kind": "awaiting-approval", "call_ids": ["c1", "c2", "c3"]}
    b.add("turn/end", {"turn": 1, "reason": reason})
    b.add("tool/approval", {"call_id": "c1", "decision": "approve"})
    b.add("tool/approval", {"call_id": "c2", "decision": "deny", "message": "no"})
    b.add("tool/approval", {"call_id": "c3", "decision": "approve"})
    b.turn_start(2)
    b.step_start(2, 1)
    b.tool_result(2, 1, "c1", seqs["c1"])  # c1 ran; the crash came while c3 ran
    closers = repair_events(b.events, 1.0)
    assert types(closers) == ["tool/result", "tool/result", "step/end", "turn/end"]
    denied, unknown = closers[0], closers[1]
    assert denied.data["message"]["call_id"] == "c2"
    assert denied.data["message"]["content"][0]["text"] == "Error: tool call denied: no"
    assert denied.data["error"]["code"] == "DENIED"
    assert denied.source_event_seqs == (seqs["c2"],)
    assert unknown.data["message"]["call_id"] == "c3"
    assert unknown.data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert unknown.data["message"]["content"][0]["text"] == OUTCOME_UNKNOWN_TEXT
    assert closers[-1].data["reason"] == {"kind": "interrupted"}
    log = repaired(b.events)
    assert invariants.check(log, allow_open_turn=False) == []
    assert repair_events(log, 2.0) == []
