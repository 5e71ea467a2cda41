"""Real MCP servers for the tests: ``server.py`` as a stdio subprocess or on loopback HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

try:
    import mcp  # noqa: F401  # the extra this directory tests
except ImportError:  # pragma: no cover - the test extra installs it
    collect_ignore_glob = ["test_*.py"]

from dsh_agent_loop.mcp import McpServer

SERVER = str(Path(__file__).with_name("server.py"))
#: Seconds a real server process gets to start, answer or stop.
PROCESS_WAIT = 20.0


def stdio_server(markers: Path, name: str = "t", **kwargs: object) -> McpServer:
    """The test server on stdio, writing its markers to ``markers``."""
    env = {"MARKER_DIR": str(markers)}
    return McpServer.stdio(name, sys.executable, [SERVER, "stdio"], env=env, **kwargs)  # type: ignore[arg-type]


async def wait_for(path: Path) -> None:
    """Wait (bounded) for a real server process to write ``path``."""
    with trio.fail_after(PROCESS_WAIT):
        while not await trio.Path(path).exists():
            await trio.sleep(0.01)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` is neither running nor an unreaped zombie child."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serve_http(markers: Path, mode: str = "http") -> AsyncIterator[str]:
    """The test server on streamable HTTP at 127.0.0.1 (``mode``: ``http`` or ``http-json``)."""
    port = free_port()
    env = {**os.environ, "MARKER_DIR": str(markers)}
    process = await trio.lowlevel.open_process(
        [sys.executable, SERVER, mode, str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(PROCESS_WAIT):
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                break
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        with trio.move_on_after(PROCESS_WAIT):
            await process.wait()
        process.kill()
        await process.wait()


@pytest.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """The test server on streamable HTTP at 127.0.0.1 (its URL and its marker directory)."""
    async with serve_http(tmp_path) as url:
        yield url, tmp_path
