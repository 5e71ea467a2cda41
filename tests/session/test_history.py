"""Derived history (docs/design.md#derived-history): the surface projection, replacements and
``derive_messages``."""

from __future__ import annotations

import gc
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import Event
from dsh_agent_loop._session.history import MessagesView, SurfaceProjection, message_text
from dsh_agent_loop._session.log import Session

from .logs import LogBuilder


def new_session(events=()):
    return Session({"session_id": "s"}, clock=lambda: 1.5, events=events)


def msg(role, text):
    content = ({"type": "text", "text": text},) if text else ()
    return {"role": role, "content": content}


def surface_event(kind, text, op=None):
    type_ = {"system": "system/message", "user": "user/message", "assistant": "assistant/message"}[
        kind
    ]
    return Event(type_, None, 0.0, {"message": msg(kind, text)}, surface_op=op)


def test_log_only_and_lifecycle_events_never_reach_the_model():
    b = LogBuilder()
    b.seed_end()
    b.turn_start(1)
    b.add(
        "agent/inbox/spliced",
        {"target": "next-turn", "start": 0, "removed_count": 0, "inserted": ()},
    )
    b.step_start(1, 1)
    b.system(1, 1, "")
    b.user("m-1", "hi")
    b.add("request/header", {"header": {"config": {}}, "reason": "initial"})
    b.add("request/context", {"provider": "p", "model": "m"})
    b.add("assistant/attempt", {"turn": 1, "step": 1, "stream": {"attempt": 1, "text": "lost"}})
    b.assistant(1, 1, "partial", calls=[("c1", "t", {})], interrupted=True)
    call = b.tool_call(1, 1, "c1")
    b.tool_result(1, 1, "c1", call, text="aborted")
    b.step_end(1, 1)
    b.turn_end(1, "aborted")
    session = new_session(b.events)
    messages = session.derive_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert message_text(messages[1]) == "partial"
    assert messages[2]["content"][0]["text"] == "aborted"


def test_session_append_assigns_seqs_and_time_and_checks_types():
    session = new_session()
    (e,) = session.append(Event("turn/start", 99, 0.0, {"turn": 1}))
    assert (e.seq, e.time) == (0, 1.5)
    with pytest.raises(ValueError, match="unknown event type"):
        session.append(Event("made/up", None, 0.0, {}))
    (ok,) = session.append(Event("made/up", None, 0.0, {}, ignorable=True))
    assert ok.seq == 1
    with pytest.raises(ValueError, match="surface_op"):
        session.append(Event("turn/end", None, 0.0, {"turn": 1}, surface_op="append"))
    with pytest.raises(ValueError, match="not on the surface"):
        session.append(surface_event("user", "x", {"op": "replace", "start_seq": 0, "end_seq": 0}))
    # nothing of a refused batch was appended
    assert len(session) == 2
    with pytest.raises(ValueError, match="not dense"):
        new_session([Event("turn/start", 1, 0.0, {"turn": 1})])


def test_a_refused_batch_appends_nothing_even_when_a_later_event_is_bad():
    # Session.append documents: "Nothing of the batch is appended then."
    session = new_session()
    good = surface_event("user", "fine")
    bad = surface_event("user", "bad", {"op": "replace", "start_seq": 7, "end_seq": 7})
    with pytest.raises(ValueError, match="not on the surface"):
        session.append(good, bad)
    assert len(session) == 0
    assert list(session.derive_messages()) == []
    assert not session.has_pending()


def test_a_batch_may_replace_an_event_appended_earlier_in_the_same_batch():
    session = new_session()
    first, second = session.append(
        surface_event("user", "draft"),
        surface_event("user", "final", {"op": "replace", "start_seq": 0, "end_seq": 0}),
    )
    assert (first.seq, second.seq) == (0, 1)
    assert [message_text(m) for m in session.derive_messages()] == ["final"]


def test_replacement_swaps_a_range_and_earlier_views_keep_what_they_showed():
    session = new_session()
    session.append(surface_event("system", "S"))
    u1, a1, u2 = session.append(
        surface_event("user", "one"),
        surface_event("assistant", "two"),
        surface_event("user", "three"),
    )
    before = session.derive_messages()
    generation = session.surface.generation
    session.append(
        surface_event("user", "summary", {"op": "replace", "start_seq": u1.seq, "end_seq": a1.seq})
    )
    after = session.derive_messages()
    assert [message_text(m) for m in after] == ["S", "summary", "three"]
    assert [message_text(m) for m in before] == ["S", "one", "two", "three"]
    assert session.surface.generation == generation + 1
    # a replacement can itself be replaced (start/end name events on the surface now)
    summary_seq = session.events[-1].seq
    session.append(
        surface_event(
            "user", "shorter", {"op": "replace", "start_seq": summary_seq, "end_seq": u2.seq}
        )
    )
    assert [message_text(m) for m in session.derive_messages()] == ["S", "shorter"]
    with pytest.raises(ValueError):
        session.append(
            surface_event("user", "x", {"op": "replace", "start_seq": u1.seq, "end_seq": u1.seq})
        )


def test_messages_view_is_an_immutable_prefix():
    items = [{"n": 1}, {"n": 2}, {"n": 3}]
    view = MessagesView(items, 2)
    items.append({"n": 4})
    assert len(view) == 2
    assert list(view) == [{"n": 1}, {"n": 2}]
    assert view[-1] == {"n": 2}
    assert view[0:5] == ({"n": 1}, {"n": 2})
    with pytest.raises(IndexError):
        view[2]
    assert view == [{"n": 1}, {"n": 2}]
    assert view != [{"n": 1}]


def test_messages_view_is_a_read_only_sequence_the_collector_does_not_track():
    items = [{"n": 1}, {"n": 2}, {"n": 1}, {"n": 9}]
    view = MessagesView(items, 3)
    assert isinstance(view, Sequence)
    assert {"n": 2} in view
    assert {"n": 9} not in view
    assert list(reversed(view)) == [{"n": 1}, {"n": 2}, {"n": 1}]
    assert view.index({"n": 1}) == 0
    assert view.index({"n": 1}, 1) == 2
    assert view.index({"n": 1}, -2) == 2
    with pytest.raises(ValueError):
        view.index({"n": 2}, 0, 1)
    with pytest.raises(ValueError):
        view.index({"n": 9})  # past the view's end
    assert view.count({"n": 1}) == 2
    assert not gc.is_tracked(view)
    with pytest.raises(TypeError):
        hash(view)


def test_empty_system_nodes_are_nodes_but_not_messages():
    session = new_session()
    (head,) = session.append(surface_event("system", ""))
    session.append(surface_event("user", "u"))
    assert [e.seq for e in session.surface.system_nodes] == [head.seq]
    assert [m["role"] for m in session.derive_messages()] == ["user"]


# -- property: incremental derivation equals a naive recomputation --------------------------------

roles = st.sampled_from(["system", "user", "assistant"])


@st.composite
def histories(draw):
    """Random append/replace batches; a replace names a random range of the current surface."""
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.booleans()) or not ops:
            ops.append(("append", draw(roles), draw(st.sampled_from(["", "a", "b", "c"]))))
        else:
            i = draw(st.integers(0, 50))
            j = draw(st.integers(0, 50))
            ops.append(("replace", draw(roles), draw(st.sampled_from(["", "r", "s"])), i, j))
        if draw(st.integers(0, 4)) == 0:
            ops.append(("noise",))
    return ops


def naive_messages(events):
    """Recompute the derived history from scratch: replay every surface op over a list."""
    surface = []
    for e in events:
        if "message" not in e.data or e.type == "tool/call":
            continue
        op = e.surface_op
        if op is None or op == "append":
            surface.append(e)
            continue
        seqs = [x.seq for x in surface]
        i, j = seqs.index(op["start_seq"]), seqs.index(op["end_seq"])
        surface = [*surface[:i], e, *surface[j + 1 :]]
    return [
        e.data["message"]
        for e in surface
        if not (e.type == "system/message" and len(e.data["message"]["content"]) == 0)
    ]


@settings(max_examples=200, deadline=None)
@given(histories())
def test_incremental_derivation_equals_naive_recomputation(ops):
    session = new_session()
    views = []
    for op in ops:
        if op[0] == "noise":
            session.append(Event("turn/start", None, 0.0, {"turn": 1}))
        elif op[0] == "append":
            session.append(surface_event(op[1], op[2]))
        else:
            entries = session.surface.entries
            if not entries:
                continue
            i, j = sorted((op[3] % len(entries), op[4] % len(entries)))
            span = {"op": "replace", "start_seq": entries[i].seq, "end_seq": entries[j].seq}
            session.append(surface_event(op[1], op[2], span))
        view = session.derive_messages()
        views.append((len(session), view, list(view)))
        assert list(view) == naive_messages(session.events)
        expected_nodes = [e for e in session.surface.entries if e.type == "system/message"]
        assert list(session.surface.system_nodes) == expected_nodes
    # earlier views never change, whatever came later
    for n, view, snapshot in views:
        assert list(view) == snapshot
        assert snapshot == naive_messages(session.events[:n])
    # replaying the log gives the same surface
    replayed = new_session(session.events)
    assert list(replayed.derive_messages()) == list(session.derive_messages())
    assert replayed.surface.generation == session.surface.generation


def test_projection_ignores_non_surface_types():
    projection = SurfaceProjection()
    projection.fold(Event("turn/start", 0, 0.0, {"turn": 1}))
    assert projection.entries == []


@st.composite
def batches(draw):
    """Batches of 1-3 surface events whose replacements may name any seq (valid or not)."""
    out = []
    for _ in range(draw(st.integers(1, 12))):
        batch = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                batch.append(("append", draw(roles), draw(st.sampled_from(["", "a", "b"]))))
            else:
                start = draw(st.integers(0, 20))
                end = draw(st.integers(start - 2, start + 3))
                batch.append(("replace", draw(roles), draw(st.sampled_from(["", "r"])), start, end))
        out.append(batch)
    return out


def naive_apply(surface_seqs, first_seq, batch):
    """The surface seqs after ``batch``, or None when the batch must be refused as a whole."""
    seqs = list(surface_seqs)
    for k, op in enumerate(batch):
        seq = first_seq + k
        if op[0] == "append":
            seqs.append(seq)
            continue
        start, end = op[3], op[4]
        if start not in seqs or end not in seqs or seqs.index(end) < seqs.index(start):
            return None
        seqs[seqs.index(start) : seqs.index(end) + 1] = [seq]
    return seqs


@settings(max_examples=200, deadline=None)
@given(batches())
def test_a_batch_is_appended_whole_or_not_at_all(all_batches):
    session = new_session()
    for batch in all_batches:
        before_events = session.events
        before_messages = list(session.derive_messages())
        expected = naive_apply([e.seq for e in session.surface.entries], len(session), batch)
        events = []
        for op in batch:
            if op[0] == "append":
                events.append(surface_event(op[1], op[2]))
            else:
                events.append(
                    surface_event(
                        op[1], op[2], {"op": "replace", "start_seq": op[3], "end_seq": op[4]}
                    )
                )
        if expected is None:
            with pytest.raises(ValueError):
                session.append(*events)
            assert session.events == before_events
            assert list(session.derive_messages()) == before_messages
        else:
            session.append(*events)
            assert [e.seq for e in session.surface.entries] == expected
        assert list(session.derive_messages()) == naive_messages(session.events)


def test_register_projection_replays_the_log_unless_asked_not_to():
    class Counter:
        types = frozenset({"turn/start"})

        def __init__(self):
            self.seen = []

        def fold(self, event):
            self.seen.append(event.seq)

    session = new_session()
    session.append(
        Event("turn/start", None, 0.0, {"turn": 1}),
        Event("turn/end", None, 0.0, {"turn": 1, "reason": {"kind": "completed"}}),
    )
    replayed, fresh = Counter(), Counter()
    session.register_projection(replayed)
    session.register_projection(fresh, replay=False)
    session.append(Event("turn/start", None, 0.0, {"turn": 2}))
    assert replayed.seen == [0, 2]
    assert fresh.seen == [2]
