"""``McpConnection``: one MCP client session, kept open, restarted after a crash, on demand.

Design. A connection is one task (``run``) that owns the transport (the server's process, or an
HTTP client) and the SDK's ``ClientSession`` for as long as they live, so they are always
closed by the task that opened them, also when the runtime's block is cancelled (the SDK's
stdio transport stops its process shielded and bounded). Tool calls run in the agents' tool
workers and only *use* the session: ``ClientSession.call_tool`` under the caller's cancel
scope, which makes the SDK send ``notifications/cancelled`` when the call is cancelled.

A crash (the connection closes under a call) ends the session: that call and any other in
flight get ``TOOL_ERROR``, and the task goes back to waiting. The next call asks it to start
the server again and waits for that attempt; after consecutive failures a call made inside the
backoff window fails at once instead (``RESTART_BACKOFF`` doubling up to ``MAX_BACKOFF``), so a
broken server cannot turn every step into a slow restart. ``notifications/tools/list_changed``
only wakes the task, which lists the tools again outside the SDK's receive loop.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .._frozen import thaw
from ..errors import AgentLoopError
from ..tools.base import ExecutionMode, Tool, ToolContext, ToolResult
from .results import error_text, tool_result
from .spec import McpServer

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

__all__ = ["START_TIMEOUT", "McpConnection", "McpConnectionStatistics", "McpStartError"]

#: Seconds a server has to start and answer ``initialize`` and ``tools/list``.
START_TIMEOUT: Final = 30.0
#: Seconds before the second restart in a row; doubled for each further failure.
RESTART_BACKOFF: Final = 1.0
#: Longest wait between restarts.
MAX_BACKOFF: Final = 30.0
#: Characters of the server's stderr kept in a start failure.
STDERR_TAIL: Final = 2_000


@final
class McpStartError(AgentLoopError):
    """An MCP server did not start (``rt.start_failures``); ``stderr_tail`` is its last output."""

    code = "MCP_START_FAILED"

    def __init__(self, server: str, problem: str, stderr_tail: str = "") -> None:
        tail = f"; stderr: {stderr_tail}" if stderr_tail else ""
        super().__init__(f"MCP server {server!r} did not start: {problem}{tail}")
        self.server = server
        self.stderr_tail = stderr_tail


@final
@attrs.frozen
class McpConnectionStatistics:
    """A snapshot of one connection's counters."""

    running: bool
    starts: int
    """Sessions started (the first one and every restart)."""
    calls: int
    tools: int


def _sdk_version() -> str | None:
    """The installed MCP SDK's version (None: not installed)."""
    from importlib import metadata

    try:
        return metadata.version("mcp")
    except metadata.PackageNotFoundError:
        return None


def _sdk_problem() -> str | None:
    """Why the installed MCP SDK cannot be used, or None.

    ``mcp>=2`` is required: under trio the 1.x client loses responses to concurrent HTTP
    requests and sends no cancellation when a caller is cancelled.
    """
    version = _sdk_version()
    if version is None:
        return "the MCP SDK is not installed (pip install 'dsh-agent-loop[mcp]')"
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) < 2:
        return f"mcp {version} is installed, and MCP servers need mcp>=2 (pip install 'mcp>=2')"
    return None


def _problem(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _problem(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


def _tail(errlog: IO[bytes]) -> str:
    errlog.seek(0, 2)
    size = errlog.tell()
    errlog.seek(max(0, size - STDERR_TAIL))
    return errlog.read().decode("utf-8", "replace").strip()


def _is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` from a call means the connection is gone (not a refused request)."""
    import anyio
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | OSError)


@contextlib.asynccontextmanager
async def _in_process(server: Any) -> AsyncIterator[Any]:
    """Memory streams to ``server`` run as a task here; ends it by closing its input."""
    from mcp.shared.memory import create_client_server_memory_streams

    lowlevel = getattr(server, "_lowlevel_server", server)  # MCPServer wraps a low-level one
    streams = create_client_server_memory_streams()
    async with streams as (client, (read, write)), trio.open_nursery() as nursery:
        options = lowlevel.create_initialization_options()
        nursery.start_soon(lowlevel.run, read, write, options)
        try:
            yield client
        finally:
            await client[1].aclose()
            await write.aclose()
            nursery.cancel_scope.cancel()


@final
class McpConnection:
    """One server's session: ``run`` in a nursery; its tools call ``call``."""

    def __init__(self, spec: McpServer, publish: Callable[[Sequence[Tool]], None]) -> None:
        self.spec = spec
        self._publish = publish
        self._session: ClientSession | None = None
        self._wake = trio.Event()
        self._lost = False
        self._list_changed = False
        self._restart = trio.Event()
        self._attempt = trio.Event()
        """Set when the current start attempt has succeeded or failed."""
        self._failures = 0
        self._retry_at = float("-inf")
        self._error = ""
        self._starts = 0
        self._calls = 0
        self._tools = 0

    def statistics(self) -> McpConnectionStatistics:
        """A snapshot of the connection's counters."""
        return McpConnectionStatistics(
            running=self._session is not None,
            starts=self._starts,
            calls=self._calls,
            tools=self._tools,
        )

    async def run(self, *, task_status: trio.TaskStatus[McpStartError | None]) -> None:
        """Start the server (``started(None)``, or ``started(error)``), then keep it going."""
        status: Any = task_status
        while True:
            error = await self._serve(status)
            if error is not None:
                self._failed(str(error))
                if status is not trio.TASK_STATUS_IGNORED:
                    status.started(error)
            status = trio.TASK_STATUS_IGNORED
            await self._restart.wait()
            self._restart = trio.Event()

    def _failed(self, problem: str) -> None:
        self._error = problem
        self._failures += 1
        if self._failures > 1:
            delay = min(MAX_BACKOFF, RESTART_BACKOFF * 2 ** (self._failures - 2))
            self._retry_at = trio.current_time() + delay
        self._finish_attempt()

    def _finish_attempt(self) -> None:
        done, self._attempt = self._attempt, trio.Event()
        done.set()

    async def _serve(self, status: Any) -> McpStartError | None:
        """One session from start to loss; returns the error when it never started."""
        self._lost = self._list_changed = False
        sdk_problem = _sdk_problem()
        if sdk_problem is not None:
            return McpStartError(self.spec.name, sdk_problem)
        ready = False
        with tempfile.TemporaryFile() as errlog:
            try:
                async with self._open(errlog) as session:
                    with trio.fail_after(START_TIMEOUT):
                        await session.initialize()
                        listed = await session.list_tools()
                    self._use(listed.tools)
                    self._session, ready = session, True
                    self._starts += 1
                    self._finish_attempt()
                    status.started(None)
                    await self._follow(session)
                    self._session = None
            except Exception as exc:
                self._session = None
                if not ready:
                    return McpStartError(self.spec.name, _problem(exc), _tail(errlog))
                self._failed(f"the connection failed ({_problem(exc)}) {_tail(errlog)}".strip())
            finally:
                self._session = None
        return None

    async def _follow(self, session: ClientSession) -> None:
        """Refresh the tools on each list change until the connection is lost."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._lost:
                return
            if self._list_changed:
                self._list_changed = False
                try:
                    listed = await session.list_tools()
                except Exception as exc:
                    if _is_lost(exc):
                        self._lose("the connection closed")
                        return
                    raise
                self._use(listed.tools)

    @contextlib.asynccontextmanager
    async def _open(self, errlog: IO[bytes]) -> AsyncIterator[ClientSession]:
        from mcp.client.session import ClientSession

        spec = self.spec
        async with contextlib.AsyncExitStack() as stack:
            if spec.command is not None:
                from mcp.client.stdio import StdioServerParameters, stdio_client

                params = StdioServerParameters(
                    command=spec.command,
                    args=list(spec.args),
                    env=None if spec.env is None else dict(spec.env),
                    cwd=spec.cwd,
                )
                transport = stdio_client(params, errlog=errlog)  # type: ignore[arg-type]  # a binary file has the fileno the SDK passes on
            elif spec.server is not None:
                transport = _in_process(spec.server)
            else:
                import httpx2
                from mcp.client.streamable_http import streamable_http_client

                assert spec.url is not None
                client = httpx2.AsyncClient(
                    headers=dict(spec.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0)
                )
                await stack.enter_async_context(client)
                transport = streamable_http_client(spec.url, http_client=client)
            read, write = await stack.enter_async_context(transport)
            session = ClientSession(read, write, message_handler=self._on_message)
            yield await stack.enter_async_context(session)

    async def _on_message(self, message: Any) -> None:
        """The SDK's message handler: note a list change or a transport failure, never block."""
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._list_changed = True
            self._wake.set()
        await trio.lowlevel.checkpoint()

    def _lose(self, problem: str) -> None:
        if not self._lost:
            self._lost = True
            self._session = None  # the next call restarts the server, this one is lost
            self._wake.set()
            self._failed(problem)

    def _use(self, listed: Sequence[Any]) -> None:
        tools = [self._tool(t) for t in listed]
        self._tools = len(tools)
        self._publish(tools)

    def _tool(self, listed: Any) -> Tool:
        """A runtime ``Tool`` for one listed MCP tool."""
        name = listed.name
        mode: ExecutionMode | None = self.spec.execution_modes.get(name)
        if mode is None:
            hints = listed.annotations
            mode = "parallel" if hints is not None and hints.read_only_hint else "exclusive"

        async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            return await self.call(name, arguments)

        return Tool(
            name=f"{self.spec.tool_prefix}{name}",
            description=listed.description or listed.title or "",
            parameters=listed.input_schema,
            handler=handler,
            execution_mode=mode,
        )

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call the server's tool ``name``; every failure is a ``TOOL_ERROR`` result."""
        self._calls += 1
        session = self._session or await self._restarted()
        if session is None:
            return error_text(self.spec.name, f"not running ({self._error})")
        try:
            result = await session.call_tool(name, thaw(arguments))
        except Exception as exc:
            if _is_lost(exc):
                self._lose(f"the connection closed during a call to {name!r}")
                return error_text(self.spec.name, f"the server stopped during the call ({exc})")
            return error_text(self.spec.name, _problem(exc))
        self._failures = 0
        return tool_result(result)

    async def _restarted(self) -> ClientSession | None:
        """Ask ``run`` to start the server again (unless backing off); the new session."""
        if trio.current_time() < self._retry_at:
            return None
        done = self._attempt
        self._restart.set()
        await done.wait()
        return self._session
