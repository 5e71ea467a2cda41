"""The ``fleet`` key of the plugin config block: run the runtime as a fleet worker.

``fleet: {workerId, maxAgents, idleUnloadSeconds, drainTimeoutSeconds, pollIntervalSeconds,
leaseSeconds}`` (every key optional; ``fleet: {}`` is a worker with the defaults). See
docs/fleet.md; the runtime turns it into ``FleetOptions``.
"""

from __future__ import annotations

from typing import final

import attrs

from ._rules import NonEmptyStr, PositiveInt, PositiveNumber

__all__ = ["FleetConfig"]


@final
@attrs.frozen
class FleetConfig:
    """``fleet``: make the runtime a worker of the fleet on its store (``docs/fleet.md``)."""

    worker_id: NonEmptyStr | None = None
    """This worker's name (default ``<host>-<pid>-<random>``)."""
    max_agents: PositiveInt = 10_000
    """Most live agents at once."""
    idle_unload_seconds: PositiveNumber = 300.0
    """Unload an agent idle this long."""
    drain_timeout_seconds: PositiveNumber = 30.0
    """How long running turns may finish on a graceful stop."""
    poll_interval_seconds: PositiveNumber = 0.05
    """How often to look for work on SQLite."""
    lease_seconds: PositiveNumber | None = None
    """A worker silent this long is gone (default: the store's lease, or 10 s on SQLite)."""
