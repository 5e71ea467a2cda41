"""``invariants.check`` must bite: well-formed logs pass, each deliberately broken variant fails."""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop import Event, Reply, invariants, tool
from dsh_agent_loop._session.history import SurfaceProjection
from dsh_agent_loop.invariants import _RequestScan, check_messages

from .agent.conftest import harness
from .session.logs import LogBuilder, reseq


@tool
async def note(text: str) -> str:
    return f"noted {text}"


async def real_log():
    """A real session: a text turn, a tool turn with two calls, a cancelled turn."""
    replies = [
        Reply.text("hello"),
        Reply.tool_calls(("note", {"text": "a"}, "c1"), ("note", {"text": "b"}, "c2")),
        Reply.text("done"),
        Reply.hang(after_text="partial"),
    ]
    async with harness(replies, tools=[note]) as h:
        await h.run("one")
        await h.run("two")
        h.agent.followup("three")
        await trio.sleep(1)
        h.agent.cancel()
        await h.agent.wait_idle()
        return h.events


def kinds(events, **kwargs):
    return sorted({v.kind for v in invariants.check(events, **kwargs)})


def first(events, type_, **match):
    for e in events:
        if e.type == type_ and all(e.data.get(k) == v for k, v in match.items()):
            return e
    raise AssertionError(f"no {type_} {match}")


def result_of(events, call_id):
    return next(
        e for e in events if e.type == "tool/result" and e.data["message"]["call_id"] == call_id
    )


async def test_a_real_log_is_well_formed(autojump_clock):
    events = await real_log()
    assert invariants.check(events) == []
    assert invariants.check(events, allow_open_turn=False) == []


async def test_dropping_a_tool_result_is_caught(autojump_clock):
    events = await real_log()
    broken = reseq([e for e in events if e is not result_of(events, "c2")])
    violations = invariants.check(broken)
    assert {v.kind for v in violations} >= {"tool-call"}
    assert any("c2" in v.message and "tool/result" in v.message for v in violations)
    # the next request would carry an unanswered call
    assert "request" in kinds(broken)


async def test_a_duplicated_seq_is_caught(autojump_clock):
    events = await real_log()
    broken = list(events)
    broken[5] = broken[5].with_seq(4)
    violations = invariants.check(broken)
    assert [(v.kind, v.seq) for v in violations if v.kind == "seq"] == [("seq", 4)]
    gap = list(events[:3]) + list(events[4:])
    assert "seq" in kinds(gap)


async def test_an_unknown_type_is_caught_unless_ignorable(autojump_clock):
    events = await real_log()
    unknown = Event("agent/mystery", len(events), 0.0, {})
    assert kinds([*events, unknown]) == ["unknown-type"]
    ignorable = Event("agent/mystery", len(events), 0.0, {}, ignorable=True)
    assert invariants.check([*events, ignorable]) == []


async def test_unbalanced_steps_are_caught(autojump_clock):
    events = await real_log()
    step_end = first(events, "step/end")
    assert "step" in kinds(reseq([e for e in events if e is not step_end]))
    step_start = first(events, "step/start")
    assert "step" in kinds(reseq([e for e in events if e is not step_start]))
    extra = Event("step/end", None, 0.0, {"turn": 1, "step": 1})
    i = events.index(step_end)
    assert "step" in kinds(reseq([*events[: i + 1], extra, *events[i + 1 :]]))


async def test_a_result_citing_the_wrong_call_is_caught(autojump_clock):
    events = await real_log()
    c1_call = first(events, "tool/call", call_id="c1")
    c2_result = result_of(events, "c2")
    broken = [
        Event(e.type, e.seq, e.time, e.data, source_event_seqs=(c1_call.seq,))
        if e is c2_result
        else e
        for e in events
    ]
    violations = invariants.check(broken)
    assert [(v.kind, v.seq) for v in violations] == [("tool-result", c2_result.seq)]
    uncited = [Event(e.type, e.seq, e.time, e.data) if e is c2_result else e for e in events]
    assert kinds(uncited) == ["tool-result"]


async def test_missing_tool_call_and_duplicate_result_are_caught(autojump_clock):
    events = await real_log()
    call = first(events, "tool/call", call_id="c1")
    without_call = reseq([e for e in events if e is not call])
    assert "tool-call" in kinds(without_call) or "tool-result" in kinds(without_call)
    result = result_of(events, "c1")
    i = events.index(result)
    duplicated = reseq([*events[: i + 1], result, *events[i + 1 :]])
    assert any("second tool/result" in v.message for v in invariants.check(duplicated))


async def test_turns_without_ends_are_caught(autojump_clock):
    events = await real_log()
    first_end = first(events, "turn/end")
    assert "turn" in kinds(reseq([e for e in events if e is not first_end]))
    # the last turn may be open in a live session, not in a closed one
    assert events[-1].type == "turn/end"
    open_tail = events[:-1]
    assert "turn" not in kinds(open_tail)
    assert "turn" in kinds(open_tail, allow_open_turn=False)
    stray = Event("turn/end", len(events), 0.0, {"turn": 9, "reason": {"kind": "completed"}})
    assert kinds([*events, stray]) == ["turn"]


def test_surface_op_misuse_is_caught():
    b = LogBuilder()
    b.add("turn/start", {"turn": 1}, surface_op="append")
    assert [v.kind for v in invariants.check(b.events)] == ["surface-op"]
    b = LogBuilder()
    b.user("m-1", "x")
    b.add(
        "user/message",
        {"message": {"role": "user", "id": "m-2", "content": ()}},
        surface_op={"op": "replace", "start_seq": 5, "end_seq": 5},
    )
    assert [v.kind for v in invariants.check(b.events)] == ["surface-op"]


def test_a_user_message_between_a_call_and_its_result_breaks_the_request():
    b = LogBuilder()
    b.turn_start(1)
    b.step_start(1, 1)
    b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c1", "t", {})])
    call = b.tool_call(1, 1, "c1")
    b.user("m-2", "interloper")
    b.tool_result(1, 1, "c1", call)
    b.assistant(1, 1, "again")  # a request point sees the broken history
    b.step_end(1, 1)
    b.turn_end(1)
    assert "request" in {v.kind for v in invariants.check(b.events)}


@pytest.mark.parametrize(
    ("messages", "problems"),
    [
        ([{"role": "user", "content": ()}], 0),
        ([{"role": "tool", "call_id": "x", "content": ()}], 1),
        (
            [
                {"role": "assistant", "content": ({"type": "tool-call", "call_id": "a"},)},
                {"role": "tool", "call_id": "a", "content": ()},
                {"role": "user", "content": ()},
            ],
            0,
        ),
        (
            [
                {"role": "assistant", "content": ({"type": "tool-call", "call_id": "a"},)},
                {"role": "user", "content": ()},
            ],
            1,
        ),
    ],
)
def test_check_messages(messages, problems):
    assert len(check_messages(messages)) == problems


def test_violations_print_kind_and_seq():
    b = LogBuilder()
    b.add("step/end", {"turn": 1, "step": 1})
    (v,) = invariants.check(b.events)
    assert str(v) == "step: seq 0: step/end without an open step"


def _awaiting_log() -> LogBuilder:
    """Turn 1 ends awaiting approval of c1."""
    b = LogBuilder()
    b.seed_end()
    b.turn_start(1)
    b.step_start(1, 1)
    b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c1", "t", {})])
    b.tool_call(1, 1, "c1")
    b.add(
        "tool/approval-requested",
        {"turn": 1, "step": 1, "call_id": "c1", "name": "t", "arguments": {}},
    )
    b.step_end(1, 1)
    b.add("turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "call_ids": ["c1"]}})
    return b


def test_a_call_awaiting_approval_is_accepted_and_its_continuation_answers_it():
    b = _awaiting_log()
    assert invariants.check(b.events, allow_open_turn=False) == []
    b.add("tool/approval", {"call_id": "c1", "decision": "approve"})
    b.turn_start(2)
    b.step_start(2, 1)
    b.tool_result(2, 1, "c1", 5)
    b.assistant(2, 1, "done")
    b.step_end(2, 1)
    b.turn_end(2)
    assert invariants.check(b.events, allow_open_turn=False) == []


def test_a_deferred_call_never_answered_is_caught():
    b = _awaiting_log()
    b.turn_start(2)
    b.step_start(2, 1)
    b.assistant(2, 1, "done")
    b.step_end(2, 1)
    b.turn_end(2)
    assert kinds(b.events) == ["tool-call"]


def test_a_deferred_call_in_a_turn_not_awaiting_approval_is_caught():
    b = _awaiting_log()
    events = [*b.events[:-1], b.events[-1].with_seq(b.events[-1].seq)]
    end = events[-1]
    events[-1] = Event(end.type, end.seq, end.time, {"turn": 1, "reason": {"kind": "completed"}})
    assert kinds(events) == ["tool-call"]


def test_a_user_message_before_the_deferred_result_is_caught():
    b = _awaiting_log()
    b.add("tool/approval", {"call_id": "c1", "decision": "approve"})
    b.turn_start(2)
    b.step_start(2, 1)
    b.user("m-2", "sneaked in")
    b.tool_result(2, 1, "c1", 5)
    b.assistant(2, 1, "done")
    b.step_end(2, 1)
    b.turn_end(2)
    assert kinds(b.events) == ["request"]


def test_a_granted_permission_rule_is_accepted_between_turns():
    b = _awaiting_log()
    # a durable type: accepted whether or not it is marked ignorable
    b.add("permissions/allowed", {"rule": "run_command(git status)", "call_id": "c1"})
    b.add("tool/approval", {"call_id": "c1", "decision": "approve"})
    assert invariants.check(b.events) == []


@pytest.mark.parametrize("rule", ["run_command(", "", None, 5])
def test_a_granted_rule_that_does_not_parse_is_caught(rule):
    b = _awaiting_log()
    b.add("permissions/allowed", {"rule": rule, "call_id": "c1"}, ignorable=True)
    assert kinds(b.events) == ["permission"]


def test_an_approval_of_no_pending_call_is_caught():
    b = _awaiting_log()
    b.add("tool/approval", {"call_id": "zz", "decision": "approve"})
    assert kinds(b.events) == ["approval"]


def _broken_then_replaced() -> LogBuilder:
    """A history broken by an interloper, two request points, then the range replaced."""
    b = LogBuilder()
    b.turn_start(1)
    b.step_start(1, 1)
    first_user = b.user("m-1", "go")
    b.assistant(1, 1, calls=[("c1", "t", {})])
    call = b.tool_call(1, 1, "c1")
    b.user("m-2", "interloper")
    last = b.tool_result(1, 1, "c1", call)
    b.assistant(1, 1, "again")  # request point: both problems
    b.add("assistant/attempt", {"turn": 1, "step": 1})  # request point: the same two again
    b.add(
        "user/message",
        {"message": {"role": "user", "id": "m-3", "content": ({"type": "text", "text": "s"},)}},
        surface_op={"op": "replace", "start_seq": first_user, "end_seq": last},
    )
    b.assistant(1, 1, "after")  # request point on the replaced, well-formed history
    b.step_end(1, 1)
    b.turn_end(1)
    return b


def test_each_request_point_reports_what_a_full_check_of_its_history_reports():
    b = _broken_then_replaced()
    surface = SurfaceProjection()
    expected = []
    for event in b.events:
        if event.type in ("assistant/message", "assistant/attempt"):
            expected += [(event.seq, p) for p in check_messages(surface.messages())]
        surface.fold(event)
    found = [(v.seq, v.message) for v in invariants.check(b.events) if v.kind == "request"]
    assert found == expected
    assert [seq for seq, _ in found] == [7, 7, 8, 8]  # nothing after the replacement


def test_a_request_check_is_linear_in_the_history(monkeypatch):
    b = LogBuilder()
    b.turn_start(1)
    b.step_start(1, 1)
    b.user("m-1", "go")
    for n in range(2000):
        b.assistant(1, 1, f"a{n}")
    b.step_end(1, 1)
    b.turn_end(1)
    folded = 0
    original = _RequestScan.extend

    def counting(self, messages, start):
        nonlocal folded
        folded += len(messages) - start
        original(self, messages, start)

    monkeypatch.setattr(_RequestScan, "extend", counting)
    assert invariants.check(b.events) == []
    assert folded == 2000  # each message is folded once, not once per later request point


async def test_a_replacement_that_shadows_node_0_is_caught(autojump_clock):
    events = await real_log()
    node0 = first(events, "system/message")
    user = first(events, "user/message")
    end = len(events)
    summary = {"role": "user", "id": "m-99", "content": ({"type": "text", "text": "s"},)}
    bad = Event(
        "user/message",
        end,
        0.0,
        {"message": summary},
        surface_op={"op": "replace", "start_seq": node0.seq, "end_seq": user.seq},
    )
    assert "surface-op" in kinds([*events, bad])
    good = Event(
        "user/message",
        end,
        0.0,
        {"message": summary},
        surface_op={"op": "replace", "start_seq": user.seq, "end_seq": user.seq},
    )
    assert invariants.check([*events, good]) == []


async def test_many_unknown_types_leave_the_checker_s_per_type_table_bounded(autojump_clock):
    events = await real_log()
    hostile = [
        Event(f"future/t{i}", len(events) + i, 0.0, {}, ignorable=i % 2 == 0) for i in range(400)
    ]
    found = invariants.check([*events, *hostile])
    assert [v.seq for v in found] == [e.seq for e in hostile if not e.ignorable]
    assert {v.kind for v in found} == {"unknown-type"}
    # what the checker works out per type is kept for durable types only
    assert set(invariants._KINDS) <= set(invariants.DURABLE_TYPES)


def test_the_per_type_table_is_read_only_and_complete_at_import():
    import subprocess
    import sys

    # a fresh process: nothing has been checked yet when the table is read
    code = (
        "from types import MappingProxyType\n"
        "from dsh_agent_loop import invariants\n"
        "table = invariants._KINDS\n"
        "assert type(table) is MappingProxyType, type(table)\n"
        "assert set(table) == set(invariants.DURABLE_TYPES), set(table)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    with pytest.raises(TypeError):
        invariants._KINDS["future/type"] = invariants._KINDS["turn/start"]  # type: ignore[index]
    handler, surface = invariants._KINDS["tool/result"]
    assert handler is invariants._Checker._tool_result
    assert surface is True
    assert invariants._KINDS["turn/start"][1] is False
