"""``RequestSeries`` (docs/design.md#request-series) on a bare session: what it appends, and when it
skips work."""

from __future__ import annotations

from typing import Any

from dsh_agent_loop import FrozenDict
from dsh_agent_loop._agent.prompt import system_message
from dsh_agent_loop._agent.series import RequestSeries
from dsh_agent_loop._session.log import Session
from dsh_agent_loop.llm._base import PreparedCall

CONFIG = FrozenDict(provider="p", model="m")
SCHEMAS = (FrozenDict(name="t", description="", parameters=FrozenDict()),)


def _stream(request: Any) -> Any:
    raise AssertionError("not streamed here")


def _session() -> Session:
    return Session({"session_id": "s"}, clock=lambda: 0.0)


def _prepared(update: Any = "in-history") -> PreparedCall:
    return PreparedCall(CONFIG, _stream, system_prompt_update=update)


def _request(
    series: RequestSeries, prepared: PreparedCall, rendered: str, asked: bool = False
) -> bool:
    new = series.starts(asked, SCHEMAS)
    in_history = prepared.system_prompt_update == "in-history"
    series.reconcile_prompt(1, 1, rendered, in_history, new)
    series.write_records(CONFIG, prepared, SCHEMAS, new)
    return new


def _types(session: Session, since: int = 0) -> list[str]:
    return [e.type for e in session.events[since:]]


def test_first_request_writes_prompt_header_and_context() -> None:
    session = _session()
    series = RequestSeries(session)
    assert series.first_request
    assert not _request(series, _prepared(), "be brief")
    assert _types(session) == ["system/message", "request/header", "request/context"]
    assert session.events[1].data["reason"] == "initial"
    assert not series.first_request


def test_an_unchanged_request_appends_nothing() -> None:
    session = _session()
    series = RequestSeries(session)
    prepared = _prepared()
    _request(series, prepared, "be brief")
    size = len(session)
    _request(series, prepared, "be brief")
    _request(series, prepared, "".join(["be ", "brief"]))  # equal text, another object
    assert len(session) == size


def test_a_system_node_appended_by_someone_else_is_seen() -> None:
    session = _session()
    series = RequestSeries(session)
    prepared = _prepared()
    _request(series, prepared, "be brief")
    data = FrozenDict(turn=1, step=1, message=system_message("be verbose"))
    session.add("system/message", data)
    size = len(session)
    _request(series, prepared, "be brief")  # the node count moved: reconcile again
    assert _types(session, size) == ["system/message"]
    assert session.surface.node_texts()[-1][1] == "be brief"


def test_a_replacement_starts_a_new_series_and_consolidates() -> None:
    session = _session()
    series = RequestSeries(session)
    prepared = _prepared()
    _request(series, prepared, "one")
    _request(series, prepared, "two")  # in-history: appended as node 1
    assert [t for _, t in session.surface.node_texts()] == ["one", "two"]
    summary = session.events[-1].seq
    op = FrozenDict(op="replace", start_seq=summary, end_seq=summary)
    session.add("system/message", FrozenDict(message=system_message("")), surface_op=op)
    assert series.starts(False, SCHEMAS)  # the generation moved since the last request
    size = len(session)
    assert _request(series, prepared, "two")
    assert session.events[size].data["message"]["content"][0]["text"] == "two"  # head replaced
    assert session.event(size + 1).data["reason"] == "series"
    assert not series.starts(False, SCHEMAS)  # its own replacement does not start another


def test_changed_tool_schemas_start_a_series() -> None:
    session = _session()
    series = RequestSeries(session)
    _request(series, _prepared(), "p")
    assert not series.starts(False, SCHEMAS)
    assert series.starts(False, ())
    assert series.starts(True, SCHEMAS)
