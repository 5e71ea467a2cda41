#!/usr/bin/env python3
"""Loop benchmark (W1, W1 growth, W2, W3) beside a pure-trio reference: `--quick`, `--json PATH`."""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.loop import main

if __name__ == "__main__":
    sys.exit(main())
