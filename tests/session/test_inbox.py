"""The inbox (SPEC §5): splices at list coordinates, folded synchronously; sans-I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import Event
from dsh_agent_loop.agent.inbox import Inbox, user_message
from dsh_agent_loop.session.log import Session
from dsh_agent_loop.session.projections import InboxProjection, InvalidSpliceError


def new_inbox():
    session = Session({"session_id": "s"}, clock=lambda: 0.0)
    notes = []
    inbox = Inbox(session, lambda kind, data: notes.append((kind, data["message"]["id"])))
    return session, inbox, notes


def splices(session):
    out = []
    for e in session.events:
        assert e.type == "agent/inbox/spliced"
        d = dict(e.data)
        d["inserted"] = [m["id"] for m in d["inserted"]]
        out.append(d)
    return out


def ids(inbox, target):
    return [m["id"] for m in inbox.pending(target)]


def test_insert_assigns_session_ids_and_notifies():
    session, inbox, notes = new_inbox()
    assert inbox.insert("a") == "m-1"
    assert inbox.insert("b", "next-step") == "m-2"
    assert inbox.insert("c", index=0) == "m-3"
    assert ids(inbox, "next-turn") == ["m-3", "m-1"]
    assert ids(inbox, "next-step") == ["m-2"]
    assert splices(session) == [
        {"target": "next-turn", "start": 0, "removed_count": 0, "inserted": ["m-1"]},
        {"target": "next-step", "start": 0, "removed_count": 0, "inserted": ["m-2"]},
        {"target": "next-turn", "start": 0, "removed_count": 0, "inserted": ["m-3"]},
    ]
    assert notes == [
        ("agent/inbox/inserted", "m-1"),
        ("agent/inbox/inserted", "m-2"),
        ("agent/inbox/inserted", "m-3"),
    ]
    assert len(inbox) == 3


def test_message_ids_are_unique_across_both_lists():
    _, inbox, _ = new_inbox()
    inbox.insert("a", message_id="x")
    with pytest.raises(ValueError, match='message "x" is already pending'):
        inbox.insert("b", "next-step", message_id="x")
    assert len(inbox) == 1
    # once it is no longer pending, the id can be used again
    inbox.remove("x")
    inbox.insert("again", "next-step", message_id="x")
    assert ids(inbox, "next-step") == ["x"]


def test_coordinates_are_normalised_like_slices():
    session, inbox, _ = new_inbox()
    for text in "abc":
        inbox.insert(text)
    inbox.insert("end", index=99)
    inbox.insert("neg", index=-1)
    assert [m["content"][0]["text"] for m in inbox.next_turn] == ["a", "b", "c", "neg", "end"]
    inbox.splice("next-turn", -2, None)
    inbox.splice("next-turn", 10, 20)  # nothing removed, nothing inserted: no event
    inbox.splice("next-turn", 2, 0)  # reversed: an empty range
    stored = splices(session)
    assert stored[3] == {"target": "next-turn", "start": 3, "removed_count": 0, "inserted": ["m-4"]}
    assert stored[4] == {"target": "next-turn", "start": 3, "removed_count": 0, "inserted": ["m-5"]}
    assert stored[5] == {
        "target": "next-turn",
        "start": 3,
        "removed_count": 2,
        "inserted": [],
        "outcome": "canceled",
    }
    assert len(stored) == 6
    assert [m["content"][0]["text"] for m in inbox.next_turn] == ["a", "b", "c"]


def test_edit_remove_claim_and_clear():
    session, inbox, notes = new_inbox()
    inbox.insert("a")
    inbox.insert("b")
    inbox.insert("s", "next-step")
    notes.clear()
    inbox.edit("m-2", "B")
    assert [m["content"][0]["text"] for m in inbox.next_turn] == ["a", "B"]
    assert ids(inbox, "next-turn") == ["m-1", "m-2"]
    assert inbox.remove("m-1") is True
    assert inbox.remove("m-1") is False
    with pytest.raises(KeyError):
        inbox.edit("nope", "x")
    assert inbox.claim("next-step") == (user_message("m-3", "s"),)
    assert inbox.claim("next-step") == ()
    inbox.insert("t", "next-step")
    inbox.clear()
    inbox.clear()  # both empty: a no-op
    assert len(inbox) == 0
    tail = splices(session)[3:]
    assert tail == [
        {
            "target": "next-turn",
            "start": 1,
            "removed_count": 1,
            "inserted": ["m-2"],
            "outcome": "canceled",
        },
        {
            "target": "next-turn",
            "start": 0,
            "removed_count": 1,
            "inserted": [],
            "outcome": "canceled",
        },
        {"target": "next-step", "start": 0, "removed_count": 1, "inserted": []},
        {"target": "next-step", "start": 0, "removed_count": 0, "inserted": ["m-4"]},
        # clear: one canceled splice per non-empty list, next-step first
        {
            "target": "next-step",
            "start": 0,
            "removed_count": 1,
            "inserted": [],
            "outcome": "canceled",
        },
        {
            "target": "next-turn",
            "start": 0,
            "removed_count": 1,
            "inserted": [],
            "outcome": "canceled",
        },
    ]
    assert notes == [
        ("agent/inbox/discarded", "m-2"),
        ("agent/inbox/inserted", "m-2"),
        ("agent/inbox/discarded", "m-1"),
        ("agent/inbox/claimed", "m-3"),
        ("agent/inbox/inserted", "m-4"),
        ("agent/inbox/discarded", "m-4"),
        ("agent/inbox/discarded", "m-2"),
    ]


def test_unknown_target_is_refused():
    _, inbox, _ = new_inbox()
    with pytest.raises(ValueError, match="unknown inbox target"):
        inbox.insert("x", "sometime")


def test_user_message_shapes():
    assert dict(user_message("m-1", "hi", "runtime-context")) == {
        "role": "user",
        "id": "m-1",
        "content": ({"type": "text", "text": "hi"},),
        "source": "runtime-context",
    }
    blocks = user_message("m-2", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert [b["text"] for b in blocks["content"]] == ["a", "b"]
    nested = user_message("m-3", {"content": "inner", "source": "tool-result"})
    assert nested["source"] == "tool-result"
    assert nested["content"][0]["text"] == "inner"


@pytest.mark.parametrize(
    "data",
    [
        {"target": "next-turn", "start": 1, "removed_count": 0, "inserted": ()},
        {"target": "next-turn", "start": 0, "removed_count": 1, "inserted": ()},
        {"target": "next-turn", "start": -1, "removed_count": 0, "inserted": ()},
        {"target": "elsewhere", "start": 0, "removed_count": 0, "inserted": ()},
        {"target": "next-turn", "start": "0", "removed_count": 0, "inserted": ()},
    ],
)
def test_an_invalid_persisted_splice_is_refused(data):
    good = Event(
        "agent/inbox/spliced",
        0,
        0.0,
        {
            "target": "next-step",
            "start": 0,
            "removed_count": 0,
            "inserted": (user_message("m-1", "x"),),
        },
    )
    bad = Event("agent/inbox/spliced", 1, 0.0, data)
    with pytest.raises(InvalidSpliceError, match="invalid persisted inbox splice at session seq 1"):
        Session({"session_id": "s"}, clock=lambda: 0.0, events=[good, bad])


# -- property: random operations through the projection match a model --------------------------

targets = st.sampled_from(["next-turn", "next-step"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), targets, st.integers(-5, 8)),
        st.tuples(st.just("remove"), st.integers(0, 30)),
        st.tuples(st.just("edit"), st.integers(0, 30)),
        st.tuples(st.just("claim"), targets, st.one_of(st.none(), st.integers(0, 4))),
        st.tuples(
            st.just("splice"), targets, st.integers(-6, 6), st.integers(-6, 6), st.integers(0, 2)
        ),
        st.tuples(st.just("clear")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_random_splices_match_a_model_and_replay(ops):
    session, inbox, _ = new_inbox()
    model = {"next-turn": [], "next-step": []}
    counter = 0
    spliced = 0

    def fresh():
        nonlocal counter
        counter += 1
        return f"m-{counter}"

    for op in ops:
        kind = op[0]
        if kind == "insert":
            _, target, index = op
            new_id = inbox.insert("x", target, index=index)
            assert new_id == fresh()
            lst = model[target]
            at = slice(index, index).indices(len(lst))[0]
            lst.insert(at, new_id)
        elif kind in ("remove", "edit"):
            present = model["next-turn"] + model["next-step"]
            if not present:
                assert inbox.remove("m-999") is False
                continue
            target_id = present[op[1] % len(present)]
            if kind == "remove":
                assert inbox.remove(target_id) is True
                for lst in model.values():
                    if target_id in lst:
                        lst.remove(target_id)
            else:
                inbox.edit(target_id, f"edited {op[1]}")
        elif kind == "claim":
            _, target, count = op
            got = inbox.claim(target, count)
            n = len(model[target]) if count is None else min(count, len(model[target]))
            assert [m["id"] for m in got] == model[target][:n]
            del model[target][:n]
        elif kind == "splice":
            _, target, start, stop, n_new = op
            new = [user_message(f"n-{spliced + i}", "y") for i in range(n_new)]
            spliced += n_new
            inbox.splice(target, start, stop, new)
            lst = model[target]
            begin, end, _ = slice(start, stop).indices(len(lst))
            lst[begin : max(begin, end)] = [m["id"] for m in new]
        else:
            inbox.clear()
            model["next-turn"].clear()
            model["next-step"].clear()
        assert ids(inbox, "next-turn") == model["next-turn"]
        assert ids(inbox, "next-step") == model["next-step"]
        # ids stay unique across both lists
        everything = model["next-turn"] + model["next-step"]
        assert len(everything) == len(set(everything))
    # every stored splice is in range, and replaying the log rebuilds the same inbox
    replay = InboxProjection()
    for e in session.events:
        assert e.data["start"] >= 0
        assert e.data["removed_count"] >= 0
        replay.fold(e)
    assert replay.lists == session.inbox.lists
    rebuilt = Session({"session_id": "s"}, clock=lambda: 0.0, events=session.events)
    assert rebuilt.inbox.lists == session.inbox.lists
    assert rebuilt.inbox.max_id == session.inbox.max_id
