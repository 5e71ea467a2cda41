#!/usr/bin/env python3
"""Loop benchmark (W1, W1 growth, W2, W3) beside a pure-trio reference; see dsh_agent_loop.bench."""

from __future__ import annotations

import sys

from dsh_agent_loop.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", "loop", *sys.argv[1:]]))
