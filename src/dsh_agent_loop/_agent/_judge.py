"""The judge of one agent's tool calls: its effective permission policy and its ``Gate``.

The effective policy is the agent's own (``AgentOptions.permissions``), else its parent's
effective policy, else the runtime's (``docs/security.md``). The ``Gate`` is kept on the agent
(``TurnContext.permission_gate``) and looked up again only when a rule was granted since:
everything else it depends on is fixed for the agent's life. Agents alike (same compiled policy,
``require_approval`` and cwd) share one gate, kept by the runtime (``Services.permission_gates``,
at most ``MAX_POLICIES``): a gate and its cache of free tools are not made again for each of
thousands of agents. The rules themselves are ``_permissions.py``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._permissions import MAX_POLICIES, Gate, compiled

if TYPE_CHECKING:
    from .._permissions import Permissions
    from ._turn_context import TurnContext

__all__ = ["effective", "gate"]


def effective(agent: TurnContext) -> Permissions | None:
    """The policy ``agent`` runs under: its own, else its parent's, else the runtime's."""
    node: TurnContext | None = agent
    while node is not None:
        own = node.options.permissions
        if own is not None:
            return own
        node = node.parent
    return agent.services.permissions


def gate(agent: TurnContext) -> Gate:
    """The judge of ``agent``'s calls: its policy and the rules its session has granted so far."""
    granted = agent.log.state.granted
    found = agent.permission_gate
    if found is None or (found.granted is not granted and found.granted != granted):
        services = agent.services
        options = agent.options
        policy = compiled(services, effective(agent), granted)
        gates = services.permission_gates
        key = (policy, options.require_approval, options.cwd)
        found = gates.get(key)
        if found is None:
            found = Gate(policy, options.require_approval, services.builtin, options.cwd)
            found.granted = granted
            if len(gates) >= MAX_POLICIES:
                del gates[next(iter(gates))]  # the oldest
            gates[key] = found
        agent.permission_gate = found
    return found
