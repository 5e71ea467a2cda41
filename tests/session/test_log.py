"""``Session`` (``_session/log.py``): dense seqs, projections folded before return, pending."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_agent_loop._frozen import freeze
from dsh_agent_loop._session.log import Session, SessionView
from dsh_agent_loop.events import Event


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def new_session(events: list[Event] | None = None) -> Session:
    return Session({"session_id": "s1", "extra": [1]}, clock=Clock(), events=events or [])


def user(message_id: str, text: str, **kw: Any) -> Event:
    message = {"role": "user", "id": message_id, "content": ({"type": "text", "text": text},)}
    return Event("user/message", None, 0.0, {"message": message}, **kw)


def texts(session: Session) -> list[str]:
    return [m["content"][0]["text"] for m in session.derive_messages()]


class Recorder:
    def __init__(self, types: frozenset[str] | None) -> None:
        self.types = types
        self.seen: list[tuple[str, int | None]] = []

    def fold(self, event: Event) -> None:
        self.seen.append((event.type, event.seq))


def test_header_is_frozen_and_id_read_from_it():
    session = new_session()
    assert session.id == "s1"
    assert session.header == {"session_id": "s1", "extra": (1,)}
    with pytest.raises(TypeError):
        session.header["x"] = 1  # type: ignore[index]
    assert len(session) == 0
    assert session.last_seq == -1


def test_append_assigns_dense_seqs_and_one_time_per_batch():
    session = new_session()
    first = session.append(Event("turn/start", 99, 0.0, {"turn": 1}), user("m-1", "a"))
    second = session.append(user("m-2", "b"))
    assert [e.seq for e in first + second] == [0, 1, 2]
    assert [e.time for e in first + second] == [1.0, 1.0, 2.0]
    assert session.events == first + second
    assert session.event(1) == first[1]
    assert session.last_seq == 2
    assert len(session) == 3
    assert session.append() == []


def test_projections_reflect_the_batch_when_append_returns():
    session = new_session()
    session.append(user("m-1", "hello"))
    assert texts(session) == ["hello"]
    session.add("user/message", freeze(user("m-2", "again").data))
    assert texts(session) == ["hello", "again"]


def test_add_builds_an_event_from_frozen_data():
    session = new_session()
    session.append(user("m-1", "x"))
    event = session.add("turn/start", freeze({"turn": 1}), source_event_seqs=(0,))
    assert (event.seq, event.time, event.type) == (1, 2.0, "turn/start")
    assert event.source_event_seqs == (0,)
    assert session.event(1) is event


def test_pending_events_are_taken_once_by_the_writer():
    session = new_session()
    assert not session.has_pending()
    appended = session.append(user("m-1", "a"), user("m-2", "b"))
    added = session.add("turn/start", freeze({"turn": 1}))
    assert session.has_pending()
    assert session.take_pending() == [*appended, added]
    assert not session.has_pending()
    assert session.take_pending() == []
    assert len(session) == 3  # taking pending events does not remove them from the log


def test_pending_events_follow_the_stored_ones_and_taking_them_leaves_no_list_behind():
    source = new_session()
    source.append(user("m-1", "a"), user("m-2", "b"))
    session = new_session(source.events)  # resumed: two events already stored
    assert (session.pending_count(), session.pending_events()) == (0, [])
    first = session.add("turn/start", freeze({"turn": 1}))
    (second,) = session.append(user("m-3", "c"))
    assert session.pending_count() == 2
    assert session.pending_events() == [first, second]
    assert session.pending_events() == [first, second]  # reading them does not take them
    batch = session.take_pending()
    assert batch == [first, second]
    assert (session.pending_count(), session.has_pending()) == (0, False)
    batch.clear()  # the writer's batch is its own: the log keeps every event
    assert session.events[2:] == [first, second]
    assert [e.seq for e in session.take_pending()] == []
    third = session.add("turn/end", freeze({"turn": 1, "reason": {"kind": "completed"}}))
    assert session.take_pending() == [third]


def test_appends_wake_the_writer_on_the_first_pending_event_and_at_the_wake_limit():
    session = new_session()
    wakes: list[int] = []

    class Writer:
        def wake(self) -> None:
            wakes.append(len(session))

    session.waker = Writer()
    session.wake_limit = 3
    for _ in range(4):
        session.add("turn/start", freeze({"turn": 1}))
    assert wakes == [1, 3, 4]  # first pending, then every add at or over the limit
    session.take_pending()
    session.append(user("m-1", "x"))  # append always wakes
    session.append()
    assert wakes == [1, 3, 4, 5]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (Event("no/such-type", None, 0.0, {}), "unknown event type 'no/such-type'"),
        (Event("turn/start", None, 0.0, {}, surface_op="append"), "surface_op is not allowed"),
        (user("m-9", "x", surface_op={"op": "drop"}), "unknown surface_op"),
        (
            user("m-9", "x", surface_op={"op": "replace", "start_seq": 5, "end_seq": 5}),
            "surface replace names seqs 5..5 not on the surface",
        ),
    ],
)
def test_a_bad_event_refuses_the_whole_batch(event, message):
    session = new_session()
    session.append(user("m-1", "a"))
    with pytest.raises(ValueError, match=message):
        session.append(user("m-2", "b"), event)
    assert len(session) == 1
    assert texts(session) == ["a"]
    assert session.take_pending() == session.events


def test_an_unknown_ignorable_type_is_kept():
    session = new_session()
    (event,) = session.append(Event("future/x", None, 0.0, {"v": 1}, ignorable=True))
    assert session.events == [event]


def test_a_surface_replace_swaps_the_named_range():
    session = new_session()
    session.append(user("m-1", "a"), user("m-2", "b"), user("m-3", "c"))
    op = {"op": "replace", "start_seq": 0, "end_seq": 1}
    session.append(user("m-4", "ab", surface_op=op))
    assert texts(session) == ["ab", "c"]
    # the surface now reads seqs [3, 2]: a range must run forward in surface order
    backwards = {"op": "replace", "start_seq": 2, "end_seq": 3}
    with pytest.raises(ValueError, match="not on the surface"):
        session.append(user("m-5", "x", surface_op=backwards))
    # a replace may name an event appended earlier in the same batch
    session.append(
        user("m-6", "d"),
        user("m-7", "d2", surface_op={"op": "replace", "start_seq": 4, "end_seq": 4}),
    )
    assert texts(session) == ["ab", "c", "d2"]


def test_replay_rebuilds_projections_and_refuses_gaps_and_unknown_types():
    source = new_session()
    source.append(user("m-1", "a"), Event("turn/start", None, 0.0, {"turn": 1}), user("m-2", "b"))
    rebuilt = new_session(source.events)
    assert rebuilt.events == source.events
    assert texts(rebuilt) == ["a", "b"]
    assert not rebuilt.has_pending()  # replayed events are already stored
    with pytest.raises(ValueError, match="stored seq 2 is not dense"):
        new_session([source.event(0), source.event(2)])
    with pytest.raises(ValueError, match="unknown event type"):
        new_session([Event("no/such", 0, 0.0, {})])


def test_register_projection_replays_then_folds_matching_types():
    session = new_session()
    session.append(user("m-1", "a"), Event("turn/start", None, 0.0, {"turn": 1}))
    only_turns = Recorder(frozenset({"turn/start"}))
    everything = Recorder(None)
    late = Recorder(None)
    session.register_projection(only_turns)
    session.register_projection(everything)
    session.register_projection(late, replay=False)
    session.append(user("m-2", "b"))
    session.add("turn/start", freeze({"turn": 2}))
    assert only_turns.seen == [("turn/start", 1), ("turn/start", 3)]
    assert everything.seen == [
        ("user/message", 0),
        ("turn/start", 1),
        ("user/message", 2),
        ("turn/start", 3),
    ]
    assert late.seen == [("user/message", 2), ("turn/start", 3)]


def test_session_view_reads_through_to_the_session():
    session = new_session()
    view = SessionView(session)
    session.append(user("m-1", "a"))
    assert view.id == "s1"
    assert view.header is session.header
    assert view.events == session.events
    assert len(view) == 1
    assert [m["content"][0]["text"] for m in view.derive_messages()] == ["a"]
    view.events.clear()  # a copy
    assert len(session) == 1
