#!/usr/bin/env python3
"""The fleet benchmark, a thin wrapper: the code is ``dsh_agent_loop.bench.fleet``.

``python scripts/bench/fleet.py [--quick] [--json PATH]`` is ``python -m
dsh_agent_loop.bench.fleet`` with the same arguments.
"""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.fleet import (
    LIMIT_S,
    MODULE,
    PG_ENVS,
    READ_POLL_S,
    SWEEP_S,
    main,
    measure_latency,
    measure_turns,
    run_fleet_bench,
)

__all__ = [
    "LIMIT_S",
    "MODULE",
    "PG_ENVS",
    "READ_POLL_S",
    "SWEEP_S",
    "main",
    "measure_latency",
    "measure_turns",
    "run_fleet_bench",
]

if __name__ == "__main__":
    sys.exit(main())
