"""``RequestSeries``: one agent's requests as a series (docs/design.md#request-series).

The series decides, for each request, whether a new request series starts, which
``system/message`` events reconcile the system prompt, and which ``request/header`` and
``request/context`` records the request writes. It owns what that needs to remember between
requests of one agent instance: whether a request was sent yet, the surface replacement
generation it last saw, and what the last request settled.

Skipping work is decided by version counters, never by the identity of a cached list: the
system nodes can change only by a ``system/message`` append (their count grows) or by a surface
replacement (the generation grows), so ``(generation, node count)`` names one state of the
nodes. The header inputs (config, prepared call, tool schemas, logged header) are frozen
values, so "the same objects as last time" means "unchanged".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from .._frozen import FrozenDict
from ..events import REQUEST_CONTEXT, REQUEST_HEADER, SYSTEM_MESSAGE
from .prompt import reconcile, system_message
from .request import context_record, header_reason, header_record

if TYPE_CHECKING:
    from .._session.log import Session
    from ..llm import PreparedCall

__all__ = ["RequestSeries"]


@final
class RequestSeries:
    """Prompt reconciliation and request records across one agent instance's requests."""

    __slots__ = (
        "_config",
        "_header",
        "_in_history",
        "_nodes_count",
        "_nodes_generation",
        "_prepared",
        "_rendered",
        "_schemas",
        "_session",
        "first_request",
        "seen_generation",
    )

    def __init__(self, session: Session) -> None:
        self._session = session
        self.first_request = True
        """No request sent by this agent instance yet (its header says ``initial``/``resume``)."""
        self.seen_generation = session.surface.generation
        """The surface replacement generation at attach or after the last request."""
        # What the last request settled: node version, render and mode (prompt); the header's
        # inputs and the header logged after it (records). Unset before the first request.
        self._nodes_generation = -1
        self._nodes_count = -1
        self._rendered: str | None = None
        self._in_history = False
        self._config: FrozenDict | None = None
        self._prepared: PreparedCall | None = None
        self._schemas: tuple[FrozenDict, ...] | None = None
        self._header: FrozenDict | None = None

    def starts(self, asked: bool, schemas: tuple[FrozenDict, ...]) -> bool:
        """Whether this request starts a new series (decided before reconciling).

        Args:
            asked: ``agent/pre-step`` set ``starts_request_series``.
            schemas: The visible tool schemas.
        """
        if asked or self._session.surface.generation != self.seen_generation:
            return True
        logged = self._session.state.header
        return logged is not None and tuple(logged.get("tools", ())) != schemas

    def reconcile_prompt(
        self, turn: int, step: int, rendered: str, in_history: bool, new_series: bool
    ) -> None:
        """Append the ``system/message`` events that reconcile the prompt with ``rendered``."""
        session = self._session
        surface = session.surface
        if (
            surface.generation == self._nodes_generation
            and len(surface.system_nodes) == self._nodes_count
            and rendered == self._rendered
            and in_history == self._in_history
            and not new_series
        ):
            return  # same nodes, same prompt: the last reconcile left nothing to do
        for draft in reconcile(
            surface.node_texts(), rendered, in_history=in_history, new_series=new_series
        ):
            data = FrozenDict(turn=turn, step=step, message=system_message(draft.text))
            if draft.replaces is None:
                session.add(SYSTEM_MESSAGE, data)
            else:
                op = FrozenDict(op="replace", start_seq=draft.replaces, end_seq=draft.replaces)
                session.add(
                    SYSTEM_MESSAGE, data, surface_op=op, source_event_seqs=(draft.replaces,)
                )
        self._rendered = rendered
        self._in_history = in_history

    def write_records(
        self,
        config: FrozenDict,
        prepared: PreparedCall,
        schemas: tuple[FrozenDict, ...],
        new_series: bool,
    ) -> None:
        """Append the request's ``request/header`` and ``request/context`` when they changed.

        Then the series settles: what this request saw is what the next one compares with.
        """
        session = self._session
        logged = session.state.header
        if (
            logged is not None
            and config is self._config
            and prepared is self._prepared
            and schemas is self._schemas
            and logged is self._header
        ):
            header = logged  # same inputs as the request that logged it
        else:
            header = header_record(config, prepared, schemas)
        reason = header_reason(
            logged, header, first_request=self.first_request, new_series=new_series
        )
        if reason is not None:
            record: dict[str, Any] = {"header": header, "reason": reason}
            if reason == "change" and new_series:
                record["starts_series"] = True
            session.add(REQUEST_HEADER, FrozenDict(record))
        if prepared is not self._prepared:
            context = context_record(prepared, session.state.context)
            if context is not None:
                session.add(REQUEST_CONTEXT, context)
        self._config, self._prepared, self._schemas = config, prepared, schemas
        self._header = session.state.header
        surface = session.surface
        self._nodes_generation = surface.generation
        self._nodes_count = len(surface.system_nodes)
        self.first_request = False
        self.seen_generation = surface.generation
