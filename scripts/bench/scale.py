#!/usr/bin/env python3
"""The scale benchmark, a thin wrapper: the code is ``dsh_agent_loop.bench.scale``.

``python scripts/bench/scale.py [ARGS]`` is ``python -m dsh_agent_loop.bench.scale [ARGS]``
(``--help`` lists them); ``import scale`` with this directory on ``sys.path`` gives that
module's public names.
"""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.scale import (
    FULL_SIZES,
    GROWTH_FROM,
    GROWTH_TO,
    MIN_STEPS,
    MODULE,
    SHARE_SIZES,
    SIZES,
    STEPS,
    TARGETS,
    GcClock,
    main,
    measure,
    noop,
    ours,
    reference,
    reference_loop,
    report,
    run_scale_bench,
    scale_rows,
)

__all__ = [
    "FULL_SIZES",
    "GROWTH_FROM",
    "GROWTH_TO",
    "MIN_STEPS",
    "MODULE",
    "SHARE_SIZES",
    "SIZES",
    "STEPS",
    "TARGETS",
    "GcClock",
    "main",
    "measure",
    "noop",
    "ours",
    "reference",
    "reference_loop",
    "report",
    "run_scale_bench",
    "scale_rows",
]

if __name__ == "__main__":
    sys.exit(main())
