"""Tool pipeline vocabulary: policy decisions and the standard error results.

See docs/design.md#tools.
"""

from __future__ import annotations

from typing import Final, final

import attrs

from .base import ToolResult

__all__ = ["ABORTED_BEFORE_DISPATCH_TEXT", "Deny", "error_result"]

ABORTED_BEFORE_DISPATCH_TEXT: Final = "Error: tool call aborted before dispatch"
ABORTED_TEXT: Final = "Error: tool call aborted"


@final
@attrs.frozen
class Deny:
    """Returned by a ``tools/pre-execute`` listener to refuse a call (result code ``DENIED``)."""

    reason: str = "denied by policy"


def error_result(code: str, text: str) -> ToolResult:
    """An error result the model reads: ``text`` with error ``code``."""
    return ToolResult(content=text, error=code)
