"""Fault corpus: hostile tool results and handlers (docs/design.md#results-order).

The victim's model calls one hostile tool, then answers. Whatever the tool does, its call ends
with a ``tool/result`` (``TOOL_ERROR`` where the contract says so, or a clean result where it
allows one), the victim's turn ends, the bystander's tool turn completes, the runtime exits
normally and every stored log is well formed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import Reply, ToolResult, tool

from ._kit import (
    LIMIT,
    answer_text,
    check_stored,
    is_strict_json,
    make_store,
    open_pair,
    plain,
    results,
    scripted_victim,
    turn_ends,
)

AFTER = "after the tool"


def calls(name: str) -> Any:
    return scripted_victim(Reply.tool_calls((name, {})), Reply.text(AFTER))


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class _Weird:
    def __repr__(self) -> str:
        return "<weird>"


def _result_tool(name: str, make: Any) -> Any:
    async def handler() -> Any:
        return make()

    handler.__name__ = name
    handler.__doc__ = f"The {name} tool."
    return tool(handler)


# name -> (what the handler returns, allowed error codes; None = a clean result is allowed)
HOSTILE_RESULTS: dict[str, tuple[Any, tuple[str | None, ...]]] = {
    "bytes_content": (lambda: ToolResult(content=b"raw bytes"), ("TOOL_ERROR",)),  # type: ignore[arg-type]
    "none_content": (lambda: ToolResult(content=None), ("TOOL_ERROR",)),  # type: ignore[arg-type]
    "int_content": (lambda: ToolResult(content=42), ("TOOL_ERROR",)),  # type: ignore[arg-type]
    "set_meta": (lambda: ToolResult(content="ok", meta={"s": {1, 2}}), ("TOOL_ERROR",)),
    "object_meta": (lambda: ToolResult(content="ok", meta={"o": object()}), ("TOOL_ERROR",)),
    "nan_meta": (lambda: ToolResult(content="ok", meta={"x": float("nan")}), ("TOOL_ERROR",)),
    "non_mapping_meta": (lambda: ToolResult(content="ok", meta=[1, 2]), ("TOOL_ERROR",)),  # type: ignore[arg-type]
    "returns_object": (_Weird, ("TOOL_ERROR",)),
    "returns_bytes": (lambda: b"bytes", ("TOOL_ERROR",)),
    # @tool documents that a plain non-string return is sent as JSON; unencodable is TOOL_ERROR.
    "returns_int": (lambda: 7, (None, "TOOL_ERROR")),
    "returns_set": (lambda: {1, 2}, ("TOOL_ERROR",)),
    "returns_nan": (lambda: float("nan"), ("TOOL_ERROR",)),
    "huge_content": (lambda: "x" * 3_000_000, (None, "TOOL_ERROR")),
}


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
@pytest.mark.parametrize("case", sorted(HOSTILE_RESULTS))
async def test_hostile_tool_result(case: str, store_kind: str, tmp_path: Path) -> None:
    make, allowed = HOSTILE_RESULTS[case]
    hostile = _result_tool(case, make)
    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(calls(case), store=store, tools=[hostile]) as pair:
            await pair.run_both()
    victim, _ = await check_stored(store, store_kind, tmp_path)
    (result,) = results(victim)
    code = _code(result)
    assert code in allowed, result
    if code is None:
        assert result.get("meta") is None or is_strict_json(result["meta"])
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == AFTER


def _code(result: dict[str, Any]) -> str | None:
    error = result.get("error")
    if error is None:
        return None
    return str(error["code"])


LONE = "bad \ud800 text \udfff end"


@pytest.mark.parametrize("where", ["content", "meta"])
@pytest.mark.parametrize("store_kind", ["memory", "sqlite", "jsonl"])
async def test_lone_surrogate_result(where: str, store_kind: str, tmp_path: Path) -> None:
    """Text with lone surrogates: TOOL_ERROR, or stored with the offending characters escaped."""

    @tool
    async def surrogate() -> ToolResult:
        """Return text with lone surrogates."""
        if where == "content":
            return ToolResult(content=LONE)
        return ToolResult(content="ok", meta={"note": LONE})

    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(calls("surrogate"), store=store, tools=[surrogate]) as pair:
            await pair.run_both()
    victim, _ = await check_stored(store, store_kind, tmp_path)
    (result,) = results(victim)
    code = _code(result)
    assert code in (None, "TOOL_ERROR"), result
    # Whatever was stored is encodable text: no lone surrogate survives in the log.
    json.dumps(plain(result), ensure_ascii=False).encode("utf-8")
    if code is None:
        shown = json.dumps(plain(result), ensure_ascii=False)
        assert "bad " in shown
        assert " end" in shown
    assert turn_ends(victim) == [{"kind": "completed"}]


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        (ValueError("the value was wrong"), "the value was wrong"),
        (_Unprintable(), None),
        (KeyError("missing"), "missing"),
    ],
    ids=["value_error", "unprintable_str", "key_error"],
)
async def test_raising_handler(
    exc: BaseException, needle: str | None, autojump_clock: trio.testing.MockClock
) -> None:
    @tool
    async def boom() -> str:
        """Raise."""
        raise exc

    store = make_store("memory", Path())
    with trio.fail_after(LIMIT):
        async with open_pair(calls("boom"), store=store, tools=[boom]) as pair:
            await pair.run_both()
    victim, _ = await check_stored(store, "memory", Path())
    (result,) = results(victim)
    assert _code(result) == "TOOL_ERROR", result
    content = json.dumps(plain(result["message"]["content"]))
    if needle is not None:
        assert needle in content
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == AFTER


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_tool_disposes_own_agent(store_kind: str, tmp_path: Path) -> None:
    """A tool awaiting its own agent's disposal completes without deadlock."""
    handles: dict[str, Any] = {}
    disposed = trio.Event()

    @tool
    async def self_destruct() -> str:
        """Dispose the calling agent."""
        try:
            await handles["victim"].dispose()
        finally:
            disposed.set()
        return "disposed myself"

    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(calls("self_destruct"), store=store, tools=[self_destruct]) as pair:
            handles["victim"] = pair.victim
            pair.bystander.agent.followup("go")
            pair.victim.agent.followup("go")
            await disposed.wait()
            await pair.victim.dispose()  # idempotent: returns once the teardown is done
            await pair.bystander.agent.wait_idle()
            assert pair.rt.agents.get("victim") is None
            assert pair.rt.agents.get("bystander") is not None
    victim, _ = await check_stored(store, store_kind, tmp_path)
    ends = turn_ends(victim)
    assert len(ends) == 1
    assert ends[0]["kind"] == "aborted", ends
    assert ends[0]["cause"] == "disposed", ends
    (result,) = results(victim)
    assert _code(result) in (None, "ABORTED"), result


async def test_tool_cancels_own_agent(autojump_clock: trio.testing.MockClock) -> None:
    handles: dict[str, Any] = {}

    @tool
    async def self_cancel() -> str:
        """Cancel the calling agent's turn."""
        handles["victim"].agent.cancel()
        await trio.sleep(1)
        return "still here"

    store = make_store("memory", Path())
    with trio.fail_after(LIMIT):
        async with open_pair(calls("self_cancel"), store=store, tools=[self_cancel]) as pair:
            handles["victim"] = pair.victim
            await pair.run_both()
            # The victim is still alive and usable after cancelling itself.
            assert pair.rt.agents.get("victim") is pair.victim.agent
    victim, _ = await check_stored(store, "memory", Path())
    assert turn_ends(victim)[0] == {"kind": "aborted", "cause": "user"}
    (result,) = results(victim)
    assert _code(result) == "ABORTED", result
