"""Importing the package, MCP support included, does not import the MCP SDK."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_does_not_import_the_sdk() -> None:
    code = (
        "import sys, dsh_agent_loop, dsh_agent_loop.mcp\n"
        "from dsh_agent_loop import open_runtime\n"
        "from dsh_agent_loop.mcp import McpServer\n"
        "McpServer.stdio('s', 'true')\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
