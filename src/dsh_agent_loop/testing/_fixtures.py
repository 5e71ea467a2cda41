"""pytest plugin (auto-registered): ``scripted_model`` and ``runtime`` fixtures for pytest-trio.

``runtime`` is an open runtime on a fresh ``MemoryStore`` whose provider ``"scripted"`` is the
``scripted_model`` fixture, with ``clock=trio.current_time`` and ``seed=0`` so runs repeat under
``autojump_clock``. Add replies with ``scripted_model.add(Reply.text("hi"))``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from .._runtime import Runtime, open_runtime
from ..llm import ScriptedModel
from ..stores import MemoryStore

__all__ = ["runtime", "scripted_model"]


@pytest.fixture
def scripted_model() -> ScriptedModel:
    """An empty ``ScriptedModel`` (add replies in the test)."""
    return ScriptedModel()


@pytest.fixture
async def runtime(scripted_model: ScriptedModel) -> AsyncIterator[Runtime]:
    """An open runtime on a ``MemoryStore`` with the ``scripted`` provider."""
    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": scripted_model},
        clock=trio.current_time,
        seed=0,
    ) as rt:
        yield rt
