"""``load_tool_ref``: the tools a ``package.module:attr`` reference names.

A reference is how a config file (``tools: ["myapp.tools:search"]``) or the command line
(``--tool myapp.tools:search``) points at tools written in Python. The attribute may be a
``Tool`` (what ``@tool`` makes of a function) or a sequence of them; anything else is refused
here, when the reference is read, so a typo fails before any agent starts.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Final, final

from .base import Tool

__all__ = ["ToolRefError", "is_tool_ref", "load_tool_ref"]

_MODULE: Final = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@final
class ToolRefError(ValueError):
    """A tool reference that cannot be loaded; the message names it and says why.

    Why: a malformed reference, an import failure, a missing attribute, or a value that is not
    a tool.
    """


def is_tool_ref(text: str) -> bool:
    """Whether ``text`` is a ``module:attr`` reference rather than a tool name."""
    return ":" in text


def _import(ref: str, module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolRefError(f"tool reference {ref!r}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed while importing
        raise ToolRefError(
            f"tool reference {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def load_tool_ref(ref: str) -> tuple[Tool, ...]:
    """Import ``package.module:attr`` and return the tools it names.

    ``attr`` may be dotted (``module:Class.tools``). Its value must be a ``Tool`` (a function
    decorated with ``@tool`` is one) or a non-empty list or tuple of them.

    Args:
        ref: The reference, ``package.module:attr``.

    Returns:
        The tools, in the order the attribute lists them (one for a single tool).

    Raises:
        ToolRefError: (a ``ValueError``) the reference is malformed, the module cannot be
            imported (or raised while importing), the attribute is missing, or its value is
            not a tool or a sequence of tools.
    """
    module_name, sep, attr = ref.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not sep or not _MODULE.fullmatch(module_name) or not attr:
        raise ToolRefError(f"tool reference {ref!r}: expected 'package.module:attribute'")
    value = _import(ref, module_name)
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ToolRefError(
                f"tool reference {ref!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if isinstance(value, Tool):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and value:
        tools = tuple(value)
        wrong = [i for i, t in enumerate(tools) if not isinstance(t, Tool)]
        if not wrong:
            return tools
        bad = tools[wrong[0]]
        raise ToolRefError(
            f"tool reference {ref!r}: item {wrong[0]} is {type(bad).__name__}, not a Tool "
            "(decorate the function with @tool)"
        )
    is_list = isinstance(value, list | tuple)
    what = "an empty sequence" if is_list else f"of type {type(value).__name__}"
    raise ToolRefError(
        f"tool reference {ref!r}: {attr!r} is {what}, not a Tool or a sequence of tools "
        "(decorate the function with @tool)"
    )
