"""The fleet's machinery behind ``dsh_agent_loop.fleet`` (docs/design.md#fleet).

``sql`` (tables and transactions), ``db`` (connections, wake-ups), ``client`` (``FleetClient``),
``follow`` (a sent message's turn), ``worker`` (claims, delivery, failover), ``options``.
"""
