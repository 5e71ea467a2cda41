"""The web page in a real browser: Debian's Chromium, driven by Playwright, on a real server.

Every test talks to a real ``dsh-agent serve`` and ``dsh-agent worker`` pair (``conftest.py``) on
a SQLite file through the page alone, the way a person would: search, open, approve, deny, send,
cancel, create, give the token. What the page shows is compared with what the API says, and
live changes must appear without a reload (a marker set on ``window`` survives). Waits are
Playwright's bounded polls for a condition. The tests are plain functions: Playwright's sync API
runs its own event loop. ``DSH_UI_SCREENSHOTS=1`` writes the screenshots to ``docs/img`` (for
docs/ui.md); otherwise they go to the test's temporary folder.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentOptions, CompactionPolicy, Reply, ScriptedModel, open_runtime
from dsh_agent_loop.stores import store_from_url

from ..browser import chromium, require_browser
from .conftest import Served, StartServed

require_browser()  # skip the module, or fail it in CI, without Playwright and Chromium
playwright = importlib.import_module("playwright.sync_api")
Browser = playwright.Browser
Page = playwright.Page
expect = playwright.expect

ROOT = Path(__file__).resolve().parents[2]
#: Milliseconds any one expectation may wait (a worker activates, runs a turn, commits).
WAIT = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context's page; the test fails if the page's script threw."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(WAIT)
    thrown: list[str] = []
    opened.on("pageerror", lambda error: thrown.append(str(error)))
    yield opened
    context.close()
    assert thrown == [], thrown


def shot(page: Any, name: str, tmp_path: Path, *, full_page: bool = True) -> None:
    """Save a screenshot ``ui-<name>.png`` (into docs/img when DSH_UI_SCREENSHOTS=1)."""
    folder = ROOT / "docs" / "img" if os.environ.get("DSH_UI_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    assert path.read_bytes().startswith(b"\x89PNG")


def mark(page: Any) -> None:
    """Set a marker that a reload would lose."""
    page.evaluate("window.__notReloaded = true")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded"


def open_session(page: Any, served: Served, sid: str) -> None:
    """Open the session's view by its link (``#/s/<id>``)."""
    page.goto(f"{served.url}/#/s/{sid}")
    expect(page.get_by_test_id("head-id")).to_have_text(sid)


def status_of(page: Any) -> Any:
    return page.get_by_test_id("head-status")


def assistant_says(page: Any, text: str) -> Any:
    return page.get_by_test_id("assistant-text").filter(has_text=text)


def wait_pending(page: Any) -> Any:
    item = page.get_by_test_id("pending-item")
    expect(item).to_have_count(1, timeout=WAIT)
    expect(status_of(page)).to_have_attribute("data-status", "awaiting-approval", timeout=WAIT)
    return item


def row_of(page: Any, sid: str) -> Any:
    return page.locator(f'tr[data-session-id="{sid}"]')


def test_the_list_shows_each_status_live_and_filters(
    shared_served: Served, page: Any, tmp_path: Path
) -> None:
    talker = shared_served.create("talker", "hi")
    guarded = shared_served.create("guarded", "Write out.txt.")
    slow = shared_served.create("slow", "Tell me a long story.")
    try:
        done = shared_served.wait_status(talker, "idle")
        shared_served.wait_status(guarded, "awaiting-approval")
        shared_served.wait_status(slow, "running")

        page.goto(f"{shared_served.url}/")
        mark(page)
        rows = page.get_by_test_id("session-row")
        expect(rows).to_have_count(3)
        shown = rows.evaluate_all("rows => rows.map((row) => row.dataset.sessionId)")
        with shared_served.client() as http:
            listed = [row["id"] for row in http.get("/api/sessions").json()["sessions"]]
        # Newest first, as the API orders them: by the time each worker created its session,
        # which for sessions queued together need not be the order they were queued in.
        assert shown == listed
        assert sorted(shown) == sorted([slow, guarded, talker])
        expect(row_of(page, talker).get_by_test_id("row-agent")).to_have_text("talker")
        expect(row_of(page, talker).get_by_test_id("row-turns")).to_have_text("1")
        expect(row_of(page, talker).get_by_test_id("row-tokens")).to_have_text(
            f"{done['tokens']['total']:,}"
        )
        for sid, status in ((slow, "running"), (guarded, "awaiting-approval"), (talker, "idle")):
            expect(row_of(page, sid).get_by_test_id("status-badge")).to_have_text(status)
        shot(page, "list", tmp_path)

        page.get_by_test_id("status-filter").select_option("awaiting-approval")
        expect(rows).to_have_count(1)
        expect(rows).to_have_attribute("data-session-id", guarded)
        page.get_by_test_id("status-filter").select_option("")
        page.get_by_test_id("agent-filter").select_option("slow")
        expect(rows).to_have_count(1)
        expect(rows).to_have_attribute("data-session-id", slow)
        page.get_by_test_id("agent-filter").select_option("")
        expect(rows).to_have_count(3)
    finally:
        with shared_served.client() as http:
            call = shared_served.summary(guarded)["pending"][0]["call_id"]
            http.post(f"/api/sessions/{guarded}/approvals/{call}", json={"decision": "approve"})
            http.post(f"/api/sessions/{slow}/cancel", json={})
    # Decided behind the page's back: the rows change on their own.
    expect(row_of(page, guarded).get_by_test_id("status-badge")).to_have_text("idle")
    expect(row_of(page, slow).get_by_test_id("status-badge")).to_have_text("idle")
    assert_not_reloaded(page)


def test_find_a_session_by_search_and_see_its_tool_call(
    shared_served: Served, page: Any, tmp_path: Path
) -> None:
    sid = shared_served.create("helper", "What is in this folder?")
    summary = shared_served.wait_status(sid, "idle")

    page.goto(f"{shared_served.url}/")
    rows = page.get_by_test_id("session-row")
    expect(row_of(page, sid)).to_have_count(1)
    expect(row_of(page, sid).get_by_test_id("row-agent")).to_have_text("helper")

    page.get_by_test_id("search").fill(sid)
    expect(rows).to_have_count(1)
    expect(rows).to_have_attribute("data-session-id", sid)
    page.get_by_test_id("search").fill(f"{sid}-no-such")
    expect(page.get_by_test_id("list-empty")).to_be_visible()
    expect(rows).to_have_count(0)
    page.get_by_test_id("search").fill(sid.upper())  # case-insensitive
    expect(rows).to_have_count(1)
    rows.get_by_test_id("session-link").click()

    expect(page).to_have_url(re.compile(rf"#/s/{re.escape(sid)}$"))
    expect(page.get_by_test_id("head-id")).to_have_text(sid)
    expect(page.get_by_test_id("head-agent")).to_have_text("helper")
    call = page.get_by_test_id("tool-call")
    expect(call).to_have_count(1)
    expect(call).to_have_attribute("data-tool-name", "list_dir")
    expect(call.get_by_test_id("tool-name")).to_have_text("list_dir")
    expect(call.get_by_test_id("tool-args")).to_have_text('{\n  "path": "."\n}')
    # list_dir ran in the worker's folder, which holds the config.
    expect(call.get_by_test_id("tool-result-text")).to_contain_text("serve.yaml")
    expect(call.get_by_test_id("tool-error-code")).to_have_count(0)

    reasoning = page.get_by_test_id("reasoning")
    expect(reasoning).to_have_count(1)
    expect(reasoning).not_to_have_attribute("open", "")
    expect(reasoning.locator("pre")).to_be_hidden()
    reasoning.locator("summary").click()
    expect(reasoning.locator("pre")).to_have_text("I should look at the folder first.")

    expect(assistant_says(page, "Let me look.")).to_have_count(1)
    expect(assistant_says(page, "done looking")).to_have_count(1)
    expect(page.get_by_test_id("step")).to_have_count(2)
    expect(page.get_by_test_id("turn-end")).to_have_attribute("data-reason", "completed")
    expect(page.get_by_test_id("token-bar")).to_have_count(2)  # one model call per step
    total = summary["tokens"]["total"]
    expect(page.get_by_test_id("token-totals")).to_contain_text(f"{total:,} tokens")
    shot(page, "session", tmp_path)


def test_approve_a_waiting_call_and_watch_the_turn_complete(
    shared_served: Served, page: Any, tmp_path: Path
) -> None:
    sid = shared_served.create("guarded", "Write out.txt, please.")
    open_session(page, shared_served, sid)
    mark(page)
    item = wait_pending(page)
    expect(item.get_by_test_id("pending-name")).to_have_text("write_file")
    expect(item.get_by_test_id("pending-args")).to_contain_text('"path": "out.txt"')
    card = page.get_by_test_id("tool-call")
    expect(card.get_by_test_id("approval-requested")).to_have_count(1)
    expect(page.get_by_test_id("turn-end")).to_have_attribute("data-reason", "awaiting-approval")
    shot(page, "pending", tmp_path)

    item.get_by_test_id("approve").click()

    expect(assistant_says(page, "finished")).to_have_count(1, timeout=WAIT)
    expect(status_of(page)).to_have_attribute("data-status", "idle", timeout=WAIT)
    expect(page.get_by_test_id("pending")).to_be_hidden()
    decision = page.get_by_test_id("approval-decision")
    expect(decision).to_have_attribute("data-decision", "approve")
    result = page.get_by_test_id("tool-result")
    expect(result).to_have_count(1)
    expect(result).to_contain_text("write_file")
    expect(result.get_by_test_id("tool-error-code")).to_have_count(0)
    expect(page.get_by_test_id("turn-end").last).to_have_attribute("data-reason", "completed")
    assert_not_reloaded(page)
    assert (shared_served.cwd / "out.txt").read_text() == "hi"
    shot(page, "approved", tmp_path)


def test_deny_a_waiting_call_with_a_reason(shared_served: Served, page: Any) -> None:
    sid = shared_served.create("guarded", "Write it again.")
    open_session(page, shared_served, sid)
    mark(page)
    item = wait_pending(page)
    expect(item.get_by_test_id("deny-form")).to_be_hidden()

    item.get_by_test_id("deny").click()
    item.get_by_test_id("deny-message").fill("not today")
    item.get_by_test_id("deny-confirm").click()

    code = page.get_by_test_id("tool-error-code")
    expect(code).to_have_text("DENIED", timeout=WAIT)
    expect(page.get_by_test_id("tool-result-text")).to_contain_text("not today")
    decision = page.get_by_test_id("approval-decision")
    expect(decision).to_have_attribute("data-decision", "deny")
    expect(decision).to_contain_text("not today")
    expect(assistant_says(page, "finished")).to_have_count(1, timeout=WAIT)
    expect(status_of(page)).to_have_attribute("data-status", "idle", timeout=WAIT)
    assert_not_reloaded(page)
    with shared_served.client() as http:
        events = http.get(f"/api/sessions/{sid}/events").json()["events"]
    approvals = [e["data"] for e in events if e["type"] == "tool/approval"]
    assert [(a["decision"], a.get("message")) for a in approvals] == [("deny", "not today")]


def test_send_a_message_and_watch_the_answer_arrive(shared_served: Served, page: Any) -> None:
    sid = shared_served.create("talker", "hi")
    open_session(page, shared_served, sid)
    expect(assistant_says(page, "hello from talker")).to_have_count(1, timeout=WAIT)
    expect(status_of(page)).to_have_attribute("data-status", "idle", timeout=WAIT)
    mark(page)

    markup = '<b>bold</b> <img src="x" data-probe="1">'
    page.get_by_test_id("send-text").fill(f"again {markup}")
    page.get_by_test_id("send-kind").select_option("followup")
    page.get_by_test_id("send-submit").click()

    expect(page.get_by_test_id("send-note")).to_contain_text("Sent followup")
    expect(page.get_by_test_id("send-text")).to_have_value("")
    said = page.get_by_test_id("user-message").filter(has_text="again")
    expect(said).to_contain_text(markup)  # shown as text, never parsed as markup
    expect(page.locator("#log img, #log b")).to_have_count(0)
    expect(assistant_says(page, "hello from talker")).to_have_count(2, timeout=WAIT)
    expect(page.get_by_test_id("turn")).to_have_count(2)
    expect(page.get_by_test_id("turn-end")).to_have_count(2)
    assert_not_reloaded(page)
    assert shared_served.wait_status(sid, "idle")["turns"] == 2


def test_cancel_a_running_turn(shared_served: Served, page: Any) -> None:
    sid = shared_served.create("slow", "Tell me a long story.")
    open_session(page, shared_served, sid)
    expect(status_of(page)).to_have_attribute("data-status", "running", timeout=WAIT)
    page.get_by_test_id("send-text").fill("faster, please")
    page.get_by_test_id("send-kind").select_option("steer")
    page.get_by_test_id("send-submit").click()
    expect(page.get_by_test_id("send-note")).to_contain_text("Sent steer")

    def steered() -> bool:
        with shared_served.client() as http:
            events = http.get(f"/api/sessions/{sid}/events").json()["events"]
        return any(
            e["type"] == "agent/inbox/spliced"
            and e["data"]["target"] == "next-step"
            and "faster, please" in json.dumps(e["data"]["inserted"])
            for e in events
        )

    shared_served.wait_for(steered, "the steer message in the running turn's inbox")
    page.get_by_test_id("cancel-button").click()

    end = page.get_by_test_id("turn-end")
    expect(end).to_have_attribute("data-reason", "aborted", timeout=WAIT)
    expect(end).to_contain_text("aborted (user)")
    expect(status_of(page)).to_have_attribute("data-status", "idle", timeout=WAIT)


def test_create_a_session_and_see_errors_inline(shared_served: Served, page: Any) -> None:
    sid = f"page-made-{secrets.token_hex(3)}"
    page.goto(f"{shared_served.url}/")
    page.get_by_text("New session").click()
    page.get_by_test_id("new-agent").select_option("talker")
    page.get_by_test_id("new-id").fill(sid)
    page.get_by_test_id("new-prompt").fill("hello there")
    page.get_by_test_id("new-submit").click()

    expect(page).to_have_url(re.compile(rf"#/s/{sid}$"))
    expect(page.get_by_test_id("user-message")).to_contain_text("hello there", timeout=WAIT)
    expect(assistant_says(page, "hello from talker")).to_have_count(1, timeout=WAIT)
    expect(page.get_by_test_id("head-agent")).to_have_text("talker")

    page.get_by_test_id("back-link").click()
    page.get_by_text("New session").click()
    page.get_by_test_id("new-id").fill(sid)
    page.get_by_test_id("new-submit").click()
    error = page.get_by_test_id("new-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("SESSION_ALREADY_EXISTS")
    expect(page).not_to_have_url(re.compile("#/s/"))


def make_related(store_url: str, source: str) -> tuple[str, str]:
    """In a runtime of its own on the store: a parent session, and a fork of ``source`` that is
    the parent's child. Returns ``(parent id, fork id)``."""

    async def main() -> tuple[str, str]:
        model = ScriptedModel([Reply.text("parent here")], loop=True)
        async with (
            store_from_url(store_url) as store,
            open_runtime(store=store, providers={"scripted": model}) as rt,
        ):
            parent = await rt.agents.create(
                options=AgentOptions(id="planner", provider="scripted", model="m")
            )
            await parent.agent.run("plan")
            fork = await rt.agents.fork(
                source, options=AgentOptions(id="alt"), parent_agent=parent.agent
            )
            await fork.agent.flush()
            ids = (parent.session_id, fork.session_id)
            await fork.dispose()
            await parent.dispose()
            return ids

    return trio.run(main)


def test_parent_fork_and_children_are_linked(shared_served: Served, page: Any) -> None:
    source = shared_served.create("talker", "hi")
    shared_served.wait_status(source, "idle")
    parent, fork = make_related(shared_served.store_url, source)

    open_session(page, shared_served, fork)
    expect(page.get_by_test_id("head-parent")).to_have_text(parent)
    expect(page.get_by_test_id("head-forked-from")).to_have_text(source)
    expect(page.get_by_test_id("tree-self")).to_contain_text(fork)
    expect(page.get_by_test_id("fork-point")).to_have_count(1)  # the inherited log ends there
    expect(assistant_says(page, "hello from talker")).to_have_count(1)  # inherited from source

    page.get_by_test_id("tree-parent").get_by_role("link", name=parent).click()
    expect(page.get_by_test_id("head-id")).to_have_text(parent)
    child = page.get_by_test_id("tree-child")
    expect(child).to_have_count(1)
    expect(child).to_have_attribute("data-relation", "subagent")
    expect(assistant_says(page, "parent here")).to_have_count(1)

    child.get_by_role("link", name=fork).click()
    expect(page.get_by_test_id("head-id")).to_have_text(fork)
    page.get_by_test_id("head-forked-from").click()
    expect(page.get_by_test_id("head-id")).to_have_text(source)
    forked = page.get_by_test_id("tree-child")
    expect(forked).to_have_attribute("data-relation", "fork")
    expect(forked.get_by_role("link", name=fork)).to_have_count(1)


def make_compacted(store_url: str) -> str:
    """In a runtime of its own on the store: a session whose first turn fails (HTTP_4XX) and
    whose later turns get compacted. Returns its id."""

    async def summarise(messages: Any, instructions: Any) -> str:
        return f"SUMMARY of {len(messages)} messages"

    async def main() -> str:
        replies = [Reply.error("HTTP_4XX", "model not found", status=404)]
        replies += [Reply.text("An answer. " * 40)] * 12
        model = ScriptedModel(replies, context_window=2_000)
        policy = CompactionPolicy(trigger_ratio=0.6, keep_recent_turns=2, summarizer=summarise)
        async with (
            store_from_url(store_url) as store,
            open_runtime(store=store, providers={"scripted": model}, compaction=policy) as rt,
        ):
            handle = await rt.agents.create(
                options=AgentOptions(id="long", provider="scripted", model="m")
            )
            handle.agent.followup("first")
            await handle.agent.wait_idle()
            for n in range(12):
                await handle.agent.run(f"Question {n}: " + "details " * 30)
            await handle.dispose()
            return handle.session_id

    return trio.run(main)


def test_failures_compactions_and_replacements_are_marked(
    shared_served: Served, page: Any, tmp_path: Path
) -> None:
    sid = make_compacted(shared_served.store_url)
    with shared_served.client() as http:
        events = http.get(f"/api/sessions/{sid}/events", params={"limit": 10000}).json()["events"]
    compactions = [e for e in events if e["type"] == "context/compaction"]
    replaced = [e for e in events if (e.get("surface_op") or {}).get("op") == "replace"]
    calls = [e for e in events if e["type"] == "assistant/message" and "usage" in e["data"]]
    assert compactions, "the scenario compacted nothing"
    assert replaced, "the scenario replaced nothing"

    open_session(page, shared_served, sid)
    failed = page.get_by_test_id("attempt-failure")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("HTTP_4XX")
    first_end = page.get_by_test_id("turn-end").first
    expect(first_end).to_have_attribute("data-reason", "error")
    expect(first_end).to_contain_text("model not found")
    expect(page.get_by_test_id("turn-end")).to_have_count(13)
    marks = page.get_by_test_id("compaction")
    expect(marks).to_have_count(len(compactions))
    expect(marks.first).to_contain_text("Context compacted")
    expect(marks.first).to_have_attribute("data-seq", str(compactions[0]["seq"]))
    replacement = page.get_by_test_id("replacement")
    expect(replacement).to_have_count(len(replaced))
    op = replaced[0]["surface_op"]
    expect(replacement.first).to_contain_text(f"replaces events {op['start_seq']}–{op['end_seq']}")
    said = [
        e["seq"]
        for e in events
        if e["type"] == "user/message" and not e["data"]["message"].get("source")
    ]
    inside = [seq for seq in said if op["start_seq"] <= seq <= op["end_seq"]]
    assert inside, "the replaced range holds no user message"
    dimmed = re.compile(r"\breplaced\b")
    expect(page.locator(f'[data-testid="user-message"][data-seq="{inside[0]}"]')).to_have_class(
        dimmed
    )
    expect(page.locator(f'[data-testid="user-message"][data-seq="{said[-1]}"]')).not_to_have_class(
        dimmed
    )
    summary = page.get_by_test_id("user-compaction").first
    summary.locator("summary").click()
    expect(summary.locator("pre")).to_contain_text("SUMMARY of")
    expect(page.get_by_test_id("token-bar")).to_have_count(len(calls))
    replacement.first.scroll_into_view_if_needed()
    shot(page, "compaction", tmp_path, full_page=False)


def test_token_prompt_when_the_server_has_a_token(
    serve_factory: StartServed, page: Any, tmp_path: Path
) -> None:
    token = secrets.token_urlsafe(24)
    served = serve_factory("sqlite", token=token)
    sid = served.create("talker", "hi")

    page.goto(f"{served.url}/#/s/{sid}")
    expect(page.get_by_test_id("token-view")).to_be_visible()
    expect(page.get_by_test_id("session-view")).to_be_hidden()
    expect(page.get_by_test_id("list-view")).to_be_hidden()
    shot(page, "token", tmp_path)

    page.get_by_test_id("token-input").fill("not-the-token-at-all")
    page.get_by_test_id("token-submit").click()
    expect(page.get_by_test_id("token-error")).to_contain_text("refused")
    expect(page).to_have_url(re.compile(rf"^{re.escape(served.url)}/#/s/{sid}$"))

    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-submit").click()

    # The server set its cookie and redirected to / without the token; the hash survived.
    expect(page).to_have_url(f"{served.url}/#/s/{sid}")
    expect(page.get_by_test_id("token-view")).to_be_hidden()
    expect(page.get_by_test_id("session-view")).to_be_visible()
    expect(page.get_by_test_id("head-id")).to_have_text(sid)
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["dsh_token"]["httpOnly"] is True
    assert cookies["dsh_token"]["sameSite"] == "Strict"
    assert token not in page.url
    page.get_by_test_id("back-link").click()
    expect(page.locator(f'tr[data-session-id="{sid}"]')).to_have_count(1)
