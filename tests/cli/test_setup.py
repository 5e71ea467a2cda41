"""What every CLI verb resolves first (``cli/_setup.py``): paths, store URL, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.cli._setup import (
    DEFAULT_STORE,
    EXIT_USAGE,
    CliError,
    config_path,
    load_cli_config,
    load_user_settings,
    make_store,
    missing_local_store,
    settings_path,
    store_url,
)
from dsh_agent_loop.config._document import RuntimeConfig
from dsh_agent_loop.stores import MemoryStore, SqliteStore


def test_cli_error_carries_message_and_exit_code():
    exc = CliError("bad")
    assert (exc.message, exc.code, str(exc)) == ("bad", EXIT_USAGE, "bad")
    assert CliError("x", 1).code == 1


def test_settings_path_uses_an_absolute_xdg_config_home(tmp_path: Path):
    assert settings_path({"XDG_CONFIG_HOME": str(tmp_path)}) == (
        tmp_path / "dsh-agent" / "settings.yaml"
    )
    home = Path.home() / ".config" / "dsh-agent" / "settings.yaml"
    assert settings_path({}) == home
    assert settings_path({"XDG_CONFIG_HOME": ""}) == home
    assert settings_path({"XDG_CONFIG_HOME": "relative/dir"}) == home


def test_user_settings_are_empty_when_the_file_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert dict(load_user_settings()) == {}


@pytest.mark.parametrize(
    ("positional", "option", "path"),
    [(None, None, None), ("a.yaml", None, "a.yaml"), (None, "b.yaml", "b.yaml"), ("c", "c", "c")],
)
def test_config_path_takes_either_spelling(positional, option, path):
    assert config_path(positional, option) == path


def test_config_path_refuses_two_different_files():
    with pytest.raises(CliError, match="give the config once: CONFIG 'a' or --config 'b'"):
        config_path("a", "b")


def test_load_cli_config(tmp_path: Path):
    assert load_cli_config(None) is None
    good = tmp_path / "ok.yaml"
    good.write_text("store: memory\n")
    config = load_cli_config(str(good))
    assert isinstance(config, RuntimeConfig)
    assert config.store == "memory"
    bad = tmp_path / "bad.yaml"
    bad.write_text("store: redis://x\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: store: unsupported store URL"):
        load_cli_config(str(bad))


def test_store_url_prefers_the_option_then_the_config_then_the_default():
    with_store = RuntimeConfig(store="memory")
    assert store_url("jsonl:///x", with_store) == "jsonl:///x"
    assert store_url(None, with_store) == "memory"
    assert store_url(None, RuntimeConfig()) == DEFAULT_STORE
    assert store_url(None, None) == DEFAULT_STORE == "sqlite:///sessions.db"


def test_make_store_builds_without_opening_and_turns_bad_urls_into_cli_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    assert isinstance(make_store("memory"), MemoryStore)
    assert isinstance(make_store("sqlite:///s.db"), SqliteStore)
    assert not (tmp_path / "s.db").exists()
    with pytest.raises(CliError, match="--store: unsupported store URL 'redis://x'") as info:
        make_store("redis://x")
    assert info.value.code == EXIT_USAGE


def test_missing_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.db").touch()
    (tmp_path / "logs").mkdir()
    assert missing_local_store("sqlite:///absent.db")
    assert missing_local_store("jsonl:///nologs")
    assert not missing_local_store("sqlite:///here.db")
    assert not missing_local_store("jsonl:///logs")
    assert not missing_local_store(f"sqlite:///{tmp_path / 'here.db'}")
    # the query string carries options; it is not part of the path
    assert not missing_local_store("sqlite:///here.db?durability=full")
    assert missing_local_store("sqlite:///absent.db?durability=full")
    for url in ("memory", "postgresql://h/db", "sqlite:///", "sqlite://x"):
        assert not missing_local_store(url)
