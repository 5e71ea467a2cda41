"""What the CLI writes (``cli/_terminal.py``): controls made visible, store passwords hidden."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from dsh_agent_loop.cli._terminal import (
    TerminalGuard,
    json_visible,
    redact,
    redact_url,
    url_secrets,
    visible,
)

HOSTILE = (
    "clear\x1b[2J hide\x1b[8m clip\x1b]52;c;aGk=\x07 csi\x9b2J rlo\u202etxt\u2066 del\x7f cr\r"
)
#: What must never reach a terminal raw: C0 but newline and tab, DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_visible_replaces_every_control_by_a_visible_sign() -> None:
    shown = visible(HOSTILE)
    assert not RAW.search(shown)
    assert shown == ("clear␛[2J hide␛[8m clip␛]52;c;aGk=␇ csi\\x9b2J rlo\\u202etxt\\u2066 del␡ cr␍")
    assert visible("line\r\nnext\ttab\n") == "line\nnext\ttab\n"
    assert visible("plain [b]text[/b] é 中文 …") == "plain [b]text[/b] é 中文 …"
    assert visible(shown) == shown  # idempotent


def test_json_visible_escapes_what_json_leaves_raw_and_decodes_the_same() -> None:
    line = json.dumps({"text": HOSTILE}, ensure_ascii=False)
    escaped = json_visible(line)
    assert not RAW.search(escaped)
    assert json.loads(escaped) == json.loads(line) == {"text": HOSTILE}
    assert "\\u009b" in escaped
    assert "\\u202e" in escaped


@pytest.mark.parametrize(
    ("url", "shown", "secrets"),
    [
        (
            "postgresql://app:s3cret@db.example:5432/prod",
            "postgresql://app:***@db.example:5432/prod",
            {"s3cret"},
        ),
        (
            "postgres://app:p%40ss%2Fw@db/prod?sslmode=require&table_prefix=x_",
            "postgres://app:***@db/prod?sslmode=require&table_prefix=x_",
            {"p%40ss%2Fw", "p@ss/w"},
        ),
        (
            "postgresql://app@db/prod?sslmode=disable&password=qs%20secret&lease_ttl=5",
            "postgresql://app@db/prod?sslmode=disable&password=***&lease_ttl=5",
            {"qs%20secret", "qs secret"},
        ),
        (
            "postgresql://app:one@db/prod?PassWord=two",
            "postgresql://app:***@db/prod?PassWord=***",
            {"one", "two"},
        ),
        ("postgresql://app@db/prod", "postgresql://app@db/prod", set()),
        ("sqlite:///sessions.db", "sqlite:///sessions.db", set()),
        ("memory:", "memory:", set()),
    ],
)
def test_redact_url_hides_userinfo_and_query_passwords(
    url: str, shown: str, secrets: set[str]
) -> None:
    assert redact_url(url) == shown
    assert url_secrets(url) == secrets


def test_redact_hides_known_secrets_anywhere_and_any_url_or_conninfo_password() -> None:
    text = (
        'invalid percent-encoded token: "hunter2%zz"; '
        "dsn postgresql://bob:other@h/db; conninfo host=h password=xyz user=bob; "
        "quoted password='a b c' end"
    )
    shown = redact(text, {"hunter2%zz"})
    assert "hunter2" not in shown
    assert "other" not in shown
    assert "xyz" not in shown
    assert "a b c" not in shown
    assert "postgresql://bob:***@h/db" in shown
    assert "password=*** user=bob" in shown


def test_the_guard_cleans_what_a_console_prints_and_keeps_its_styling() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", width=200)
    guard = TerminalGuard()
    guard.add_store_url("postgresql://app:topsecret@db/prod")
    console.push_render_hook(guard)
    console.print(Text("styled", style="bold red"), soft_wrap=True)
    console.print(Text(f"model said {HOSTILE}"), soft_wrap=True)
    console.print(f"error: cannot connect with topsecret {HOSTILE}", markup=False)
    console.print(Panel(Text(HOSTILE), title="tool"))
    written = out.getvalue()
    # The console's own styling (SGR sequences) stays, nothing else does.
    assert "\x1b[1;31mstyled\x1b[0m" in written
    escapes = re.findall(r"\x1b[^a-zA-Z]*[a-zA-Z]?", written)
    assert all(re.fullmatch(r"\x1b\[[0-9;]*m", e) for e in escapes), escapes
    assert all("8" not in e[2:-1].split(";") for e in escapes), escapes
    assert not RAW.search(re.sub(r"\x1b\[[0-9;]*m", "", written))
    assert "topsecret" not in written
    assert "clear␛[2J hide␛[8m clip␛]52;c;aGk=" in written  # the text itself is visible
    assert "cannot connect with ***" in written
