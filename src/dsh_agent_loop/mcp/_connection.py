"""``McpConnection``: one MCP client session, kept open, restarted after a crash, on demand.

Design. A connection is one task (``run``) that owns the transport (the server's process, or an
HTTP client) and the SDK's ``ClientSession`` for as long as they live, so they are always
closed by the task that opened them, also when the runtime's block is cancelled (the stdio
transport stops its process shielded and bounded). Tool calls run in the agents' tool workers
and only *use* the session: a ``tools/call`` request under the caller's cancel scope, which
makes the SDK send ``notifications/cancelled`` when the call is cancelled.

A crash (the connection closes under a call) ends the session: that call and any other in
flight get ``TOOL_ERROR``, and the task goes back to waiting. The next call asks it to start
the server again and waits for that attempt; after consecutive failures a call made inside the
backoff window fails at once instead (``RESTART_BACKOFF`` doubling up to ``MAX_BACKOFF``), so a
broken server cannot turn every step into a slow restart. ``notifications/tools/list_changed``
only wakes the task, which lists the tools again outside the SDK's receive loop.

The server is not trusted. A call it does not answer within ``limits.mcp_call_timeout`` is
cancelled (the server is told) and is a ``TIMEOUT`` result, the connection staying up; a
message over ``limits.mcp_max_message_bytes`` is never read whole (``_stdio.py``,
``_http.py``); its listing is checked tool by tool (``_tools.py``). It gets ``START_TIMEOUT``
to answer ``initialize``, and as long again to list its tools, and a start failure says which
it did not do. Calls are plain ``tools/call`` requests, not the SDK's ``call_tool``, which would
check a result against the server's ``outputSchema`` with Python's backtracking ``re``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .._errors import AgentLoopError
from .._frozen import thaw
from .._limits import DEFAULT_LIMITS, Limits
from .._tools.base import ToolResult
from ._http import open_http
from ._results import error_text, tool_result
from ._spec import McpServer
from ._stdio import open_stdio
from ._tools import Listing, ListingRefused, build_tools, log

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

__all__ = ["START_TIMEOUT", "McpConnection", "McpConnectionStatistics", "McpStartError"]

#: Seconds a server has to answer ``initialize``, then as long to list its tools.
START_TIMEOUT: Final = 30.0
#: Seconds before the second restart in a row; doubled for each further failure.
RESTART_BACKOFF: Final = 1.0
#: Longest wait between restarts.
MAX_BACKOFF: Final = 30.0
#: Characters of the server's stderr kept in a start failure.
STDERR_TAIL: Final = 2_000

Publish = Callable[[Listing, bool], Awaitable["str | None"]]
"""``publish(listing, starting)``: register the tools; at start, a name clash (else None)."""


class _NotStarted(Exception):
    """The server did not get through its start (the message says what it did not do)."""


#: Shortest value hidden from a start failure's text (shorter ones would hide ordinary words).
_MIN_SECRET: Final = 4


def _secret_values(spec: McpServer | None) -> list[str]:
    """The values of the spec's ``env`` and ``headers``: a server's output may echo them."""
    if spec is None:
        return []
    values = [*(spec.env or {}).values(), *(spec.headers or {}).values()]
    return sorted((v for v in values if len(v) >= _MIN_SECRET), key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


@final
class McpStartError(AgentLoopError):
    """An MCP server did not start (``rt.start_failures``); ``stderr_tail`` is its last output.

    It names what was started, never a secret: ``command`` (the command and its arguments, as
    run), ``cwd``, the names of the variables set (``env_names``, no values) or the ``url``; a
    value of the spec's ``env`` or ``headers`` that the server echoed (in its stderr, or an
    argument holding it) is shown as ``***``.
    """

    code = "MCP_START_FAILED"

    def __init__(
        self, server: str, problem: str, stderr_tail: str = "", *, spec: McpServer | None = None
    ) -> None:
        secrets = _secret_values(spec)
        problem, stderr_tail = _scrub(problem, secrets), _scrub(stderr_tail, secrets)
        tail = f"; stderr: {stderr_tail}" if stderr_tail else ""
        super().__init__(f"MCP server {server!r} did not start: {problem}{tail}")
        self.server = server
        self.problem = problem
        """What went wrong, without the stderr tail."""
        self.stderr_tail = stderr_tail
        has_command = spec is not None and spec.command is not None
        self.command: tuple[str, ...] = (
            tuple(_scrub(part, secrets) for part in (spec.command, *spec.args))
            if spec is not None and spec.command is not None
            else ()
        )
        """stdio: the command line run (empty for an HTTP or in-process server)."""
        self.cwd: str | None = spec.cwd if spec is not None and has_command else None
        self.env_names: tuple[str, ...] = tuple(spec.env or ()) if spec is not None else ()
        """The environment variables the spec sets (their values are never kept here)."""
        self.url: str | None = spec.url if spec is not None else None


@final
@attrs.frozen
class McpConnectionStatistics:
    """A snapshot of one connection's counters."""

    running: bool
    starts: int
    """Sessions started (the first one and every restart)."""
    calls: int
    tools: int
    skipped: int = 0
    """Tools of the last listing that are not offered (``McpConnection.skipped`` says why)."""


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
    requests and sends no cancellation when a caller is cancelled. ``google-re2`` runs the
    servers' schema regexes (``_schema.py``).
    """
    from importlib import metadata

    version = _sdk_version()
    if version is None:
        return "the MCP SDK is not installed (pip install 'dsh-agent-loop[mcp]')"
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) < 2:
        return f"mcp {version} is installed, and MCP servers need mcp>=2 (pip install 'mcp>=2')"
    try:
        metadata.version("google-re2")
    except metadata.PackageNotFoundError:
        return "google-re2 is not installed (pip install 'dsh-agent-loop[mcp]')"
    return None


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _problem(exc: BaseException) -> str:
    exc = _leaf(exc)
    if isinstance(exc, _NotStarted | ListingRefused):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _exit_problem(status: int) -> str:
    """Why a process that ended before the handshake did not start."""
    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    return f"its process {how} before it finished the MCP handshake"


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

    def __init__(self, spec: McpServer, publish: Publish, limits: Limits = DEFAULT_LIMITS) -> None:
        self.spec = spec
        self.limits = limits
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
        self._note = ""
        """Why the transport ended the current session, when it did (a message too large)."""
        self._exit_status: int | None = None
        """The exit status of the last stdio process, once it has ended."""
        self._starts = 0
        self._calls = 0
        self._tools = 0
        self._skipped: Mapping[str, str] = {}

    @property
    def skipped(self) -> Mapping[str, str]:
        """Tools of the last listing that are not offered: the server's name → the reason."""
        return dict(self._skipped)

    def statistics(self) -> McpConnectionStatistics:
        """A snapshot of the connection's counters."""
        return McpConnectionStatistics(
            running=self._session is not None,
            starts=self._starts,
            calls=self._calls,
            tools=self._tools,
            skipped=len(self._skipped),
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
        self._note = ""
        self._exit_status = None
        sdk_problem = _sdk_problem()
        if sdk_problem is not None:
            return McpStartError(self.spec.name, sdk_problem, spec=self.spec)
        starting = status is not trio.TASK_STATUS_IGNORED
        ready = False
        with tempfile.TemporaryFile() as errlog:
            try:
                async with self._open(errlog) as session:
                    listing = await self._start(session)
                    clash = await self._publish(listing, starting)
                    if clash is not None:
                        return McpStartError(self.spec.name, clash, spec=self.spec)
                    self._use(listing)
                    self._session, ready = session, True
                    self._starts += 1
                    self._finish_attempt()
                    status.started(None)
                    await self._follow(session)
                    self._session = None
            except Exception as exc:
                self._session = None
                if not ready:
                    problem = _problem(exc)
                    if self._exit_status is not None and _is_lost(_leaf(exc)):
                        problem = _exit_problem(self._exit_status)
                    return McpStartError(self.spec.name, problem, _tail(errlog), spec=self.spec)
                self._failed(f"the connection failed ({_problem(exc)}) {_tail(errlog)}".strip())
            finally:
                self._session = None
        return None

    async def _start(self, session: ClientSession) -> Listing:
        """``initialize``, then list the tools, each within ``START_TIMEOUT``."""
        with trio.move_on_after(START_TIMEOUT) as scope:
            await session.initialize()
        if scope.cancelled_caught:
            raise _NotStarted(
                f"it did not finish the MCP handshake (no answer to initialize) within"
                f" {START_TIMEOUT:g} s"
            )
        with trio.move_on_after(START_TIMEOUT) as scope:
            listed = await self._list(session)
        if scope.cancelled_caught:
            raise _NotStarted(f"it did not list its tools within {START_TIMEOUT:g} s")
        return self._build(listed)

    async def _list(self, session: ClientSession) -> list[Any]:
        """Every page of ``tools/list`` (stopping once there are more than the limit)."""
        from mcp_types import PaginatedRequestParams

        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(self.limits.mcp_max_tools + 1):
            params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            listed.extend(page.tools)
            if page.next_cursor is None or len(listed) > self.limits.mcp_max_tools:
                return listed
            cursor = page.next_cursor
        raise ListingRefused(
            f"it sent more than {self.limits.mcp_max_tools:,} pages of tools (limits.mcpMaxTools)"
        )

    def _build(self, listed: Sequence[Any]) -> Listing:
        spec = self.spec
        return build_tools(
            spec.name, spec.tool_prefix, spec.execution_modes, listed, self.call, self.limits
        )

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
                    listing = await self._refreshed(session)
                except Exception as exc:
                    if _is_lost(exc):
                        self._lose("the connection closed")
                        return
                    raise
                if listing is not None:
                    await self._publish(listing, False)
                    self._use(listing)

    async def _refreshed(self, session: ClientSession) -> Listing | None:
        """The new listing, or None (the old one stays) when it is late or refused."""
        timeout = self.limits.mcp_call_timeout
        problem = f"it did not list its tools within {timeout:g} s"
        with trio.move_on_after(timeout):
            try:
                return self._build(await self._list(session))
            except ListingRefused as exc:
                problem = str(exc)
        log.warning("MCP server %r: its changed tool list is not used: %s", self.spec.name, problem)
        return None

    @contextlib.asynccontextmanager
    async def _open(self, errlog: IO[bytes]) -> AsyncIterator[ClientSession]:
        from mcp.client.session import ClientSession

        spec = self.spec
        limit = self.limits.mcp_max_message_bytes
        if spec.command is not None:
            transport = open_stdio(spec, errlog, limit, self._noted, self._ended)
        elif spec.server is not None:
            transport = _in_process(spec.server)
        else:
            transport = open_http(spec, limit)
        async with (
            transport as (read, write),
            ClientSession(read, write, message_handler=self._on_message) as session,
        ):
            yield session

    def _noted(self, problem: str) -> None:
        self._note = problem

    def _ended(self, status: int) -> None:
        self._exit_status = status

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

    def _use(self, listing: Listing) -> None:
        self._tools = len(listing.tools)
        self._skipped = listing.skipped

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call the server's tool ``name``; every failure is an error result, never raised.

        No answer within ``limits.mcp_call_timeout`` is a ``TIMEOUT``; anything else that goes
        wrong is a ``TOOL_ERROR`` saying what.
        """
        self._calls += 1
        session = self._session or await self._restarted()
        if session is None:
            return error_text(self.spec.name, f"not running ({self._error})")
        timeout = self.limits.mcp_call_timeout
        try:
            with trio.move_on_after(timeout) as scope:
                result = await _call_tool(session, name, arguments)
        except Exception as exc:
            if _is_lost(exc):
                self._lose(f"the connection closed during a call to {name!r}")
                return error_text(self.spec.name, self._lost_call(exc))
            return error_text(self.spec.name, _problem(exc))
        if scope.cancelled_caught:
            return error_text(
                self.spec.name,
                f"the tool {name!r} did not answer within {timeout:g} s"
                " (limits.mcpCallTimeout); the call was cancelled",
                code="TIMEOUT",
            )
        self._failures = 0
        return tool_result(result)

    def _lost_call(self, exc: Exception) -> str:
        if self._note:  # the stdio transport closed it: a message too large to answer
            return f"the connection was closed: {self._note}"
        if "byte limit" in str(exc):  # an SSE event over the limit ends its stream
            return (
                f"the server's message was over the {self.limits.mcp_max_message_bytes:,}-byte"
                f" limit for one MCP message (limits.mcpMaxMessageBytes) ({exc})"
            )
        return f"the server stopped during the call ({exc})"

    async def _restarted(self) -> ClientSession | None:
        """Ask ``run`` to start the server again (unless backing off); the new session."""
        if trio.current_time() < self._retry_at:
            return None
        done = self._attempt
        self._restart.set()
        await done.wait()
        return self._session


async def _call_tool(session: ClientSession, name: str, arguments: Mapping[str, Any]) -> Any:
    """A plain ``tools/call`` request (no check against the server's output schema)."""
    import mcp_types as types

    params = types.CallToolRequestParams(name=name, arguments=thaw(arguments))
    return await session.send_request(types.CallToolRequest(params=params), types.CallToolResult)
