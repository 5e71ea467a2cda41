"""The library leaves the garbage collector alone unless asked; ``gc_freeze`` does what it says."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, open_runtime


class Node:
    """Something the collector tracks, in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


def gc_state() -> tuple[tuple[int, ...], bool, int]:
    return gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()


@pytest.fixture
def clean_gc() -> Iterator[None]:
    """Start from nothing frozen; leave nothing frozen and the settings as they were."""
    gc.unfreeze()
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def model() -> ScriptedModel:
    return ScriptedModel([Reply.text("hi")], loop=True)


async def create_and_run(rt, n: int) -> None:
    handles = [
        await rt.agents.create(options=AgentOptions(id=f"a{i}", provider="s", model="m"))
        for i in range(n)
    ]
    for h in handles:
        h.agent.followup("go")
    for h in handles:
        await h.agent.wait_idle()


async def test_by_default_the_runtime_changes_no_gc_setting(clean_gc) -> None:
    gc.set_threshold(1234, 7, 9)  # not the defaults: a change back to them would show
    before = gc_state()
    async with open_runtime(store=MemoryStore(), providers={"s": model()}) as rt:
        assert gc_state() == before
        await create_and_run(rt, 50)
        assert gc_state() == before
    assert gc_state() == before


async def test_a_disabled_collector_stays_disabled(clean_gc) -> None:
    gc.disable()
    async with open_runtime(store=MemoryStore(), providers={"s": model()}) as rt:
        await create_and_run(rt, 5)
        assert not gc.isenabled()
    assert not gc.isenabled()


async def test_gc_freeze_freezes_what_is_alive_and_the_close_gives_it_back(clean_gc) -> None:
    threshold = gc.get_threshold()
    async with open_runtime(store=MemoryStore(), providers={"s": model()}) as rt:
        await create_and_run(rt, 20)
        node = Node()
        alive = weakref.ref(node)
        frozen = rt.gc_freeze()
        assert frozen > 0
        assert gc.get_freeze_count() == frozen  # nothing freed in between
        del node
        gc.collect()
        assert alive() is not None  # frozen: no collection walks its cycle
        assert rt.gc_freeze() >= 0  # a second freeze adds what was created since
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == threshold
    assert gc.isenabled()
    gc.collect()
    assert alive() is None  # unfrozen at close, so its cycle was collected


async def test_the_option_freezes_once_the_runtime_is_open(clean_gc) -> None:
    async with open_runtime(store=MemoryStore(), providers={"s": model()}, gc_freeze=True) as rt:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        await create_and_run(rt, 5)
        assert gc.get_freeze_count() <= frozen  # frozen once, not per agent (some freed since)
    assert gc.get_freeze_count() == 0


async def test_objects_frozen_by_someone_else_stay_frozen(clean_gc) -> None:
    node = Node()
    alive = weakref.ref(node)
    gc.freeze()  # e.g. a pre-fork server's freeze
    del node
    theirs = gc.get_freeze_count()
    async with open_runtime(store=MemoryStore(), providers={"s": model()}) as rt:
        await create_and_run(rt, 5)
        assert rt.gc_freeze() > 0
    assert gc.get_freeze_count() > theirs  # not unfrozen: that would undo their freeze too
    gc.collect()
    assert alive() is not None
