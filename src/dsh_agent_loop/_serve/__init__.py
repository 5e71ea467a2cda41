"""The server behind ``dsh_agent_loop.serve`` and ``dsh-agent serve`` (docs/design.md#serve).

Internal: ``server.serve`` runs ``app.create_app`` (routes, errors) wrapped in ``access.Access``
(host, token, origin) on Hypercorn's trio worker. ``api`` and ``stream`` are the JSON API and the
event stream, ``digest`` folds a session's summary from its log, ``agui`` and ``agui_translate``
speak AG-UI, ``reports`` serves ``--reports DIR``, and ``static/`` is the page. Importing this
package imports none of them (the ``serve`` extra's packages load only with ``server``).
"""
