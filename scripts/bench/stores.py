#!/usr/bin/env python3
"""The store benchmark, a thin wrapper: the code is ``dsh_agent_loop.bench.stores``.

``python scripts/bench/stores.py [ARGS]`` is ``python -m dsh_agent_loop.bench.stores [ARGS]``
(``--help`` lists them); ``import stores`` with this directory on ``sys.path`` gives that
module's public names.
"""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.stores import (
    BATCH,
    PG_ENV,
    W1_STEPS,
    Row,
    append_throughput,
    main,
    raw_postgres_throughput,
    raw_sqlite_throughput,
    raw_step_commit_us,
    report,
    rows,
    run_store_bench,
    w1,
)

__all__ = [
    "BATCH",
    "PG_ENV",
    "W1_STEPS",
    "Row",
    "append_throughput",
    "main",
    "raw_postgres_throughput",
    "raw_sqlite_throughput",
    "raw_step_commit_us",
    "report",
    "rows",
    "run_store_bench",
    "w1",
]

if __name__ == "__main__":
    sys.exit(main())
