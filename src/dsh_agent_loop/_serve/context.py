"""``ServeContext``: what every request handler of the server reaches (docs/design.md#serve).

One context per server, built before the app and kept on ``app.state.ctx``: the fleet client
(every send, command and read goes through it, so any worker may own a session), the agents
``POST /api/sessions`` and ``/agui`` may create sessions of (the config's declared agents, else
the built-in echo agent), the access token, and the reports folder. It holds no task of its own;
the server's nursery owns the client's lifetime.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final, final

import attrs

from .._agent.options import AgentOptions
from .._errors import InvalidOptionError
from ..fleet import FleetClient

#: Largest request body the server reads (a message is at most the fleet's 1 MB, plus JSON).
MAX_BODY_BYTES: Final = 2_000_000


@final
@attrs.define(eq=False)
class ServeContext:
    """The server's state (module docstring)."""

    client: FleetClient
    """The fleet client on the served store."""
    agents: Mapping[str, AgentOptions]
    """Agent id → the options ``create`` makes a session of; the first is the default."""
    token: str | None = None
    """The access token; None: no token (loopback only)."""
    reports_dir: Path | None = None
    """``--reports DIR``: the ``*.html`` files ``/reports/`` serves."""
    bound_host: str = "127.0.0.1"
    """The host the server listens on (the Host header check of a loopback bind)."""
    max_streams: int = 256
    command_wait: float = 10.0
    """Seconds a cancel or decision waits for a worker to apply it before replying."""
    """Event streams (``/stream``, ``/agui``) open at once; one more is refused (503)."""

    def agent(self, agent_id: str | None) -> AgentOptions:
        """The agent named ``agent_id`` (None: the default).

        Raises:
            InvalidOptionError: no agent of that id (or none at all).
        """
        if agent_id is None:
            for choice in self.agents.values():
                return choice
            raise InvalidOptionError("this server declares no agent to create sessions of")
        found = self.agents.get(agent_id)
        if found is None:
            known = ", ".join(self.agents) or "none"
            raise InvalidOptionError(f"unknown agent {agent_id!r} (known: {known})")
        return found

    async def create_session(
        self,
        agent_id: str | None,
        session_id: str | None = None,
        prompt: str | None = None,
    ) -> str:
        """Queue a new session of ``agent_id`` for the fleet; send ``prompt`` first if given.

        Raises:
            InvalidOptionError: unknown agent or bad id. SessionAlreadyExistsError: id taken.
        """
        options = self.agent(agent_id)
        sid = await self.client.create(options, session_id=session_id)
        if prompt is not None:
            await self.client.send(sid, prompt)
        return sid
