"""The HTTP face of a fleet: a JSON API, live event streams, AG-UI and a web page (docs/serve.md).

``await serve(store, agents=[...], host="127.0.0.1", port=8765, token=None)`` runs the server in
the caller's trio run (``nursery.start(...)`` reports the address it listens on) until it is
cancelled. It is a fleet client: workers (``open_runtime(fleet=...)``, ``dsh-agent worker``) run
the agents; the server reads their logs and sends messages, cancels and approvals through the
store. It needs the ``serve`` extra: ``pip install 'dsh-agent-loop[serve]'``. The modules behind
this face are internal (docs/design.md#serve).
"""

from __future__ import annotations

try:
    from .._serve.server import serve as serve
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        f"dsh_agent_loop.serve needs the serve extra ({exc.name} is missing):"
        " pip install 'dsh-agent-loop[serve]'"
    ) from exc

__all__ = ["serve"]
