"""Fault corpus: hostile configuration (docs/design.md#validation).

Each hostile config is opened as a second runtime while a first runtime's two agents work:
``open_runtime(bad)`` raises ``ConfigError`` (``code == "CONFIG_INVALID"``, one line, never a
``RecursionError`` or an exception group) before any store is opened — the config's SQLite file
is never created — and the first runtime's agents finish their turns. The CLI turns the same
configs into exit code 2 with one line on stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import ConfigError, MemoryStore, Reply, load_config, open_runtime

from ._kit import LIMIT, answer_text, check_stored, open_pair, scripted_victim, turn_ends

PLUGIN = "@deepseek-ai/dsh-agent-loop"
DEPTH = 10_000


def _store_line(tmp_path: Path) -> str:
    return f"store: sqlite:///{tmp_path / 'never.db'}\n"


def billion_laughs(tmp_path: Path) -> Any:
    lines = [_store_line(tmp_path), 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    lines.append("providers: {p: {kind: scripted, replies: [{text: *a9}]}}")
    return _file(tmp_path, "\n".join(lines) + "\n")


def many_aliases(tmp_path: Path) -> Any:
    body = _store_line(tmp_path) + "x: &x {kind: scripted}\nproviders:\n"
    body += "".join(f"  p{i}: *x\n" for i in range(5_000))
    return _file(tmp_path, body)


def huge_file(tmp_path: Path) -> Any:
    padding = "# " + "x" * 1000 + "\n"
    return _file(tmp_path, _store_line(tmp_path) + padding * 1100)


def deep_yaml_flow(tmp_path: Path) -> Any:
    return _file(tmp_path, _store_line(tmp_path) + "providers: " + "[" * DEPTH + "]" * DEPTH + "\n")


def deep_yaml_mapping(tmp_path: Path) -> Any:
    return _file(
        tmp_path, _store_line(tmp_path) + "providers: " + "{a: " * DEPTH + "1" + "}" * DEPTH
    )


def deep_yaml_block(tmp_path: Path) -> Any:
    lines = [_store_line(tmp_path).rstrip("\n"), "providers:"]
    lines += [" " * (i + 1) + f"k{i}:" for i in range(500)]
    lines.append(" " * 501 + "v")
    return _file(tmp_path, "\n".join(lines) + "\n")


def deep_mapping(tmp_path: Path) -> Any:
    deep: Any = {"kind": "scripted"}
    for _ in range(DEPTH):
        deep = {"a": deep}
    return {"store": f"sqlite:///{tmp_path / 'never.db'}", "providers": {"p": deep}}


def deep_list_mapping(tmp_path: Path) -> Any:
    deep: Any = []
    for _ in range(DEPTH):
        deep = [deep]
    return {"store": f"sqlite:///{tmp_path / 'never.db'}", "plugins": deep}


def python_tag(tmp_path: Path) -> Any:
    return _file(tmp_path, _store_line(tmp_path) + "x: !!python/object/apply:os.getcwd []\n")


def duplicate_keys(tmp_path: Path) -> Any:
    return _file(tmp_path, _store_line(tmp_path) + "providers: {}\nproviders: {}\n")


def not_utf8(tmp_path: Path) -> Any:
    path = tmp_path / "config.yaml"
    path.write_bytes(_store_line(tmp_path).encode() + b"persona: \xff\xfe\xfa\n")
    return str(path)


def top_level_list(tmp_path: Path) -> Any:
    return _file(tmp_path, "- store\n- memory\n")


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _mapping(**sections: Any) -> Callable[[Path], Any]:
    def build(tmp_path: Path) -> Any:
        return {"store": f"sqlite:///{tmp_path / 'never.db'}", **sections}

    return build


def _plugin(**config: Any) -> Callable[[Path], Any]:
    return _mapping(plugins=[{"name": PLUGIN, "config": config}])


HOSTILE: dict[str, Callable[[Path], Any]] = {
    "billion_laughs": billion_laughs,
    "many_aliases": many_aliases,
    "file_over_1_mib": huge_file,
    "deep_yaml_flow_lists": deep_yaml_flow,
    "deep_yaml_flow_mappings": deep_yaml_mapping,
    "deep_yaml_block": deep_yaml_block,
    "deep_mapping": deep_mapping,
    "deep_list_mapping": deep_list_mapping,
    "python_tag": python_tag,
    "duplicate_keys": duplicate_keys,
    "not_utf8": not_utf8,
    "top_level_list": top_level_list,
    "unknown_top_key": _mapping(stores="memory:"),
    "unknown_provider_key": _mapping(providers={"p": {"kind": "openai", "bogus": 1}}),
    "unknown_provider_kind": _mapping(providers={"p": {"kind": "telepathy"}}),
    "wrong_type_parallel": _plugin(maxParallelToolCalls="ten"),
    "zero_parallel": _plugin(maxParallelToolCalls=0),
    "bool_as_int": _plugin(maxParallelToolCalls=True),
    "agents_not_a_list": _plugin(agents={"id": "a"}),
    "agent_without_id": _plugin(agents=[{"provider": "p"}]),
    "agent_unknown_provider": _plugin(agents=[{"id": "a", "provider": "nowhere"}]),
    "session_and_resume": _plugin(agents=[{"id": "a", "sessionId": "s", "resumeSessionId": "s"}]),
    "bad_store_url": lambda tmp_path: {"store": "ftp://example.com/sessions"},
    "store_not_a_string": lambda tmp_path: {"store": {"url": "memory:"}},
    "reasoning_replay_sometimes": _mapping(
        providers={"p": {"kind": "openai", "reasoning_replay": "sometimes"}}
    ),
    "model_reasoning_replay_sometimes": _mapping(
        providers={
            "p": {
                "kind": "openai",
                "models": {"deepseek-v4-pro": {"reasoning_replay": "sometimes"}},
            }
        }
    ),
    "base_url_not_http": _mapping(providers={"p": {"kind": "openai", "base_url": "file:///etc"}}),
}


# What the one-line message must name, so each config is refused for the intended reason.
REASONS = {
    "billion_laughs": "alias",
    "many_aliases": "alias",
    "file_over_1_mib": "MiB|bytes|large",
    "deep_yaml_flow_lists": "nest|deep|depth",
    "deep_yaml_flow_mappings": "nest|deep|depth",
    "deep_yaml_block": "nest|deep|depth",
    "deep_mapping": "nest|deep|depth",
    "deep_list_mapping": "nest|deep|depth",
    "duplicate_keys": "duplicate",
    "not_utf8": "UTF-8|utf8|decode",
    "unknown_top_key": "stores",
    "unknown_provider_key": "bogus",
    "reasoning_replay_sometimes": "reasoning_replay",
    "model_reasoning_replay_sometimes": "reasoning_replay",
    "bad_store_url": "store",
    "base_url_not_http": "base_url",
    "session_and_resume": "sessionId|resumeSessionId",
}
# Checks that may wait for the runtime to build the provider (still a ConfigError).
RUNTIME_ONLY = {"base_url_not_http"}


def _check_error(exc: ConfigError, case: str) -> None:
    assert exc.code == "CONFIG_INVALID"
    message = str(exc)
    if case in REASONS:
        assert re.search(REASONS[case], message, re.IGNORECASE), message
    assert message
    assert "\n" not in message, message
    assert len(message) < 2_000, len(message)
    assert not isinstance(exc.__cause__, RecursionError)


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_config(
    case: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = HOSTILE[case](tmp_path)
    store = MemoryStore()
    victim_model = scripted_victim(Reply.tool_calls(("note", {"text": "v"})), Reply.text("ok"))
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model, store=store) as pair:
            pair.bystander.agent.followup("go")
            with pytest.raises(ConfigError) as info:
                async with open_runtime(config):
                    raise AssertionError("a hostile config opened a runtime")
            _check_error(info.value, case)
            if case not in RUNTIME_ONLY:
                with pytest.raises(ConfigError) as again:
                    load_config(config)
                _check_error(again.value, case)
            assert not (tmp_path / "never.db").exists(), "a store was opened"
            pair.victim.agent.followup("go")
            await pair.victim.agent.wait_idle()
            await pair.bystander.agent.wait_idle()
    victim, _ = await check_stored(store, "memory", tmp_path)
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == "ok"


CLI_CASES = [
    "billion_laughs",
    "deep_yaml_flow_lists",
    "file_over_1_mib",
    "reasoning_replay_sometimes",
]


def _yaml_file(case: str, tmp_path: Path) -> str:
    config = HOSTILE[case](tmp_path)
    if isinstance(config, str):
        return config
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("case", CLI_CASES)
async def test_cli_hostile_config(case: str, tmp_path: Path) -> None:
    """``dsh-agent run FILE --prompt x``: exit 2, one line on stderr, no store created."""
    path = _yaml_file(case, tmp_path)
    exe = Path(sys.executable).parent / "dsh-agent"
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / ".xdg"), "NO_COLOR": "1"}
    with trio.fail_after(30):
        done = await trio.run_process(
            [str(exe), "run", path, "--prompt", "x"],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, (done.returncode, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert "RecursionError" not in stderr
    assert not (tmp_path / "never.db").exists()
    assert not (tmp_path / "sessions.db").exists()
