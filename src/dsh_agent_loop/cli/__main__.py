"""``python -m dsh_agent_loop.cli``: the ``dsh-agent`` console script."""

from __future__ import annotations

from . import main

raise SystemExit(main())
