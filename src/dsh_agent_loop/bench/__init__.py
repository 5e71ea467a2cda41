"""Benchmarks (``dsh-agent bench``; ``scripts/bench/*.py`` are thin wrappers).

Every figure is printed beside a pure-trio reference loop measured in the same run, so the
ratios mean something on a shared machine. See ``loop.py`` for the workloads.
"""
