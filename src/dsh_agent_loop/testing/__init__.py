"""Testing toolkit: the scripted model, cancellation exploration, and pytest fixtures.

``explore_cancellation(scenario, providers=...)`` cancels a scenario at every checkpoint its
agents execute and checks the log each time; ``ScriptedModel`` and ``Reply`` script the model;
the pytest plugin (registered automatically) provides ``runtime`` and ``scripted_model``.

``actor_of(agent)`` is the seam for tests of the runtime itself: the internal actor behind a
public ``Agent`` (its wakes, driver, log and caches). Its attributes are internal and may change
with any release; tests of an application should use the ``Agent`` API.
"""

from __future__ import annotations

from .._agent.agent import actor_of as actor_of
from ..llm import Reply as Reply
from ..llm import ScriptedModel as ScriptedModel
from ._explore import CancellationReport as CancellationReport
from ._explore import explore_cancellation as explore_cancellation
from ._explore import explore_cancellation_async as explore_cancellation_async

__all__ = [
    "CancellationReport",
    "Reply",
    "ScriptedModel",
    "actor_of",
    "explore_cancellation",
    "explore_cancellation_async",
]
