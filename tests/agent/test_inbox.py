"""The inbox (``_agent/inbox.py``, docs/design.md#inbox): splices at list coordinates, folded
synchronously."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import AgentOptions, Event, MemoryStore, Reply, ScriptedModel, open_runtime
from dsh_agent_loop._agent.inbox import Inbox, user_message
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._session.log import Session
from dsh_agent_loop._session.projections import InboxProjection


def new_inbox():
    session = Session({"session_id": "s"}, clock=lambda: 0.0)
    notes = []
    inbox = Inbox(
        session,
        SimpleNamespace(notify=lambda kind, data: notes.append((kind, data["message"]["id"]))),
    )
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


# -- bigger queues: the id index and the claimed-prefix compaction -------------------------------

bulk_operations = st.lists(
    st.one_of(
        st.tuples(st.just("fill"), targets, st.integers(1, 40)),
        st.tuples(st.just("claim"), targets, st.one_of(st.none(), st.integers(0, 45))),
        st.tuples(st.just("remove"), st.integers(0, 200)),
        st.tuples(st.just("edit"), st.integers(0, 200)),
        st.tuples(st.just("duplicate"), st.integers(0, 200)),
        st.tuples(st.just("insert"), targets, st.integers(-50, 50)),
        st.tuples(st.just("clear")),
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(bulk_operations)
def test_long_queues_match_a_model_and_replay(ops):
    """Past the index threshold and the compaction point the fold still matches a plain list."""
    session, inbox, _ = new_inbox()
    model = {"next-turn": [], "next-step": []}
    for op in ops:
        kind = op[0]
        present = model["next-turn"] + model["next-step"]
        if kind == "fill":
            _, target, k = op
            model[target].extend(inbox.insert("x", target) for _ in range(k))
        elif kind == "claim":
            _, target, count = op
            n = len(model[target]) if count is None else min(count, len(model[target]))
            assert [m["id"] for m in inbox.claim(target, count)] == model[target][:n]
            del model[target][:n]
        elif kind == "insert":
            _, target, index = op
            lst = model[target]
            lst.insert(
                slice(index, index).indices(len(lst))[0], inbox.insert("y", target, index=index)
            )
        elif kind == "clear":
            inbox.clear()
            model["next-turn"].clear()
            model["next-step"].clear()
        elif present:
            chosen = present[op[1] % len(present)]
            if kind == "remove":
                assert inbox.remove(chosen) is True
                for lst in model.values():
                    if chosen in lst:
                        lst.remove(chosen)
            elif kind == "edit":
                inbox.edit(chosen, "edited")
            else:
                with pytest.raises(ValueError, match=f'message "{chosen}" is already pending'):
                    inbox.insert("again", "next-step", message_id=chosen)
        assert ids(inbox, "next-turn") == model["next-turn"]
        assert ids(inbox, "next-step") == model["next-step"]
        assert len(inbox) == len(model["next-turn"]) + len(model["next-step"])
        assert session.inbox.ids() == {*model["next-turn"], *model["next-step"]}
        assert inbox.find("m-0") is None
    rebuilt = Session({"session_id": "s"}, clock=lambda: 0.0, events=session.events)
    assert rebuilt.inbox.lists == session.inbox.lists
    assert rebuilt.inbox.max_id == session.inbox.max_id


# -- cost: a splice does work for what it changes, never for the whole queue ---------------------

ID_READS = [0]


class CountedMessage(FrozenDict):
    """A message that counts how often anything reads its fields."""

    def __getitem__(self, key: str) -> Any:
        ID_READS[0] += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        ID_READS[0] += 1
        return super().get(key, default)


def field_reads_per_operation(queued: int) -> dict[str, int]:
    """Message field reads of each common operation with ``queued`` follow-ups pending."""
    _, inbox, _ = new_inbox()
    for i in range(queued):
        inbox.splice("next-turn", i, i, (CountedMessage(user_message(f"q-{i}", "x")),))
    inbox.insert("steer", "next-step")
    reads: dict[str, int] = {}

    def measure(name: str, operation: Any) -> None:
        ID_READS[0] = 0
        operation()
        reads[name] = ID_READS[0]

    new = CountedMessage(user_message("new", "x"))
    measure("append", lambda: inbox.splice("next-turn", 10**9, None, (new,)))
    measure("insert", lambda: inbox.insert("y"))
    measure("claim one", lambda: inbox.claim("next-turn", 1))
    measure("claim next-step", lambda: inbox.claim("next-step"))
    measure("remove the front", lambda: inbox.remove("q-1"))
    measure("remove a stranger", lambda: inbox.remove("nobody"))
    measure("length", lambda: len(inbox))
    assert len(inbox) == queued
    return reads


def test_splice_work_does_not_grow_with_the_queue():
    """Regression (docs/design.md#inbox): each splice re-read every pending id (O(n) per splice)."""
    small = field_reads_per_operation(1_000)
    large = field_reads_per_operation(20_000)
    assert large == small
    assert max(large.values()) <= 10, large


def test_replaying_twenty_thousand_splices_rebuilds_the_inbox():
    """A resume folds 20,000 inserts and 10,000 claims into the same inbox, in order."""
    session, inbox, _ = new_inbox()
    for i in range(20_000):
        inbox.insert(f"q{i}")
    for _ in range(10_000):
        inbox.claim("next-turn", 1)
    ID_READS[0] = 0
    rebuilt = Session({"session_id": "s"}, clock=lambda: 0.0, events=session.events)
    assert rebuilt.inbox.lists == session.inbox.lists
    assert [m["id"] for m in rebuilt.inbox.lists["next-turn"]] == [
        f"m-{i}" for i in range(10_001, 20_001)
    ]
    assert rebuilt.inbox.max_id == 20_000
    again = Inbox(rebuilt, SimpleNamespace(notify=lambda kind, data: None))
    with pytest.raises(ValueError, match='message "m-20000" is already pending'):
        again.insert("dup", message_id="m-20000")
    assert again.insert("next") == "m-20001"


# -- the real path: a live agent queues and drains 20,000 follow-ups ----------------------------


class LongestStep(trio.abc.Instrument):
    """The longest single task step in wall-clock seconds, less garbage-collector pauses.

    Collector pauses scale with the whole process heap (pytest, hypothesis, 20,000 turns of
    log), not with the inbox, so they are not counted against the step that suffered them.
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self.steps = 0
        self._started: float | None = None
        self._collecting = 0.0
        self._collected = 0.0

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting = time.perf_counter()
        else:
            self._collected += time.perf_counter() - self._collecting

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.perf_counter()
        self._collected = 0.0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._started is None:  # the step that installed the instrument
            return
        elapsed = time.perf_counter() - self._started - self._collected
        self.longest = max(self.longest, elapsed)
        self.steps += 1
        self._started = None


class measured_steps:
    """``with measured_steps() as steps:`` installs a ``LongestStep`` for the block."""

    def __enter__(self) -> LongestStep:
        self.steps = LongestStep()
        gc.callbacks.append(self.steps.gc_callback)
        trio.lowlevel.add_instrument(self.steps)
        return self.steps

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.remove_instrument(self.steps)
        gc.callbacks.remove(self.steps.gc_callback)


FOLLOWUPS = 20_000
BATCH = 1_000
OPTIONS = AgentOptions(id="main", provider="scripted", model="m")
# Generous on purpose (shared, noisy machines): the quadratic inbox blocked for seconds; a
# batch of 1,000 follow-ups takes milliseconds now.
STEP_BOUND = 0.5


def asked(events: list[Event]) -> list[str]:
    """The text of every user message the turns admitted, in log order."""
    return [
        e.data["message"]["content"][0]["text"]
        for e in events
        if e.type == "user/message" and e.data["message"].get("source") is None
    ]


async def test_twenty_thousand_followups_never_block_the_loop(autojump_clock):
    """Regression (docs/design.md#inbox): queueing 20,000 follow-ups blocked the loop for
    seconds."""
    model = ScriptedModel([Reply.text("ok")], loop=True, record=False)
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        agent = handle.agent
        with measured_steps() as steps:
            for i in range(FOLLOWUPS):
                agent.followup(f"q{i}")
                if i % BATCH == BATCH - 1:
                    await trio.lowlevel.checkpoint()
            await agent.wait_idle()
        events = agent.session.events
        assert len(agent.inbox) == 0
        assert asked(events) == [f"q{i}" for i in range(FOLLOWUPS)]
        assert sum(e.type == "turn/end" for e in events) == FOLLOWUPS
        assert steps.steps > FOLLOWUPS
        assert steps.longest < STEP_BOUND, f"a task step took {steps.longest:.3f}s"


async def test_a_resume_replays_twenty_thousand_queued_splices(autojump_clock):
    """Queued work survives: 20,000 pending follow-ups are replayed on resume, then drained."""
    model = ScriptedModel([Reply.text("ok")], loop=True, record=False)
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        session_id = handle.agent.session_id
        for i in range(FOLLOWUPS):
            handle.agent.send(f"q{i}", wake=False)
        await handle.dispose()
        with measured_steps() as steps:
            again = await rt.agents.resume(session_id, options=OPTIONS)
            assert len(again.agent.inbox) == FOLLOWUPS
            await again.agent.wait_idle()
        events = again.agent.session.events
        assert len(again.agent.inbox) == 0
        assert asked(events) == [f"q{i}" for i in range(FOLLOWUPS)]
        assert steps.longest < STEP_BOUND, f"a task step took {steps.longest:.3f}s"
