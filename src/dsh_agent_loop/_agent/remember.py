"""What a resume remembers: the options a session last ran with, read back from its log.

``rt.agents.resume(session_id)`` needs no options. Each field of the resumed agent's options is
the first of:

1. the field of the explicit ``options``, when set (None means "not given");
2. for provider, model, reasoning effort and max tokens: the config of the latest
   ``request/header`` the session itself wrote (what its last request used, an ``agent/request``
   listener's changes included; inherited seed events are the parent's, not this session's);
3. the session header: ``agent_id``, ``cwd``, and the ``options`` record that ``create`` writes
   (persona, visible tools, turn budget and the model fields as created).

The explicit ``options.id`` must be the session's agent id: a session belongs to one agent.
Sessions written before the header carried ``options`` still resume; what they never recorded
(persona, tools, turn budget; the model fields before a first request) stays unset. All sans-I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .._errors import InvalidOptionError
from ..events import REQUEST_HEADER, SESSION_END_SEED, Event
from .options import AgentOptions, TurnBudget

__all__ = ["HEADER_OPTIONS", "header_options", "remembered_options"]

#: The session-header key of the options record ``create`` writes.
HEADER_OPTIONS: Final = "options"
_MODEL_FIELDS: Final = ("provider", "model", "reasoning_effort", "max_tokens")
_HEADER_FIELDS: Final = (*_MODEL_FIELDS, "persona", "tools")


def header_options(options: AgentOptions) -> dict[str, Any]:
    """The ``options`` record of a new session header: the set fields a resume restores."""
    record = {name: getattr(options, name) for name in _HEADER_FIELDS}
    if options.require_approval:
        record["require_approval"] = sorted(options.require_approval)
    if options.turn_budget is not None:
        budget = attrs.asdict(options.turn_budget)
        record["turn_budget"] = {k: v for k, v in budget.items() if v is not None}
    return {k: v for k, v in record.items() if v is not None}


def remembered_options(
    header: Mapping[str, Any], stored: Sequence[Event], options: AgentOptions | None
) -> AgentOptions:
    """The options to resume a session with (see the module docstring for the precedence).

    Raises:
        InvalidOptionError: ``options.id`` is not the session's agent id, or a remembered
            value is invalid.
    """
    agent_id = str(header.get("agent_id") or (options.id if options is not None else ""))
    if options is not None and options.id != agent_id:
        raise InvalidOptionError(
            f"options.id {options.id!r} is not the agent of this session ({agent_id!r});"
            " leave it out or use the session's agent id"
        )
    fields: dict[str, Any] = dict(header.get(HEADER_OPTIONS) or {})
    if header.get("cwd") is not None:
        fields["cwd"] = header["cwd"]
    config = _latest_config(stored)
    if config is not None:
        fields.update({name: config.get(name) for name in _MODEL_FIELDS})
    if fields.get("tools") is not None:
        fields["tools"] = tuple(fields["tools"])
    if fields.get("turn_budget") is not None:
        fields["turn_budget"] = TurnBudget(**fields["turn_budget"])
    known = {f.name for f in attrs.fields(AgentOptions)}
    remembered = {k: v for k, v in fields.items() if k in known and v is not None}
    if options is not None:
        given = attrs.asdict(options, recurse=False)
        remembered.update({k: v for k, v in given.items() if v is not None})
    remembered["id"] = agent_id
    resolved = AgentOptions(**remembered)
    resolved.validate()
    return resolved


def _latest_config(stored: Sequence[Event]) -> Mapping[str, Any] | None:
    """The config of the latest ``request/header`` after the seed, or None (no request yet)."""
    first = next((i for i, e in enumerate(stored) if e.type == SESSION_END_SEED), -1)
    for i in range(len(stored) - 1, first, -1):
        event = stored[i]
        if event.type == REQUEST_HEADER:
            config: Mapping[str, Any] = event.data["header"]["config"]
            return config
    return None
