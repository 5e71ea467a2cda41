"""An MCP ``CallToolResult`` as the ``ToolResult`` the model reads (sans-I/O).

The model reads text. Text blocks are joined with newlines; every other block (an image,
audio, an embedded resource, a resource link) becomes a one-line note in that text, and the
block itself goes to ``meta["mcp_content"]`` so the log keeps it. A result with no content
block but structured content is that JSON as text. ``isError`` makes the result a
``TOOL_ERROR`` carrying the server's text; a call that took too long is a ``TIMEOUT``.
"""

from __future__ import annotations

import json
from typing import Any

from .._tools.base import ToolResult

__all__ = ["error_text", "tool_result"]


def _note(block: Any) -> str:
    kind = getattr(block, "type", "content")
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {len(block.data)} base64 characters]"
    if kind == "resource":
        resource = block.resource
        return f"[resource {resource.uri} ({resource.mime_type or 'unknown type'})]"
    if kind == "resource_link":
        return f"[resource link {block.uri} ({block.name})]"
    return f"[{kind} content]"


def tool_result(result: Any) -> ToolResult:
    """The ``ToolResult`` for an MCP ``CallToolResult``."""
    texts: list[str] = []
    kept: list[Any] = []
    for block in result.content:
        if getattr(block, "type", None) == "text":
            texts.append(block.text)
        else:
            texts.append(_note(block))
            kept.append(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    if not result.content and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(texts)
    meta = {"mcp_content": kept} if kept else None
    if result.is_error:
        return ToolResult(text or "Error: the MCP tool failed", error="TOOL_ERROR", meta=meta)
    return ToolResult(text, meta=meta)


def error_text(server: str, problem: str, code: str = "TOOL_ERROR") -> ToolResult:
    """An error result (``TOOL_ERROR`` unless ``code`` says otherwise) about ``server``."""
    return ToolResult(f"Error: MCP server {server!r}: {problem}", error=code)
