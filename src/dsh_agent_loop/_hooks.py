"""The hook bus: sync observers (``on``), async middleware (``waterfall``), ``serial`` hooks.

Order rule: listeners run in registration order, runtime-wide ones before an agent's scoped
ones; a waterfall's built-in default is the innermost step, reached only when every listener
calls ``next``. A listener that returns without calling ``next`` short-circuits the chain.

Each registration returns a disposer that removes exactly that registration (calling it twice
is harmless). A ``HookScope`` records the registrations made through it, so an agent's scoped
hooks vanish with the agent. Invocation is cheap when nobody listens: the driver asks
``has(name)`` and skips building payloads.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

__all__ = ["Disposer", "HookBus", "HookScope", "call_observer"]

Disposer = Callable[[], None]
Observer = Callable[[Any], None]
Next = Callable[[Any], Awaitable[Any]]
Middleware = Callable[[Any, Next], Awaitable[Any]]
SerialFn = Callable[[Any], Awaitable[None]]

_KINDS: Final = ("on", "waterfall", "serial")
_log: Final = logging.getLogger("dsh_agent_loop._hooks")
_EMPTY: Final[dict[str, dict[str, list[Any]]]] = {k: {} for k in _KINDS}  # shared, never mutated


def call_observer(fn: Observer, name: str, event: Any) -> None:
    """Call one ``on`` observer; what it raises is logged and goes no further.

    An observer watches; it cannot veto or stop an agent (``session/created`` is the one hook
    whose raising listener vetoes, and the lifecycle calls those listeners itself).
    """
    try:
        fn(event)
    except Exception:
        _log.exception("observer %r of %r raised; ignored", fn, name)


@final
class HookBus:
    """Listeners by hook name. ``rt.hooks`` is the runtime's bus."""

    __slots__ = ("_lists",)

    def __init__(self) -> None:
        self._lists: dict[str, dict[str, list[Any]]] = _EMPTY

    def _add(self, kind: str, name: str, fn: Any) -> Disposer:
        # Copy-on-write: a chain already running keeps the list it started with.
        if self._lists is _EMPTY:  # tables are made on first registration (agents are many)
            self._lists = {k: {} for k in _KINDS}
        table = self._lists[kind]
        entry = (fn,)  # a unique wrapper so the same fn registered twice is two registrations
        table[name] = [*table.get(name, ()), entry]

        def dispose() -> None:
            current = table.get(name)
            if current is None:
                return
            remaining = [e for e in current if e is not entry]
            if len(remaining) != len(current):
                if remaining:
                    table[name] = remaining
                else:
                    del table[name]

        return dispose

    def on(self, name: str, fn: Observer) -> Disposer:
        """Register a sync observer ``fn(event)`` for notification ``name``."""
        return self._add("on", name, fn)

    def waterfall(self, name: str, fn: Middleware) -> Disposer:
        """Register async middleware ``fn(payload, next)`` for hook ``name``."""
        return self._add("waterfall", name, fn)

    def serial(self, name: str, fn: SerialFn) -> Disposer:
        """Register ``fn(payload)``, awaited in order with the other serial listeners."""
        return self._add("serial", name, fn)

    def emit(self, name: str, event: Any) -> None:
        """Call the ``on`` observers of ``name``; a raising observer is logged and isolated."""
        for entry in self._lists["on"].get(name, ()):  # lists are copy-on-write
            call_observer(entry[0], name, event)

    def listeners(self, kind: str, name: str) -> list[Any]:
        """The listeners of ``kind`` for ``name``, in registration order (a copy)."""
        return [e[0] for e in self._lists[kind].get(name, ())]

    def has(self, kind: str, name: str) -> bool:
        """True when ``kind`` (``on``/``waterfall``/``serial``) listeners exist for ``name``."""
        return name in self._lists[kind]

    def any(self, kind: str) -> bool:
        """True when ``kind`` listeners exist for any name."""
        return bool(self._lists[kind])


@final
class HookScope:
    """A view that registers on ``bus`` and remembers what it registered, for ``close()``."""

    __slots__ = (
        "_disposers",
        "bus",
        "closed",
    )

    def __init__(self, bus: HookBus) -> None:
        self.bus = bus
        self._disposers: list[Disposer] | None = None  # made on the first registration
        self.closed = False

    def _register(self, kind: str, name: str, fn: Any) -> Disposer:
        if self.closed:
            raise RuntimeError("this scope is closed")
        disposer = self.bus._add(kind, name, fn)
        if self._disposers is None:
            self._disposers = []
        self._disposers.append(disposer)
        return disposer

    def on(self, name: str, fn: Observer) -> Disposer:
        """Register a scoped observer."""
        return self._register("on", name, fn)

    def waterfall(self, name: str, fn: Middleware) -> Disposer:
        """Register scoped middleware."""
        return self._register("waterfall", name, fn)

    def serial(self, name: str, fn: SerialFn) -> Disposer:
        """Register a scoped serial listener."""
        return self._register("serial", name, fn)

    def close(self) -> None:
        """Remove every registration made through this scope (idempotent)."""
        self.closed = True
        disposers, self._disposers = self._disposers, None
        for dispose in disposers or ():
            dispose()


@final
class HookChain:
    """Runs hooks over a runtime bus plus an optional scoped bus (runtime listeners first)."""

    __slots__ = ("_buses", "_inner", "_many", "_outer")

    def __init__(self, *buses: HookBus) -> None:
        # The common shape, runtime bus + agent bus, is checked without a loop (``has`` runs
        # several times a step) and keeps no tuple (one object less per agent); fewer buses
        # are padded with an empty one; only three or more are kept as a tuple.
        self._many = len(buses) > 2
        self._buses: tuple[HookBus, ...] | None = buses if self._many else None
        if len(buses) < 2:
            buses = (*buses, HookBus(), HookBus())[:2]
        self._outer = buses[0]
        self._inner = buses[1]

    def add_inner(self, bus: HookBus) -> None:
        """Use ``bus`` as the inner (scoped) bus from now on (made on first scoped use)."""
        if self._many:
            raise RuntimeError("a chain of more than two buses has no single inner bus")
        self._inner = bus

    def _all(self) -> tuple[HookBus, ...]:
        return self._buses if self._buses is not None else (self._outer, self._inner)

    def has(self, kind: str, name: str) -> bool:
        """True when any bus has listeners of ``kind`` for ``name``."""
        if self._many:
            return any(bus.has(kind, name) for bus in self._all())
        return self._outer.has(kind, name) or self._inner.has(kind, name)

    def any(self, kind: str) -> bool:
        """True when any bus has listeners of ``kind`` for any name (a cheap first check)."""
        if self._many:
            return any(bus.any(kind) for bus in self._all())
        return self._outer.any(kind) or self._inner.any(kind)

    def emit(self, name: str, event: Any) -> None:
        """Call the observers of ``name``; a raising observer is logged and isolated."""
        if self._buses is None:
            self._outer.emit(name, event)
            self._inner.emit(name, event)
            return
        for bus in self._buses:
            bus.emit(name, event)

    async def waterfall(
        self, name: str, payload: Any, default: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        """Run the middleware chain of ``name`` around ``default``."""
        fns: list[Middleware] = []
        for bus in self._all():
            fns.extend(bus.listeners("waterfall", name))
        if not fns:
            return await default(payload)

        def link(i: int) -> Next:
            if i == len(fns):
                return default

            async def call(p: Any) -> Any:
                return await fns[i](p, link(i + 1))

            return call

        return await link(0)(payload)

    async def serial(self, name: str, payload: Any) -> None:
        """Await each serial listener of ``name`` in order."""
        for bus in self._all():
            for fn in bus.listeners("serial", name):
                await fn(payload)
