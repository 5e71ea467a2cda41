"""One tool handler's run inside the tool pipeline's middleware, and a raising handler's result.

A handler's bad outcome is its call's result, never the batch's: an ``Exception`` it raises is a
``TOOL_ERROR`` result naming the exception, and whatever it (or ``tools/execute`` /
``tools/post-execute`` middleware) returns is checked by ``tools.results.checked_result``. Only
``Exception`` is a result: ``KeyboardInterrupt``, ``SystemExit``, ``trio.Cancelled`` and other
``BaseException``s are not the tool's answer and propagate, as trio expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._tools.base import Tool, ToolContext, ToolResult
from .._tools.results import checked_result, escape_surrogates, exception_text
from ..events import HOOK_TOOLS_EXECUTE, HOOK_TOOLS_POST_EXECUTE

if TYPE_CHECKING:
    from .._hooks import HookChain

__all__ = ["call_handler", "invoke", "raised"]


async def invoke(
    hooks: HookChain, tool: Tool, payload: Mapping[str, Any], context: ToolContext
) -> tuple[ToolResult | str, str | None]:
    """Run ``tool``'s handler inside the ``tools/execute`` and ``tools/post-execute`` chains.

    ``payload`` is what the chains receive (``agent``, ``call_id``, ``name``, ``arguments``,
    ``turn``, ``step``). Returns the checked result and, for a failure, its error name.
    """
    failed: list[str] = []

    async def run_handler(payload: Any) -> ToolResult:
        # Middleware always sees a ToolResult; a raising handler is a TOOL_ERROR result.
        result, error_name = await call_handler(tool, payload["arguments"], context)
        if error_name is not None:
            failed.append(error_name)
        if isinstance(result, str):
            return ToolResult(content=result)
        return result

    if hooks.has("waterfall", HOOK_TOOLS_EXECUTE):
        value = await hooks.waterfall(HOOK_TOOLS_EXECUTE, payload, run_handler)
    else:
        value = await run_handler(payload)
    if isinstance(value, str):
        value = ToolResult(content=value)
    if not isinstance(value, ToolResult):
        raise TypeError(f"tools/execute returned {type(value).__name__}, not a ToolResult")
    if hooks.has("waterfall", HOOK_TOOLS_POST_EXECUTE):

        async def keep(p: Any) -> Any:
            return p["result"]

        value = await hooks.waterfall(HOOK_TOOLS_POST_EXECUTE, {**payload, "result": value}, keep)
        if not isinstance(value, ToolResult):
            raise TypeError("tools/post-execute must return a ToolResult")
    # What middleware made of the result is checked like a handler's value.
    checked, invalid = checked_result(value)
    if invalid is not None:
        return checked, invalid
    error_name = failed[-1] if failed and value.error == "TOOL_ERROR" else None
    return checked, error_name


async def call_handler(
    tool: Tool, arguments: Mapping[str, Any], context: ToolContext
) -> tuple[ToolResult | str, str | None]:
    """Run a handler with no middleware around it; a raising tool is a result.

    A plain string comes back as is: the commit builds the result without a ``ToolResult``.
    """
    try:
        value = await tool.handler(arguments, context)
    except Exception as exc:  # a raising tool is a result the model reads
        return raised(exc)
    return checked_result(value)


def raised(exc: Exception) -> tuple[ToolResult, str]:
    """The ``TOOL_ERROR`` result of a handler that raised, and the exception's name."""
    return (
        ToolResult(f"Error: {exception_text(exc)}", error="TOOL_ERROR"),
        escape_surrogates(type(exc).__name__),
    )
