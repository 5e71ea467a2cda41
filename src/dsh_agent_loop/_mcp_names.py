"""The names an MCP server and its tool prefix may take.

Both become part of tool names, which providers restrict to this alphabet: a server's name is
the default prefix (``<name>__<tool>``), and a prefix leaves room for a tool name of at least one
character. The config's rules (``mcpServers``) and ``McpServer`` check the same patterns, so a
name refused in a file is refused in code too.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["SERVER_NAME", "TOOL_PREFIX"]

#: Server names become tool-name prefixes, which providers restrict to this alphabet.
SERVER_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: A tool-name prefix: it leaves room for a tool name of at least one character.
TOOL_PREFIX: Final = re.compile(r"[A-Za-z0-9_-]{0,63}")
