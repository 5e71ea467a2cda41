"""Bad configs exit 2 with one stderr line ``FILE: key.path: message``, before any store opens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsh_agent_loop import ConfigError, load_config

from .helpers import cli

HEAD = "plugins:\n  - name: '@deepseek-ai/dsh-agent-loop'\n    config:\n"
PROVIDER = "providers:\n  s: {kind: scripted, replies: [{text: hi}]}\n"


def agents(*lines: str) -> str:
    return HEAD + "      agents:\n" + "".join(f"        - {line}\n" for line in lines) + PROVIDER


# (config text, the key path the message must name, a fragment of the message)
BAD = [
    pytest.param(
        agents("{id: a, provider: s, model: m}", "{id: b, provider: s, maxTokens: 0}"),
        "plugins[0].config.agents[1].maxTokens",
        "must be a positive integer",
        id="max-tokens-zero",
    ),
    pytest.param(
        HEAD + "      maxParallelToolCalls: '10'\n",
        "plugins[0].config.maxParallelToolCalls",
        "got string",
        id="string-for-integer",
    ),
    pytest.param(
        agents("{id: a, provider: s, maxTokenz: 5}"),
        "plugins[0].config.agents[0].maxTokenz",
        "unknown key",
        id="misspelt-agent-key",
    ),
    pytest.param("plugin: []\n", "plugin", "unknown key", id="unknown-top-level-key"),
    pytest.param(
        agents("{id: a, provider: nowhere}"),
        "plugins[0].config.agents[0].provider",
        "unknown provider 'nowhere'",
        id="unknown-provider",
    ),
    pytest.param(
        agents("{id: a, provider: s, sessionId: x, resumeSessionId: y}"),
        "plugins[0].config.agents[0]",
        "sessionId",
        id="session-and-resume",
    ),
    pytest.param("store: mysql://db\n", "store", "unsupported store URL", id="bad-store-url"),
    pytest.param(
        "providers:\n  p: {kind: grpc}\n", "providers.p.kind", "unknown provider kind", id="kind"
    ),
    pytest.param(
        agents("{id: a, provider: s}", "{id: a, provider: s}"),
        "plugins[0].config.agents[1].id",
        "duplicate",
        id="duplicate-agent-id",
    ),
    pytest.param(
        agents("{id: a, provider: s, reasoningEffort: ''}"),
        "plugins[0].config.agents[0].reasoningEffort",
        "non-empty",
        id="empty-reasoning-effort",
    ),
    pytest.param(
        HEAD + "      agents: {id: a}\n",
        "plugins[0].config.agents",
        "expected a list",
        id="agents-not-a-list",
    ),
    pytest.param(
        "providers:\n  s: {kind: scripted, latency_ms: -5}\n",
        "providers.s.latency_ms",
        "non-negative",
        id="negative-latency",
    ),
    pytest.param(
        agents("{id: a, provider: s, personaFile: missing.md}"),
        "plugins[0].config.agents[0].personaFile",
        "file not found",
        id="persona-file-missing",
    ),
    pytest.param(
        HEAD + "      turnBudget: {steps: 3}\n",
        "plugins[0].config.turnBudget.steps",
        "unknown key",
        id="unknown-budget-key",
    ),
]


@pytest.mark.parametrize(("text", "path", "fragment"), BAD)
def test_bad_config_exits_2_with_one_line_and_no_store(
    tmp_path: Path, text: str, path: str, fragment: str
) -> None:
    (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
    done = cli("run", "bad.yaml", "--prompt", "hi", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"bad.yaml: {path}: ") or line.startswith(f"bad.yaml: {path}."), line
    assert fragment in line
    assert "Traceback" not in done.stderr
    # The ConfigError message, verbatim.
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml", base_dir=tmp_path)
    assert line == str(info.value).replace(str(tmp_path / "bad.yaml"), "bad.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("plugins: [\n", encoding="utf-8")
    done = cli("run", "broken.yaml", "--prompt", "hi", cwd=tmp_path)
    assert done.returncode == 2
    assert re.fullmatch(r"broken\.yaml: \d+:\d+: invalid YAML: .+\n", done.stderr)
    missing = cli("run", "nope.yaml", "--prompt", "hi", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.startswith("nope.yaml: cannot read: ")
    assert missing.stderr.count("\n") == 1
    assert not (tmp_path / "sessions.db").exists()


def test_every_verb_rejects_a_bad_config_before_opening_a_store(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(agents("{id: a, maxTokens: 0}"), encoding="utf-8")
    expected = "bad.yaml: plugins[0].config.agents[0].maxTokens: must be a positive integer\n"
    for args in (
        ["chat", "bad.yaml"],
        ["simulate", "--agents", "2", "--config", "bad.yaml"],
    ):
        done = cli(*args, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (2, expected), args
    # The read-only verbs read only the config's store: the fault is not theirs to find.
    listed = cli("sessions", "list", "--config", "bad.yaml", cwd=tmp_path)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("store: mysql://db\n", encoding="utf-8")
    done = cli("run", "bad.yaml", "--prompt", "hi", "--debug", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("bad.yaml: store: unsupported store URL")


def test_bad_usage_exits_2_with_one_line(tmp_path: Path) -> None:
    for args in (["run"], ["simulate", "--agents", "0"], ["sessions"], ["fly"]):
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2, args
        assert done.stderr.count("\n") == 1, done.stderr
    bad_store = cli("sessions", "list", "--store", "redis://x", cwd=tmp_path)
    assert bad_store.returncode == 2
    assert bad_store.stderr.startswith("--store: unsupported store URL 'redis://x'")


def _laughs() -> str:
    lines = ['lol1: &lol1 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(2, 10):
        lines.append(f"lol{level}: &lol{level} [" + ",".join([f"*lol{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


_DEEP = 10_000
_ONE_MIB = 1024 * 1024

# docs/design.md#validation: hostile files are refused with one line and exit 2 (before: exit 1 with
# a
# RecursionError line, or the file read whole and then refused or run for another reason).
LIMITS = [
    pytest.param(
        _laughs(),
        "bad.yaml: 5:14: YAML aliases expand to more than 10000 nodes; refusing",
        id="billion-laughs",
    ),
    pytest.param(
        "store: memory\n#" + "x" * _ONE_MIB,
        "bad.yaml: file is larger than 1048576 bytes (1 MiB)",
        id="over-1-MiB",
    ),
    pytest.param(
        f"store: {'[' * _DEEP}{']' * _DEEP}\n",
        "bad.yaml: store" + "[0]" * 63 + ": nested deeper than 64 levels (at 1:71)",
        id="deep-lists",
    ),
    pytest.param(
        f"providers: {'{a: ' * _DEEP}1{'}' * _DEEP}\n",
        "bad.yaml: providers" + ".a" * 63 + ": nested deeper than 64 levels (at 1:264)",
        id="deep-mappings",
    ),
]


@pytest.mark.parametrize(("text", "expected"), LIMITS)
def test_hostile_configs_exit_2_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
    done = cli("run", "bad.yaml", "--prompt", "hi", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", expected + "\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_hostile_settings_file_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(agents("{id: a, provider: s}"), encoding="utf-8")
    settings = tmp_path / ".xdg" / "dsh-agent" / "settings.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text(f"persona: {'[' * _DEEP}{']' * _DEEP}\n", encoding="utf-8")
    done = cli("run", "ok.yaml", "--prompt", "hi", cwd=tmp_path)
    expected = f"{settings}: persona" + "[0]" * 63 + ": nested deeper than 64 levels (at 1:73)"
    assert (done.returncode, done.stdout, done.stderr) == (2, "", expected + "\n")
    assert not (tmp_path / "sessions.db").exists()
