#!/usr/bin/env python3
"""Store benchmark (W1 on SQLite vs memory; append rate vs raw SQL): `--quick`, `--json PATH`."""

from __future__ import annotations

import sys

from dsh_agent_loop.bench.stores import main

if __name__ == "__main__":
    sys.exit(main())
