"""Fault corpus: storage faults (docs/design.md#store-failures).

A store that fails for the victim's session only (through the public ``SessionStore`` protocol)
stops the victim: ``agent/error`` ``STORE_FAILED`` (``OWNERSHIP_LOST`` for a lost lease), the victim
is disposed, the bystander and the runtime go on. Stores at unusable locations, a corrupt JSONL
log and a session owned elsewhere raise ``StoreError`` subclasses with a code — never a bare
``OSError``/``sqlite3`` error and never an exception group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    JsonlStore,
    MemoryStore,
    Reply,
    SessionAlreadyOwnedError,
    SessionOwnershipLostError,
    SessionStore,
    SqliteStore,
    StoreError,
    open_runtime,
)

from ._kit import (
    BYSTANDER_SESSION,
    LIMIT,
    VICTIM,
    VICTIM_SESSION,
    answer_text,
    assert_bystander_ok,
    assert_well_formed,
    check_stored,
    make_store,
    note,
    open_pair,
    plain,
    scripted_victim,
    stored_log,
    turn_ends,
)


def victim_model() -> Any:
    return scripted_victim(Reply.tool_calls(("note", {"text": "v"})), Reply.text("victim done"))


# --- a store that fails for one session ---------------------------------------------------------


class _FaultyHandle:
    """Delegates to a real handle; raises on ``append``/``flush`` once armed."""

    def __init__(self, inner: Any, owner: FaultyStore) -> None:
        self._inner = inner
        self._owner = owner

    @property
    def session_id(self) -> str:
        return str(self._inner.session_id)

    @property
    def header(self) -> Mapping[str, Any]:
        return self._inner.header  # type: ignore[no-any-return]

    @property
    def lease_ttl(self) -> float | None:
        return self._inner.lease_ttl  # type: ignore[no-any-return]

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        return await self._inner.read(offset, length)  # type: ignore[no-any-return]

    async def append(self, events: Sequence[Event]) -> None:
        self._owner.maybe_fail("append")
        await self._inner.append(events)

    async def flush(self) -> None:
        self._owner.maybe_fail("flush")
        await self._inner.flush()

    async def renew(self) -> None:
        await self._inner.renew()

    async def close(self) -> None:
        await self._inner.close()

    async def abort(self) -> None:
        await self._inner.abort()


class FaultyStore:
    """A ``SessionStore`` whose handles of ``victim_session`` fail once ``armed``."""

    def __init__(
        self,
        inner: SessionStore,
        *,
        phase: str,
        error: Callable[[], BaseException],
        victim_session: str = VICTIM_SESSION,
    ) -> None:
        self.inner = inner
        self.phase = phase
        self.error = error
        self.victim_session = victim_session
        self.armed = False
        self.raised = 0

    def maybe_fail(self, phase: str) -> None:
        if self.armed and phase == self.phase:
            self.raised += 1
            raise self.error()

    def _wrap(self, handle: Any, session_id: str) -> Any:
        return _FaultyHandle(handle, self) if session_id == self.victim_session else handle

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> Any:
        handle = await self.inner.create(header, inherited_events=inherited_events)
        return self._wrap(handle, str(header["session_id"]))

    async def open(self, session_id: str, mode: str = "read") -> Any:
        handle = await self.inner.open(session_id, mode)  # type: ignore[call-overload]
        return self._wrap(handle, session_id) if mode == "write" else handle

    async def list(self) -> Any:
        return await self.inner.list()

    async def stat(self, session_id: str) -> Any:
        return await self.inner.stat(session_id)

    async def delete(self, session_id: str) -> None:
        await self.inner.delete(session_id)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def statistics(self) -> Any:
        return self.inner.statistics()


STORE_FAULTS: dict[str, tuple[Callable[[], BaseException], str]] = {
    "value_error": (lambda: ValueError("unexpected value in the writer"), "STORE_FAILED"),
    "os_error": (lambda: OSError(28, "No space left on device"), "STORE_FAILED"),
    "runtime_error": (lambda: RuntimeError("driver bug"), "STORE_FAILED"),
    "type_error": (lambda: TypeError("not JSON serializable"), "STORE_FAILED"),
    "store_error": (lambda: StoreError("disk full"), "STORE_FAILED"),
    "ownership_lost": (lambda: SessionOwnershipLostError("lease taken over"), "OWNERSHIP_LOST"),
}


@pytest.mark.parametrize("phase", ["append", "flush"])
@pytest.mark.parametrize("fault", sorted(STORE_FAULTS))
async def test_session_store_fault(fault: str, phase: str, tmp_path: Path) -> None:
    make_error, code = STORE_FAULTS[fault]
    kind = "sqlite" if phase == "flush" else "memory"
    inner = make_store(kind, tmp_path)
    store = FaultyStore(inner, phase=phase, error=make_error)
    model = scripted_victim(
        Reply.text("warm up"),
        Reply.tool_calls(("note", {"text": "v"})),
        Reply.text("victim done"),
    )
    with trio.fail_after(LIMIT):
        async with open_pair(model, store=store) as pair:  # type: ignore[arg-type]
            # A first turn is stored; the store fails mid-session, on the second.
            pair.victim.agent.followup("first")
            await pair.victim.agent.wait_idle()
            store.armed = True
            await pair.run_both()
            with trio.fail_after(LIMIT):
                while pair.rt.agents.get(VICTIM) is not None:
                    await trio.sleep(0.01)
            errors = pair.victim_errors()
            assert errors, "the victim reports its store failure"
            assert {e["error"]["code"] for e in errors} == {code}, errors
            assert pair.bystander_errors() == []
            assert store.raised >= 1
            # The runtime still takes new agents.
            extra = await pair.rt.agents.create(
                options=AgentOptions(id="late", provider="bystander", model="m")
            )
            await extra.dispose()
    # The victim's log may stop inside its turn (the store refused to write the closer).
    victim, _ = await check_stored(inner, kind, tmp_path, victim_open_turn=True)
    assert turn_ends(victim)[0] == {"kind": "completed"}
    later = turn_ends(victim)[1:]
    assert later == [] or [(e["kind"], e["error"]["code"]) for e in later] == [("error", code)]


# --- text the store cannot encode ---------------------------------------------------------------


PROMPT = "hello \ud800 world \udfff"


@pytest.mark.parametrize("store_kind", ["sqlite", "jsonl"])
async def test_unencodable_prompt(store_kind: str, tmp_path: Path) -> None:
    """A prompt with lone surrogates: stored escaped, or the victim's STORE_FAILED only.

    The bystander shares the store (one SQLite writer connection): a failed transaction must be
    rolled back so the bystander's commits go on.
    """
    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store) as pair:
            await pair.run_both(victim_prompt=PROMPT)
            codes = {e["error"]["code"] for e in pair.victim_errors()}
            assert codes <= {"STORE_FAILED"}, codes
            assert pair.bystander_errors() == []
    victim, _ = await check_stored(store, store_kind, tmp_path, victim_open_turn=bool(codes))
    if not codes:
        assert turn_ends(victim) == [{"kind": "completed"}]
        assert answer_text(victim) == "victim done"
        texts = [
            block["text"]
            for e in victim
            if e.type == "user/message"
            for block in plain(e.data)["message"]["content"]
            if block["type"] == "text"
        ]
        (text,) = [t for t in texts if t.startswith("hello ")]
        # Stored as sent (the store's encoding holds it), or with the offending characters
        # escaped: never mangled otherwise.
        if text != PROMPT:
            text.encode("utf-8")
            assert text.startswith("hello ")
            assert " world " in text


# --- unusable locations -------------------------------------------------------------------------


def _under_file(tmp_path: Path) -> SessionStore:
    (tmp_path / "plain.txt").write_text("not a directory")
    return SqliteStore(tmp_path / "plain.txt" / "sessions.db")


def _is_directory(tmp_path: Path) -> SessionStore:
    (tmp_path / "adir").mkdir()
    return SqliteStore(tmp_path / "adir")


def _not_a_database(tmp_path: Path) -> SessionStore:
    (tmp_path / "garbage.db").write_bytes(b"this is not an SQLite database file\x00" * 200)
    return SqliteStore(tmp_path / "garbage.db")


def _jsonl_dir_is_file(tmp_path: Path) -> SessionStore:
    (tmp_path / "sessions").write_text("a file, not a directory")
    return JsonlStore(tmp_path / "sessions")


BAD_LOCATIONS = {
    "sqlite_under_regular_file": _under_file,
    "sqlite_path_is_directory": _is_directory,
    "sqlite_not_a_database": _not_a_database,
    "jsonl_dir_is_file": _jsonl_dir_is_file,
}


@pytest.mark.parametrize("case", sorted(BAD_LOCATIONS))
async def test_unusable_store_location(case: str, tmp_path: Path) -> None:
    """Creating an agent on a store that cannot open raises a coded StoreError; others go on."""
    good = MemoryStore()
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=good) as pair:
            pair.bystander.agent.followup("go")
            bad_store = BAD_LOCATIONS[case](tmp_path)
            with pytest.raises(StoreError) as info:
                async with open_runtime(store=bad_store, providers={"s": victim_model()}) as rt:
                    await rt.agents.create(
                        options=AgentOptions(id="doomed", provider="s", model="m")
                    )
            assert isinstance(info.value.code, str)
            assert info.value.code
            await bad_store.aclose()
            pair.victim.agent.followup("go")
            await pair.victim.agent.wait_idle()
            await pair.bystander.agent.wait_idle()
    victim, _ = await check_stored(good, "memory", tmp_path)
    assert turn_ends(victim) == [{"kind": "completed"}]


# --- a corrupt JSONL log ------------------------------------------------------------------------


async def test_jsonl_corrupt_middle_line(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    async with open_runtime(store=JsonlStore(directory), providers={"s": victim_model()}) as rt:
        handle = await rt.agents.create(
            session_id=VICTIM_SESSION, options=AgentOptions(id=VICTIM, provider="s", model="m")
        )
        handle.agent.followup("go")
        with trio.fail_after(LIMIT):
            await handle.agent.wait_idle()
    (path,) = directory.glob("*.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) > 6
    lines[4] = b'{"type": "user/message", "seq": \n'
    corrupt = b"".join(lines)
    path.write_bytes(corrupt)

    store = JsonlStore(directory)
    with trio.fail_after(LIMIT):
        async with open_runtime(store=store, providers={"s": victim_model()}, tools=[note]) as rt:
            with pytest.raises(StoreError) as info:
                await rt.agents.resume(
                    VICTIM_SESSION, options=AgentOptions(id=VICTIM, provider="s", model="m")
                )
            assert info.value.code
            assert rt.agents.get(VICTIM) is None
            # Nothing was truncated or rewritten.
            assert path.read_bytes() == corrupt
            helper = await rt.agents.create(
                session_id=BYSTANDER_SESSION,
                options=AgentOptions(id="bystander", provider="s", model="m"),
            )
            helper.agent.followup("go")
            await helper.agent.wait_idle()
    bystander = await stored_log(store, "jsonl", tmp_path, BYSTANDER_SESSION)
    assert_well_formed(bystander)
    assert turn_ends(bystander) == [{"kind": "completed"}]
    assert path.read_bytes() == corrupt


# --- ownership ----------------------------------------------------------------------------------


async def test_resume_session_owned_by_live_agent(tmp_path: Path) -> None:
    """Resuming a session another live agent writes: SessionAlreadyOwnedError, nothing changes."""
    store = make_store("sqlite", tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store) as pair:
            pair.bystander.agent.followup("go")
            with pytest.raises(SessionAlreadyOwnedError) as info:
                await pair.rt.agents.resume(
                    BYSTANDER_SESSION,
                    options=AgentOptions(id="thief", provider="bystander", model="m"),
                )
            assert info.value.code == "SESSION_ALREADY_OWNED"
            assert pair.rt.agents.get("thief") is None
            pair.victim.agent.followup("go")
            await pair.victim.agent.wait_idle()
            await pair.bystander.agent.wait_idle()
    await check_stored(store, "sqlite", tmp_path)


async def test_session_owned_by_other_runtime(tmp_path: Path) -> None:
    """A second runtime on its own store object for the same file cannot take a live session."""
    store = make_store("sqlite", tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store) as pair:
            pair.bystander.agent.followup("go")
            with pytest.raises(SessionAlreadyOwnedError):
                async with open_runtime(
                    store=SqliteStore(tmp_path / "sessions.db"),
                    providers={"s": victim_model()},
                ) as other:
                    await other.agents.resume(
                        VICTIM_SESSION, options=AgentOptions(id="thief", provider="s", model="m")
                    )
            pair.victim.agent.followup("go")
            await pair.victim.agent.wait_idle()
            await pair.bystander.agent.wait_idle()
    victim, bystander = await check_stored(store, "sqlite", tmp_path)
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert_bystander_ok(bystander)


def _jsonl_files(root: Path) -> list[Path]:
    return list(root.rglob("*.jsonl"))


async def test_jsonl_hostile_session_id(tmp_path: Path) -> None:
    """A session id with path syntax stays inside the store directory."""
    directory = tmp_path / "sessions"
    store = JsonlStore(directory)
    hostile = "../../escape"
    with trio.fail_after(LIMIT):
        async with open_pair(
            victim_model(),
            store=store,
            extra_providers={"extra": scripted_victim(Reply.text("fine"))},
        ) as pair:
            handle = await pair.rt.agents.create(
                session_id=hostile, options=AgentOptions(id="hostile", provider="extra", model="m")
            )
            handle.agent.followup("go")
            await handle.agent.wait_idle()
            await handle.dispose()
            await pair.run_both()
    assert not (tmp_path / "escape.jsonl").exists()
    assert not (tmp_path.parent / "escape.jsonl").exists()
    files = _jsonl_files(tmp_path)
    assert len(files) == 3, files
    assert all(p.resolve().parent == directory.resolve() for p in files)
    await check_stored(store, "jsonl", tmp_path)
    hostile_log = await stored_log(store, "jsonl", tmp_path, hostile)
    assert_well_formed(hostile_log)
    assert turn_ends(hostile_log) == [{"kind": "completed"}]
