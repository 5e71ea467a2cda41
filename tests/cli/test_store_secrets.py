"""A store URL's password never reaches stdout or stderr: it is shown as ``***``.

Real processes on the test PostgreSQL server (``DSH_TEST_POSTGRES_DSN``; it trusts local
connections, so a URL with a password still connects). Every verb that shows the URL or can fail
with it is run, piped and on a terminal, with the password in the userinfo and in the query.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import QUICKSTART, Terminal, cli, pg_tables, postgres_dsn, with_password

SECRET = "Hunter2-Sup3r-Secret"


@pytest.fixture
def dsn() -> Iterator[tuple[str, str]]:
    """A store URL whose userinfo holds ``SECRET``, on fresh tables; and its prefix."""
    base = postgres_dsn()
    with pg_tables(base) as prefix:
        yield f"{with_password(base, SECRET)}?table_prefix={prefix}", prefix


def assert_hidden(*outputs: str) -> None:
    for output in outputs:
        assert SECRET not in output
        assert "Hunter2" not in output


def shown(url: str) -> str:
    """``url`` as the CLI must show it."""
    return url.replace(SECRET, "***")


def check(done: subprocess.CompletedProcess[str], code: int = 0) -> None:
    assert done.returncode == code, done.stderr
    assert_hidden(done.stdout, done.stderr)


def test_run_chat_and_sessions_never_show_the_password(
    tmp_path: Path, dsn: tuple[str, str]
) -> None:
    url, _ = dsn
    run = cli("run", str(QUICKSTART), "--store", url, "--prompt", "hi", cwd=tmp_path)
    check(run)
    missing = cli(
        "run", str(QUICKSTART), "--store", url, "--resume", "nope", "-p", "hi", cwd=tmp_path
    )
    check(missing, 2)
    assert f"session 'nope' not found in {shown(url)}" in missing.stderr
    chat = cli("chat", "--store", url, cwd=tmp_path, stdin="hello\n/resume nope\n/exit\n")
    check(chat)
    assert f"session 'nope' not found in {shown(url)}" in chat.stderr
    listed = cli("sessions", "list", "--store", url, cwd=tmp_path)
    check(listed)
    session_id = listed.stdout.split("\t")[0]
    for verb in (["show", session_id], ["check", session_id], ["export", session_id], ["list"]):
        check(cli("sessions", *verb, "--store", url, cwd=tmp_path))
    unknown = cli("sessions", "show", "nope", "--store", url, cwd=tmp_path)
    check(unknown, 2)
    assert unknown.stderr == f"session 'nope' not found in {shown(url)}\n"


def test_a_config_store_with_a_password_is_hidden_too(tmp_path: Path, dsn: tuple[str, str]) -> None:
    url, _ = dsn
    (tmp_path / "pg.yaml").write_text(f"store: '{url}'\n", encoding="utf-8")
    unknown = cli("sessions", "show", "nope", "--config", "pg.yaml", cwd=tmp_path)
    check(unknown, 2)
    assert unknown.stderr == f"session 'nope' not found in {shown(url)}\n"
    (tmp_path / "bad.yaml").write_text(f"store: '{url}&bogus=1'\n", encoding="utf-8")
    for args in (["run", "bad.yaml", "-p", "hi"], ["sessions", "list", "--config", "bad.yaml"]):
        bad = cli(*args, cwd=tmp_path)
        check(bad, 2)
        assert "unknown option 'bogus'" in bad.stderr


def test_an_empty_store_on_a_terminal_names_the_url_without_its_password(
    tmp_path: Path, dsn: tuple[str, str]
) -> None:
    url, _ = dsn
    term = Terminal("sessions", "list", "--store", url, cwd=tmp_path)
    try:
        assert term.wait(timeout=60) == 0, term.output
    finally:
        term.close()
    assert_hidden(term.output)
    assert "no sessions in postgresql://" in term.output
    assert ":***@" in term.output


def test_simulate_summary_and_json_hide_the_password(tmp_path: Path, dsn: tuple[str, str]) -> None:
    url, _ = dsn
    done = cli("simulate", "--agents", "2", "--store", url, "--json", "s.json", cwd=tmp_path)
    check(done)
    assert f"simulate on {shown(url)}" in done.stdout
    summary = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert summary["store"] == shown(url)


@pytest.mark.parametrize("debug", [False, True], ids=["one-line", "debug"])
def test_errors_that_embed_the_url_hide_the_password(
    tmp_path: Path, dsn: tuple[str, str], debug: bool
) -> None:
    url, _ = dsn
    more = ["--debug"] if debug else []
    bad_option = cli("sessions", "list", "--store", f"{url}&bogus=1", *more, cwd=tmp_path)
    check(bad_option, 2)
    assert "unknown option 'bogus'" in bad_option.stderr
    # psycopg echoes the part of the URL it cannot read: here, the password itself.
    garbled = with_password(postgres_dsn(), "PASSWORD").replace("PASSWORD", "Hunter2%zz")
    echoed = cli("sessions", "show", "x", "--store", garbled, *more, cwd=tmp_path)
    check(echoed, 1)
    assert "invalid percent-encoded token" in echoed.stderr
    refused = url.replace(":5432/", ":1/") if ":5432/" in url else None
    if refused is not None:
        down = cli("sessions", "list", "--store", refused, *more, cwd=tmp_path)
        check(down, 1)
    typo = cli("run", "x.yaml", "--stroe", url, cwd=tmp_path)
    check(typo, 2)
    assert "unrecognized arguments: --stroe postgresql://" in typo.stderr


def test_a_password_in_the_query_string_is_hidden(tmp_path: Path, dsn: tuple[str, str]) -> None:
    _, prefix = dsn
    url = f"{postgres_dsn()}?password={SECRET}&table_prefix={prefix}"
    run = cli("run", str(QUICKSTART), "-q", "--store", url, "--prompt", "hi", cwd=tmp_path)
    check(run)
    unknown = cli("sessions", "show", "nope", "--store", url, cwd=tmp_path)
    check(unknown, 2)
    assert unknown.stderr == f"session 'nope' not found in {shown(url)}\n"
    assert "?password=***&" in unknown.stderr
