"""Builders for the event payloads that several layers write (tool calls and results)."""

from __future__ import annotations

from typing import Any

from .._frozen import FrozenDict

__all__ = ["tool_call_data", "tool_result_data"]


def tool_call_data(turn: int, step: int, block: FrozenDict) -> FrozenDict:
    """``tool/call`` data for a model tool-call block."""
    return FrozenDict(
        turn=turn,
        step=step,
        call_id=block["call_id"],
        name=block["name"],
        arguments=block.get("arguments", ""),
    )


def tool_result_data(
    turn: int,
    step: int,
    block: FrozenDict,
    text: str,
    *,
    error: tuple[str, str] | None = None,
    meta: Any = None,
) -> FrozenDict:
    """``tool/result`` data: the model-facing tool message, plus ``error: {name, code}``."""
    call_id, name = block["call_id"], block["name"]
    result = FrozenDict(
        type="tool-result", call_id=call_id, name=name, text=text, is_error=error is not None
    )
    message = FrozenDict(role="tool", call_id=call_id, name=name, content=(result,))
    data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
    if error is not None:
        data["error"] = FrozenDict(name=error[0], code=error[1])
    if meta is not None:
        data["meta"] = meta
    return FrozenDict(data)
