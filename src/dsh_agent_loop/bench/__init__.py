"""The benchmarks ``dsh-agent bench`` runs, shipped with the package.

- ``dsh_agent_loop.bench.loop``: W1, W1 growth, W2 and W3 beside a pure-trio reference loop.
- ``dsh_agent_loop.bench.stores``: what durability costs (SQLite, PostgreSQL) beside plain SQL.
- ``dsh_agent_loop.bench.scale``: per-step cost, GC share and peak RSS against the agent count.
- ``dsh_agent_loop.bench.compaction``: one compaction and the per-step policy check.

Each module runs on its own (``python -m dsh_agent_loop.bench.loop [--quick] [--json PATH]``);
``scripts/bench/*.py`` in a source checkout are thin wrappers around them. The modules use only
the package's public modules, as an application would (``tests/test_layering.py`` checks it),
and nothing outside this package imports them but ``dsh-agent bench``, which does so lazily:
importing ``dsh_agent_loop`` does not import them.
"""
