"""The fleet's records: ``FleetOptions`` (a worker's settings) and what ``status()`` reports.

See docs/design.md#fleet.
"""

from __future__ import annotations

import math
from typing import final

import attrs

from .._errors import InvalidOptionError

__all__ = ["FleetOptions", "FleetStatus", "WorkerStatus"]


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InvalidOptionError(f"FleetOptions.{name} must be a positive number, got {value!r}")


@final
@attrs.frozen
class FleetOptions:
    """Make a runtime a fleet worker: ``open_runtime(..., fleet=FleetOptions())``.

    YAML: ``fleet: {workerId, maxAgents, idleUnloadSeconds, drainTimeoutSeconds,
    pollIntervalSeconds, leaseSeconds}`` in the plugin block.
    """

    worker_id: str | None = None
    """This worker's name in ``status()`` (default ``<host>-<pid>-<random>``); unique per fleet."""
    max_agents: int = 10_000
    """Most live agents at once; work for other sessions waits (it is never dropped)."""
    idle_unload_s: float = 300.0
    """An agent idle this long is unloaded and its session released."""
    drain_timeout_s: float = 30.0
    """On a graceful stop, how long running turns may go on before they are aborted."""
    poll_interval_s: float = 0.05
    """How often an idle worker looks for work on SQLite (PostgreSQL wakes on ``NOTIFY`` and
    polls at 20 times this as a fallback)."""
    lease_s: float | None = None
    """Seconds without a heartbeat after which a worker counts as gone and its sessions are
    taken over; default the store's lease (PostgreSQL) or 10 s (SQLite). Heartbeats come every
    third of it."""

    def validate(self) -> None:
        """Raise ``InvalidOptionError`` for a value out of range."""
        if type(self.max_agents) is not int or self.max_agents < 1:
            raise InvalidOptionError(
                f"FleetOptions.max_agents must be an int >= 1, got {self.max_agents!r}"
            )
        for name in ("idle_unload_s", "drain_timeout_s", "poll_interval_s", "lease_s"):
            _positive(name, getattr(self, name))
        if self.worker_id is not None and not (0 < len(self.worker_id) <= 200):
            raise InvalidOptionError("FleetOptions.worker_id must be 1..200 characters")


@final
@attrs.frozen
class WorkerStatus:
    """One worker as ``status()`` sees it."""

    worker_id: str
    host: str
    pid: int
    started_at: float
    """Seconds since the epoch."""
    last_heartbeat: float
    """Seconds since the epoch."""
    live_agents: int
    max_agents: int
    state: str
    """``running`` or ``draining``."""
    alive: bool
    """Its heartbeat is younger than the fleet's lease."""


@final
@attrs.frozen
class FleetStatus:
    """What ``await client.status()`` reports."""

    workers: tuple[WorkerStatus, ...]
    """Workers with a row (a worker that stopped cleanly removed its own)."""
    sessions_waiting: int
    """Sessions with undelivered messages or undone commands."""
    undelivered: int
    """Messages accepted and not yet in their session's log."""
    oldest_undelivered_age: float | None
    """Seconds since the oldest undelivered message was sent (None: none)."""
