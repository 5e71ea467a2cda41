"""``open_runtime``: composes store, router, tools, hooks and settings; owns the root nursery.

Shutdown order is the design here. The runtime's root nursery holds the group-commit timer
(in a shielded scope of its own) and the agents' nursery, where each agent is one task with its
own nursery: the task runs the agent's session writer, and the nursery holds the agent's driver
(while there is work) and its tool workers. Each agent's nursery is shielded, so a cancel from
outside the block — the scope around it, or the caller's nursery — reaches the body, never an
agent directly. Leaving the block then disposes every agent: its running turn is aborted
(``aborted {cause: disposed}``), appends its closers (interrupted anchor, synthetic tool
results, ``step/end``, ``turn/end``) and flushes them, shielded and bounded, to its writer,
which is still there; the writer then commits what is left and closes. An agent whose teardown
overran is cancelled (its final commit is bounded too); only when every agent's task has ended
are the timer cancelled and the providers' clients and the store closed. Every wait of that
path is bounded, so a hung store cannot hang it.

The runtime never outlives its ``async with`` block. Leaving it disposes every agent (each turn
ends ``aborted {cause: disposed}``, each session writer flushes and releases ownership). An
exception raised by the body leaves the block as it was raised when it is the only failure; with
runtime failures beside it, an exception group holds them all. Cancellations are not failures: a
cancelled block leaves with a plain ``trio.Cancelled`` (never one wrapped in an exception group),
so the cancel scope that caused it catches it.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from ._agent.delegate import delegate_tool
from ._agent.lifecycle import Agents, Setup
from ._agent.options import AgentOptions, CompactionPolicy
from ._agent.services import Services
from ._compose import (
    Policies,
    builtin_tool,
    fleet_options_from_config,
    load_config,
    mcp_servers_from_config,
    options_from_entry,
    protected_paths,
    providers_from_config,
    store_from_config,
    tools_from_config,
)
from ._errors import AgentLoopError
from ._fleet.worker import Worker
from ._gc import GcFreezer
from ._hooks import HookBus, call_observer
from ._limits import Limits
from ._permissions import Permissions
from ._providers import AnthropicProvider, OpenAIProvider, adapters_from_arguments
from ._sandbox import Sandbox
from ._session.store import SessionStore
from ._session.writer import CommitTimer
from ._tools.base import Tool, register
from .config import RuntimeConfig, Settings
from .events import CONFIG_START_FAILED, make_event
from .fleet import FleetClient, FleetOptions
from .llm import ModelAdapter, ModelRouter
from .mcp import McpServer, McpServers, open_mcp_servers

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Runtime", "RuntimeStatistics", "StartFailure", "open_runtime"]

#: Seconds the runtime's shutdown may spend disposing agents before it cancels them.
SHUTDOWN_TIMEOUT = 30.0
#: The ``RuntimeStatistics`` fields that sum the live agents' ``AgentStatistics``.
_SUMMED = (
    "turns",
    "steps",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "reasoning_tokens",
)


@final
@attrs.frozen
class StartFailure:
    """A declared agent, or an MCP server (``mcpServers.<name>``), that failed to start.

    An agent whose tools come from a server that did not start is one too, its ``error`` the
    server's ``McpStartError`` (``docs/mcp.md#a-server-that-does-not-start``).
    """

    agent_id: str
    error: BaseException


@final
@attrs.frozen
class RuntimeStatistics:
    """A snapshot of one runtime's counters (``rt.statistics()``)."""

    agents: int
    """Live agents (each one task, with its own nursery, in the runtime's agents' nursery)."""
    sessions: int
    """Live sessions, each written by one live agent's session writer."""
    start_failures: int
    """Declared agents that failed to start."""
    pending_commits: int
    """Sessions whose appended events wait for the group-commit timer."""
    turns: int = 0
    """Turns run, summed over live agents (each counts since it was created or resumed)."""
    steps: int = 0
    """Steps entered, summed over live agents."""
    tool_calls: int = 0
    """Tool calls the models asked for, summed over live agents."""
    input_tokens: int = 0
    """Input tokens, summed over live agents (``AgentStatistics`` says where they come from)."""
    output_tokens: int = 0
    """Output tokens, summed over live agents."""
    cache_read_tokens: int = 0
    """Cache-read input tokens, summed over live agents."""
    reasoning_tokens: int = 0
    """Reasoning tokens, summed over live agents."""


@final
class Runtime:
    """The live runtime inside ``open_runtime``: ``agents``, ``hooks``, ``store``, ``settings``."""

    def __init__(
        self,
        *,
        nursery: trio.Nursery,
        store: SessionStore,
        router: ModelRouter,
        tools: Mapping[str, Tool],
        settings: Settings,
        clock: Callable[[], float],
        rng: random.Random,
        config: RuntimeConfig,
        policies: Policies | None = None,
    ) -> None:
        policies = policies or Policies()
        compaction = policies.compaction
        if compaction is not None:
            compaction.validate()
        self.store = store
        self.router = router
        self.hooks = HookBus()
        self.settings = settings
        self.config = config
        self.clock = clock
        self.random = rng
        self.limits = policies.limits
        """Bounds on what models and tool servers send (``docs/limits.md``)."""
        self.tools: dict[str, Tool] = dict(tools)
        """Runtime tools by name (visible to every agent unless its options name a subset)."""
        self.start_failures: list[StartFailure] = []
        self.mcp: McpServers | None = None
        """The MCP server connections (set when the runtime opens)."""
        self.fleet: FleetClient | None = None
        """A fleet worker's client of its fleet (``docs/fleet.md``); None without ``fleet``."""
        self.worker: Worker | None = None
        """The fleet worker (None without ``fleet``)."""
        self._gc = GcFreezer()
        self._services = Services(
            router=router,
            hooks=self.hooks,
            tools=lambda: self.tools,
            builtin=builtin_tool,
            max_parallel_tool_calls=lambda: settings.max_parallel_tool_calls,
            persona=lambda: settings.persona,
            turn_budget=lambda: settings.turn_budget,
            clock=clock,
            rng=rng,
            compaction=compaction,
            limits=policies.limits,
            permissions=policies.permissions,
            sandbox=policies.sandbox,
            protected=protected_paths(config, store),
        )
        self.commit_timer = CommitTimer()
        """Commits what sessions left pending without a flush barrier (group commit)."""
        self.agents = Agents(
            store=store,
            services=self._services,
            hooks=self.hooks,
            nursery=nursery,
            timer=self.commit_timer,
        )
        self.subagents: dict[str, tuple[AgentOptions, Setup | None]] = {}
        """Declared sub-agents (config ``subagents``) by id: ``delegate_tool(rt, id)`` names one."""
        for sub in config.plugin.subagents:
            self.subagents[sub.id] = options_from_entry(sub.agent_entry())
            tool = delegate_tool(self, sub.id, name=sub.tool, description=sub.description)
            self.tools.setdefault(tool.name, tool)  # a tool given to open_runtime wins

    def add_tool(self, tool: Tool) -> Callable[[], None]:
        """Register a runtime tool; returns a disposer."""
        return register(self.tools, tool)

    def gc_freeze(self) -> int:
        """Collect, then ``gc.freeze()``: later collections skip every object alive now.

        Call it after creating many long-lived agents, so the collector stops rescanning them
        (``docs/scale.md``). Returns the number of objects frozen. When the runtime closes it
        calls ``gc.unfreeze()``, unless objects were already frozen before its first freeze.
        """
        return self._gc.freeze()

    def statistics(self) -> RuntimeStatistics:
        """A snapshot of the runtime's counters; work and token totals sum the live agents'."""
        agents = [a.statistics() for a in self.agents.list()]
        return RuntimeStatistics(
            agents=len(agents),
            sessions=self.agents.session_count(),
            start_failures=len(self.start_failures),
            pending_commits=self.commit_timer.statistics().waiting_writers,
            **{name: sum(getattr(s, name) for s in agents) for name in _SUMMED},
        )

    async def start_declared_agents(
        self, mcp: McpServers | None = None, *, gc_freeze: bool = False
    ) -> None:
        """Start the MCP servers, then the agents declared; failures go to ``start_failures``.

        ``gc_freeze``: then ``self.gc_freeze()`` (``open_runtime(gc_freeze=True)``).
        """
        if mcp is not None:
            await self._start_mcp_servers(mcp)
        for entry in self.config.agents:
            try:
                options, setup = options_from_entry(entry)
                options = self._with_mcp_tools(options)  # a server it needs failed: raises
                if entry.resume_session_id is not None:
                    await self.agents.resume(entry.resume_session_id, options=options, setup=setup)
                elif entry.session_id is not None:
                    await self.agents.resume(
                        entry.session_id, options=options, setup=setup, create_if_missing=True
                    )
                else:
                    await self.agents.create(options=options, setup=setup)
            except (AgentLoopError, OSError, ValueError) as exc:
                self.start_failures.append(StartFailure(entry.id, exc))
                if self.hooks.has("on", CONFIG_START_FAILED):
                    event = make_event(
                        CONFIG_START_FAILED,
                        None,
                        self.clock(),
                        _frozen({"agent_id": entry.id, "error": exc}),
                    )
                    for fn in self.hooks.listeners("on", CONFIG_START_FAILED):
                        call_observer(fn, CONFIG_START_FAILED, event)
        if gc_freeze:
            self.gc_freeze()

    async def _start_mcp_servers(self, mcp: McpServers) -> None:
        """Start the MCP servers; their tools become runtime tools, their failures entries.

        A server tool named like a runtime tool (given to ``open_runtime``, declared in the
        config) or a built-in is that server's start failure (``docs/mcp.md``).
        """
        self.mcp = mcp

        def taken(name: str) -> str | None:
            if name in self.tools:
                return f"the runtime tool {name!r}"
            if builtin_tool(name) is not None:
                return f"the built-in tool {name!r}"
            return None

        for error in await mcp.start(self.add_tool, taken):
            self.start_failures.append(StartFailure(f"mcpServers.{error.server}", error))
        for sub_id, (options, setup) in list(self.subagents.items()):
            # A sub-agent that needs a failed server keeps its names; its creation is refused.
            with contextlib.suppress(AgentLoopError):
                self.subagents[sub_id] = (self._with_mcp_tools(options), setup)

    def _with_mcp_tools(self, options: AgentOptions) -> AgentOptions:
        """``options`` with ``<server>__*`` expanded (``docs/mcp.md#tools``).

        Raises:
            McpStartError: a server whose tools the agent needs did not start.
            InvalidOptionError: a named MCP tool its server does not offer.
        """
        if self.mcp is None:
            return options
        names = self.mcp.agent_tools(options.tools)
        if names == options.tools:
            return options
        return attrs.evolve(options, tools=names)  # type: ignore[arg-type]  # attrs plugin: optional(tuple) stays generic

    async def _dispose_agents(self) -> None:
        with trio.move_on_after(SHUTDOWN_TIMEOUT):
            await self.agents.dispose_all()


async def _run_timer(timer: CommitTimer, scope: trio.CancelScope) -> None:
    """Run the group-commit timer in ``scope`` (shielded: it outlives every agent's task).

    Started with ``start_soon``, not ``start``: a ``start`` made from an already cancelled scope
    would wait for a shielded task that trio never lets report itself started.
    """
    with scope:
        await timer.run()


def _frozen(data: dict[str, Any]) -> Any:
    from ._frozen import FrozenDict

    return FrozenDict(data)


@asynccontextmanager
async def open_runtime(
    config: RuntimeConfig | str | Mapping[str, Any] | None = None,
    *,
    store: SessionStore | None = None,
    providers: Mapping[str, ModelAdapter | OpenAIProvider | AnthropicProvider] | None = None,
    tools: Iterable[Tool] = (),
    max_parallel_tool_calls: int | None = None,
    settings: Mapping[str, Any] | None = None,
    clock: Callable[[], float] | None = None,
    seed: int | None = None,
    tracer_provider: TracerProvider | None = None,
    otel_capture_content: bool = False,
    mcp_servers: Iterable[McpServer] = (),
    compaction: CompactionPolicy | None = None,
    gc_freeze: bool = False,
    limits: Limits | None = None,
    permissions: Permissions | None = None,
    sandbox: Sandbox | None = None,
    fleet: FleetOptions | None = None,
) -> AsyncIterator[Runtime]:
    """Open a runtime; every agent it starts lives and dies inside this block.

    Args:
        config: A ``RuntimeConfig``, a path to a YAML file, or the same shape as a mapping.
        store: The session store (wins over the config's; default ``MemoryStore()``).
        providers: Model adapters or provider objects by name (win over the config's).
        tools: Runtime tools, visible to every agent unless its options name a subset.
        max_parallel_tool_calls: Explicit setting (wins over every other layer).
        settings: The user settings layer (camelCase keys, like the plugin config block).
        clock: Stamps ``Event.time`` (default: wall-clock seconds).
        seed: Seeds the runtime's one random source (retry jitter, simulation).
        tracer_provider: Trace to this OpenTelemetry provider (``docs/observability.md``).
        otel_capture_content: Record message content on the spans (default off).
        mcp_servers: MCP servers whose tools become runtime tools (``docs/mcp.md``).
        gc_freeze: ``rt.gc_freeze()`` once the declared agents started (``docs/scale.md``).
        compaction: Agents' compaction policy unless theirs is set (``docs/context.md``).
        limits: Bounds on what models and tools send (wins over the config's; docs/limits.md).
        permissions: Agents' permission policy unless theirs is set (``docs/security.md``).
        sandbox: Agents' ``run_command`` sandbox unless theirs is set (``docs/security.md``).
        fleet: Make the runtime a fleet worker (wins over the config's; ``docs/fleet.md``).

    Raises:
        ConfigError: invalid configuration (before any store opens); a fleet on a bad store.
    """
    parts = _parts(config, store, providers, tools, settings, max_parallel_tool_calls)
    cfg, the_store, router = parts.config, parts.store, parts.router
    client = _fleet_client(the_store, fleet or fleet_options_from_config(cfg))
    policies = Policies.of(cfg, compaction, limits, permissions, sandbox)
    body_error: BaseException | None = None
    timer_scope = trio.CancelScope(shield=True)
    try:
        async with trio.open_nursery() as root, _open_mcp(cfg, mcp_servers, policies.limits) as mcp:
            try:
                async with trio.open_nursery() as agents:
                    rt = parts.runtime(agents, clock or time.time, random.Random(seed), policies)
                    _trace(rt, tracer_provider, otel_capture_content)
                    root.start_soon(_run_timer, rt.commit_timer, timer_scope)
                    try:
                        await rt.start_declared_agents(mcp, gc_freeze=gc_freeze)
                        await _start_worker(rt, root, client)
                        yield rt
                    except BaseException as exc:
                        body_error = exc
                    finally:
                        if rt.worker is not None:
                            await rt.worker.stop()
                        await _end_agents(rt, agents)
            finally:
                # Every agent's task has ended, its closers committed: now the timer may go.
                timer_scope.cancel()
                with trio.CancelScope(shield=True):
                    if client is not None:
                        await client.client.aclose()
                    await _close(router, the_store)
    except BaseExceptionGroup as group:
        leaving: BaseException | None = _leaving(body_error, group)
    else:
        leaving = body_error
    if leaving is not None:
        raise leaving  # outside the handler: the body's exception keeps its own context


@final
@attrs.frozen
class _Parts:
    """What ``open_runtime`` builds before it opens anything."""

    config: RuntimeConfig
    settings: Settings
    store: SessionStore
    router: ModelRouter
    tools: dict[str, Tool]

    def runtime(
        self,
        nursery: trio.Nursery,
        clock: Callable[[], float],
        rng: random.Random,
        policies: Policies,
    ) -> Runtime:
        """The runtime, its agents in ``nursery``."""
        return Runtime(
            nursery=nursery,
            store=self.store,
            router=self.router,
            tools=self.tools,
            settings=self.settings,
            clock=clock,
            rng=rng,
            config=self.config,
            policies=policies,
        )


def _parts(
    config: RuntimeConfig | str | Mapping[str, Any] | None,
    store: SessionStore | None,
    providers: Mapping[str, ModelAdapter | OpenAIProvider | AnthropicProvider] | None,
    tools: Iterable[Tool],
    settings: Mapping[str, Any] | None,
    max_parallel_tool_calls: int | None,
) -> _Parts:
    """What ``open_runtime`` builds before it opens anything: config, settings, store, router.

    Raises:
        ConfigError: invalid configuration.
    """
    explicit = dict(providers or {})
    explicit_tools = {t.name: t for t in tools}
    cfg = load_config(config, known_providers=explicit.keys(), known_tools=explicit_tools)
    live_settings = Settings(
        cfg.plugin, user=settings, max_parallel_tool_calls=max_parallel_tool_calls
    )
    the_store = store if store is not None else store_from_config(cfg)
    adapters = {**providers_from_config(cfg), **adapters_from_arguments(explicit)}
    return _Parts(
        cfg,
        live_settings,
        the_store,
        ModelRouter(adapters),
        tools_from_config(cfg, explicit_tools),
    )


def _trace(rt: Runtime, provider: TracerProvider | None, capture_content: bool) -> None:
    """Trace ``rt`` when a provider is given or the config asks for it (extra ``otel``)."""
    otel = rt.config.plugin.otel
    if provider is not None or (otel is not None and otel.enabled):
        from .otel import trace_runtime  # imports opentelemetry: only when asked

        content = capture_content or (otel is not None and otel.capture_content)
        trace_runtime(rt, provider, capture_content=content)


def _fleet_client(store: SessionStore, fleet: FleetOptions | None) -> _WorkerClient | None:
    """The fleet client of a worker runtime (None: not a worker).

    Raises:
        ConfigError: the store cannot carry a fleet.
    """
    if fleet is None:
        return None
    return _WorkerClient(FleetClient(store, lease=fleet.lease_s), fleet)


@final
@attrs.frozen
class _WorkerClient:
    client: FleetClient
    options: FleetOptions


async def _start_worker(rt: Runtime, root: trio.Nursery, fleet: _WorkerClient | None) -> None:
    """Make ``rt`` a fleet worker (``docs/fleet.md``) when ``fleet`` is given."""
    if fleet is not None:
        rt.fleet = fleet.client
        rt.worker = Worker(rt.agents, rt.store, fleet.options, fleet.client)
        await root.start(rt.worker.run)


async def _end_agents(rt: Runtime, agents: trio.Nursery) -> None:
    """Dispose every agent (shielded, bounded), then cancel whatever teardown overran."""
    try:
        with trio.CancelScope(shield=True):
            await rt._dispose_agents()
    finally:
        # Whatever teardown overran: its task's final commit is bounded.
        rt.agents.cancel_remaining()
        agents.cancel_scope.cancel()
        rt._gc.release()  # what the runtime froze is the collector's again


def _open_mcp(
    config: RuntimeConfig, explicit: Iterable[McpServer], limits: Limits
) -> AbstractAsyncContextManager[McpServers]:
    """The config's MCP servers and ``open_runtime``'s (which win by name), not yet started."""
    declared = mcp_servers_from_config(config)
    return open_mcp_servers([*declared, *explicit], limits=limits)


async def _close(router: ModelRouter, store: SessionStore) -> None:
    try:
        await router.aclose()
    finally:
        await store.aclose()


def _leaving(body_error: BaseException | None, group: BaseExceptionGroup[Any]) -> BaseException:
    """What leaves ``open_runtime`` when its nurseries raised ``group``.

    Cancellations are not failures: when nothing else failed, a plain ``trio.Cancelled`` leaves
    (the body's own, else the first one raised), so the cancelled scope around the block catches
    it. A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
    ...) raised by a tool or a hook leaves as itself, never in a group: the process is being
    stopped, and a caller's ``except KeyboardInterrupt`` must see it. The body's exception
    otherwise leaves beside the runtime's failures, in one group; a body that was only cancelled
    because the runtime failed adds nothing to it.
    """
    cancelled, failures = group.split(trio.Cancelled)
    if failures is None:
        if body_error is not None:
            return body_error
        assert cancelled is not None
        return _first_leaf(cancelled)
    stopping = _first_stopping(failures)
    if stopping is not None:
        return stopping
    if body_error is None or isinstance(body_error, trio.Cancelled):
        return failures
    return BaseExceptionGroup("runtime failed", [body_error, *failures.exceptions])


def _first_stopping(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first leaf of ``group`` that stops a process: no ``Exception``, no cancellation."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _first_stopping(exc)
            if found is not None:
                return found
        elif not isinstance(exc, Exception | trio.Cancelled):
            return exc
    return None


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
