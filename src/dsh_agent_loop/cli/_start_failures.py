"""What ``run`` and ``chat`` print about an MCP server that did not start.

A server that fails is reported so that a person can fix it without another try: its name and
what went wrong, the command line it ran (the names of the variables it set, never their values;
passwords in URLs shown as ``***``), its working directory, and the last lines of its stderr.
The stderr lines are bounded (a count and a width) and, like everything the CLI prints, pass
``visible`` (docs/design.md#terminal-safety): a server's output never drives the terminal.
"""

from __future__ import annotations

import shlex
from typing import Final

from ..mcp import McpStartError
from ._terminal import redact, visible

__all__ = ["STDERR_LINES", "STDERR_WIDTH", "mcp_failure_lines"]

#: Lines of a server's stderr shown (its last ones).
STDERR_LINES: Final = 10
#: Characters shown of one stderr line.
STDERR_WIDTH: Final = 200


def _shown(text: str) -> str:
    return visible(redact(text))


def _cut(line: str) -> str:
    return line if len(line) <= STDERR_WIDTH else f"{line[:STDERR_WIDTH]}… (cut)"


def mcp_failure_lines(error: McpStartError) -> list[str]:
    """The lines that describe ``error``: the problem, how the server was run, its stderr."""
    problem = " ".join(error.problem.split())
    lines = [_shown(f"MCP server {error.server!r} did not start: {problem}")]
    if error.command:
        lines.append(f"  command: {_shown(shlex.join(error.command))}")
    if error.cwd is not None:
        lines.append(f"  cwd: {_shown(error.cwd)}")
    if error.env_names:
        lines.append(f"  env: {_shown(' '.join(error.env_names))} (values not shown)")
    if error.url is not None:
        lines.append(f"  url: {_shown(error.url)}")
    tail = [line for line in error.stderr_tail.splitlines() if line.strip()]
    if tail:
        shown = tail[-STDERR_LINES:]
        count = f" (last {len(shown)} of {len(tail)} lines)" if len(tail) > len(shown) else ""
        lines.append(f"  stderr{count}:")
        lines.extend(f"    {_shown(_cut(line.rstrip()))}" for line in shown)
    return lines
