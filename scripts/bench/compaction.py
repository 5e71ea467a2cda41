#!/usr/bin/env python3
"""The compaction benchmark, a thin wrapper: the code is ``dsh_agent_loop.bench.compaction``.

``python scripts/bench/compaction.py [ARGS]`` is ``python -m
dsh_agent_loop.bench.compaction [ARGS]`` (``--help`` lists them); ``import compaction`` with
this directory on ``sys.path`` gives that module's public names.
"""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.compaction import instant, lookup, main, run_compaction_bench

__all__ = ["instant", "lookup", "main", "run_compaction_bench"]

if __name__ == "__main__":
    sys.exit(main())
