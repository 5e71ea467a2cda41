"""Tool pipeline vocabulary (``_tools/pipeline.py``): ``Deny`` and the standard error results."""

from __future__ import annotations

import attrs
import pytest

from dsh_agent_loop import ToolResult
from dsh_agent_loop._tools.pipeline import (
    ABORTED_BEFORE_DISPATCH_TEXT,
    ABORTED_TEXT,
    Deny,
    error_result,
)


def test_deny_has_a_default_reason_and_takes_its_own():
    assert Deny().reason == "denied by policy"
    assert Deny("no writes").reason == "no writes"
    assert Deny("x") == Deny("x")
    assert Deny("x") != Deny("y")


def test_deny_is_frozen_and_final():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Deny().reason = "other"  # type: ignore[misc]
    assert getattr(Deny, "__final__", False) is True


def test_error_result_is_text_with_an_error_code():
    result = error_result("DENIED", "Error: no")
    assert result == ToolResult(content="Error: no", error="DENIED")
    assert result.concludes_turn is False
    assert result.additional_contexts == ()


def test_abort_texts_read_as_errors_and_differ():
    assert ABORTED_TEXT.startswith("Error: ")
    assert ABORTED_BEFORE_DISPATCH_TEXT.startswith(ABORTED_TEXT)
    assert ABORTED_BEFORE_DISPATCH_TEXT != ABORTED_TEXT
