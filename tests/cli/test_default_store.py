"""The store every verb finds: ``--store``, the config's, ``DSH_AGENT_STORE``, settings, default.

Real ``dsh-agent`` processes, each in its own directory with its own settings folder
(``helpers.environment``). What ``run`` or ``chat`` stored is what ``sessions`` finds with no
option repeated, and both verbs end with two stderr lines: where the session is, and the
``sessions show`` command that prints it (naming ``--store`` only when it must).
"""

from __future__ import annotations

import re
from pathlib import Path

from .helpers import QUICKSTART, cli, pg_tables, postgres_dsn, with_password

#: One agent, no ``store``: the store comes from the options, the variable or the settings.
NO_STORE = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents: [{id: main, provider: demo, model: m}]
providers:
  demo: {kind: scripted, loop: true, replies: [{text: Stored somewhere.}]}
"""

TWO_AGENTS = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents: [{id: alpha, provider: demo, model: m}, {id: beta, provider: demo, model: m}]
providers:
  demo: {kind: scripted, loop: true, replies: [{text: Stored somewhere.}]}
"""

CLOSING = re.compile(
    r"session (?P<id>\S+) stored in (?P<url>\S+)\n"
    r"show it with: (?P<command>dsh-agent sessions show \S+(?: --store \S+)?)\n\Z"
)


def _closing(stderr: str) -> re.Match[str]:
    """The two closing lines, which end stderr."""
    found = CLOSING.search(stderr)
    assert found is not None, stderr
    return found


def _settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".xdg" / "dsh-agent" / "settings.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


def _shows(tmp_path: Path, command: str, **env: str) -> str:
    """Run the printed ``sessions show`` command as printed; its output."""
    words = command.split()
    assert words[:3] == ["dsh-agent", "sessions", "show"]
    shown = cli(*words[1:], cwd=tmp_path, **env)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_the_environment_variable_is_every_verbs_store(tmp_path: Path) -> None:
    (tmp_path / "nostore.yaml").write_text(NO_STORE, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'env.db'}"
    done = cli("run", "nostore.yaml", "-q", "-p", "hello", cwd=tmp_path, DSH_AGENT_STORE=url)
    assert done.returncode == 0, done.stderr
    closing = _closing(done.stderr)
    assert closing["url"] == url
    # The variable is what `sessions show` finds too: no --store in the command.
    assert closing["command"] == f"dsh-agent sessions show {closing['id']}"
    assert '"Stored somewhere."' in _shows(tmp_path, closing["command"], DSH_AGENT_STORE=url)
    listed = cli("sessions", "list", cwd=tmp_path, DSH_AGENT_STORE=url)
    assert listed.stdout.split("\t")[0] == closing["id"]
    assert (tmp_path / "env.db").is_file()
    assert not (tmp_path / "sessions.db").exists()
    # Without the variable the default store is another one, which holds nothing.
    elsewhere = cli("sessions", "show", closing["id"], cwd=tmp_path)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr == f"session '{closing['id']}' not found in sqlite:///sessions.db\n"
    # simulate and chat take it as well.
    simulated = cli("simulate", "--agents", "2", cwd=tmp_path, DSH_AGENT_STORE=url)
    assert f"simulate on {url}" in simulated.stdout
    chatted = cli("chat", cwd=tmp_path, stdin="hi\n", DSH_AGENT_STORE=url)
    assert chatted.returncode == 0, chatted.stderr
    assert _closing(chatted.stderr)["url"] == url
    assert "(echo) hi" in _shows(tmp_path, _closing(chatted.stderr)["command"], DSH_AGENT_STORE=url)


def test_the_settings_file_names_the_store_and_the_variable_beats_it(tmp_path: Path) -> None:
    (tmp_path / "nostore.yaml").write_text(NO_STORE, encoding="utf-8")
    settings_url = f"sqlite:///{tmp_path / 'mine.db'}"
    _settings(tmp_path, f"store: {settings_url}\nmaxParallelToolCalls: 2\n")
    done = cli("run", "nostore.yaml", "-q", "-p", "hello", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    closing = _closing(done.stderr)
    assert closing["url"] == settings_url
    assert closing["command"] == f"dsh-agent sessions show {closing['id']}"
    assert '"Stored somewhere."' in _shows(tmp_path, closing["command"])
    assert not (tmp_path / "sessions.db").exists()
    # The variable beats the settings file; the command then names the store `show` would miss
    # without it... only when it differs from what `show` finds (the variable, here).
    env_url = f"sqlite:///{tmp_path / 'env.db'}"
    done = cli("run", "nostore.yaml", "-q", "-p", "hi", cwd=tmp_path, DSH_AGENT_STORE=env_url)
    assert _closing(done.stderr)["url"] == env_url
    # --store beats both, and the command says so.
    done = cli("run", "nostore.yaml", "-q", "-p", "hi", "--store", "sqlite:///opt.db", cwd=tmp_path)
    closing = _closing(done.stderr)
    assert closing["url"] == "sqlite:///opt.db"
    assert closing["command"].endswith(" --store sqlite:///opt.db")
    assert '"Stored somewhere."' in _shows(tmp_path, closing["command"])


def test_the_configs_store_beats_the_users_defaults(tmp_path: Path) -> None:
    env_url = f"sqlite:///{tmp_path / 'env.db'}"
    done = cli("run", str(QUICKSTART), "-q", "-p", "hi", cwd=tmp_path, DSH_AGENT_STORE=env_url)
    assert done.returncode == 0, done.stderr
    closing = _closing(done.stderr)
    assert closing["url"] == "sqlite:///sessions.db"  # the config's
    # `sessions show` alone would look in the variable's store: the command names the config's.
    assert closing["command"].endswith(" --store sqlite:///sessions.db")
    assert "list_dir" in _shows(tmp_path, closing["command"], DSH_AGENT_STORE=env_url)
    assert not (tmp_path / "env.db").exists()
    # Without the variable the config's store is the default one: no --store.
    done = cli("run", str(QUICKSTART), "-q", "-p", "hi", cwd=tmp_path)
    assert (
        _closing(done.stderr)["command"] == f"dsh-agent sessions show {_closing(done.stderr)['id']}"
    )


def test_a_bad_variable_or_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "nostore.yaml").write_text(NO_STORE, encoding="utf-8")
    for verb in (["run", "nostore.yaml", "-p", "hi"], ["sessions", "list"], ["chat"]):
        done = cli(*verb, cwd=tmp_path, stdin="hi\n", DSH_AGENT_STORE="redis://nowhere")
        assert done.returncode == 2, verb
        assert done.stderr.startswith("DSH_AGENT_STORE: unsupported store URL"), done.stderr
        assert len(done.stderr.splitlines()) == 1
    path = _settings(tmp_path, "store: 42\n")
    done = cli("sessions", "list", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"{path}: store: expected a store URL string\n"
    path.write_text("store: sqlite:///ok.db\nmaxParallelToolCalls: 0\n", encoding="utf-8")
    done = cli("run", "nostore.yaml", "-p", "hi", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"{path}: maxParallelToolCalls: must be a positive integer\n"
    assert not (tmp_path / "ok.db").exists()


def test_several_sessions_and_a_memory_store_close_with_their_own_lines(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_AGENTS, encoding="utf-8")
    done = cli("run", "two.yaml", "-q", "-p", "hi", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-2:]
    found = re.fullmatch(
        r"sessions (alpha-session-\S+), (beta-session-\S+) stored in (\S+)", last[0]
    )
    assert found is not None, last
    assert found[3] == "sqlite:///sessions.db"
    assert last[1] == f"show one with: dsh-agent sessions show {found[1]}"
    for verb in (["run", "two.yaml", "-q", "-p", "hi"], ["chat"]):
        gone = cli(*verb, "--store", "memory:", cwd=tmp_path, stdin="hi\n")
        assert gone.returncode == 0, gone.stderr
        line = gone.stderr.splitlines()[-1]
        assert " lived in memory: and " in line, line
        assert " gone now " in line, line
        assert "sessions show" not in gone.stderr


def test_a_password_in_the_store_url_is_not_printed_in_the_closing_lines(tmp_path: Path) -> None:
    (tmp_path / "nostore.yaml").write_text(NO_STORE, encoding="utf-8")
    base = postgres_dsn()
    with pg_tables(base) as prefix:
        url = f"{with_password(base, 'Hunter2')}?table_prefix={prefix}"
        done = cli("run", "nostore.yaml", "-q", "-p", "hi", cwd=tmp_path, DSH_AGENT_STORE=url)
        assert done.returncode == 0, done.stderr
        assert "Hunter2" not in done.stderr + done.stdout
        closing = _closing(done.stderr)
        assert closing["url"] == url.replace("Hunter2", "***")
        assert closing["command"] == f"dsh-agent sessions show {closing['id']}"
        shown = cli("sessions", "show", closing["id"], cwd=tmp_path, DSH_AGENT_STORE=url)
        assert shown.returncode == 0, shown.stderr
        assert '"Stored somewhere."' in shown.stdout


WRITES = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents: [{id: main, provider: demo, model: m, cwd: ., tools: [write_file]}]
providers:
  demo:
    kind: scripted
    loop: true
    replies:
      - tool_calls: [{name: write_file, arguments: {path: notes.txt, content: hello}}]
      - text: Written.
"""


def test_approve_finds_the_session_run_left_waiting_in_the_variables_store(
    tmp_path: Path,
) -> None:
    (tmp_path / "writes.yaml").write_text(WRITES, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'env.db'}"
    done = cli(
        "run", "writes.yaml", "-q", "--session", "w", "-p", "go", cwd=tmp_path, DSH_AGENT_STORE=url
    )
    assert done.returncode == 3, done.stderr
    assert _closing(done.stderr)["command"] == "dsh-agent sessions show w"
    approved = cli(
        "approve", "w", "--all", "--config", "writes.yaml", cwd=tmp_path, DSH_AGENT_STORE=url
    )
    # Found and decided: the call ran (the model of a new process asks for it once more: 3).
    assert approved.returncode == 3, approved.stderr
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "hello"
    assert not (tmp_path / "sessions.db").exists()
