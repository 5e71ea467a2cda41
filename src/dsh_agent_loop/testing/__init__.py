"""Testing toolkit: the scripted model, cancellation exploration, and pytest fixtures.

``explore_cancellation(scenario, providers=...)`` cancels a scenario at every checkpoint its
agents execute and checks the log each time; ``ScriptedModel`` and ``Reply`` script the model;
the pytest plugin (registered automatically) provides ``runtime`` and ``scripted_model``.
"""

from __future__ import annotations

from ..llm.scripted import Reply as Reply
from ..llm.scripted import ScriptedModel as ScriptedModel
from .explore import CancellationReport as CancellationReport
from .explore import explore_cancellation as explore_cancellation
from .explore import explore_cancellation_async as explore_cancellation_async

__all__ = [
    "CancellationReport",
    "Reply",
    "ScriptedModel",
    "explore_cancellation",
    "explore_cancellation_async",
]
