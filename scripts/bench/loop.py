#!/usr/bin/env python3
"""The loop benchmark, a thin wrapper: the code is ``dsh_agent_loop.bench.loop``.

``python scripts/bench/loop.py [ARGS]`` is ``python -m dsh_agent_loop.bench.loop [ARGS]``
(``--help`` lists them); ``import loop`` with this directory on ``sys.path`` gives that
module's public names.
"""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.loop import (
    main,
    noop,
    print_table,
    reference_loop,
    report,
    rows,
    run_loop_bench,
    w1,
    w3,
)

__all__ = [
    "main",
    "noop",
    "print_table",
    "reference_loop",
    "report",
    "rows",
    "run_loop_bench",
    "w1",
    "w3",
]

if __name__ == "__main__":
    sys.exit(main())
