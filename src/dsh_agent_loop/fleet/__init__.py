"""A fleet of workers on one shared store: any process reaches any session (docs/fleet.md).

``open_client(store)`` gives a ``FleetClient`` (send, run, cancel, approve, deny, create,
events, status) to any process, with no runtime; ``open_runtime(..., fleet=FleetOptions())``
makes a runtime a worker that activates sessions as messages arrive for them, delivers each
message exactly once and in order, takes over the sessions of a worker that died, and unloads
idle agents. The store is the engine: PostgreSQL across machines, SQLite across the processes of
one machine. The modules behind this face are internal (docs/design.md#fleet).
"""

from __future__ import annotations

from .._fleet.client import FleetClient as FleetClient
from .._fleet.client import FleetCommandError as FleetCommandError
from .._fleet.client import open_client as open_client
from .._fleet.options import FleetOptions as FleetOptions
from .._fleet.options import FleetStatus as FleetStatus
from .._fleet.options import WorkerStatus as WorkerStatus

__all__ = [
    "FleetClient",
    "FleetCommandError",
    "FleetOptions",
    "FleetStatus",
    "WorkerStatus",
    "open_client",
]
