"""The short form of a config file (``config/_short_form.py``) and YAML hints (``_yaml_hints.py``).

The plugin block's keys may stand at the top level instead of under the ``plugins:`` wrapper; one
or the other in a file. Faults name the paths as written. A YAML mistake whose cause is known
carries a hint, and still names its line and column.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsh_agent_loop import ConfigError, load_config
from dsh_agent_loop.config import PLUGIN_NAME, converter

SHORT = """\
store: memory
providers:
  demo: {kind: scripted, replies: [{text: "Hello!"}], loop: true}
maxParallelToolCalls: 3
persona: You are terse.
turnBudget: {maxSteps: 4}
tools: [read_file]
agents:
  - {id: main, provider: demo, model: m, requireApproval: [read_file]}
subagents:
  - {id: helper, provider: demo, model: m}
otel: {captureContent: true}
compaction: {triggerRatio: 0.5}
limits: {maxToolResultBytes: 1000}
permissions: {allow: [read_file]}
sandbox: read-only
"""

WRAPPED = f"""\
store: memory
providers:
  demo: {{kind: scripted, replies: [{{text: "Hello!"}}], loop: true}}
plugins:
  - name: '{PLUGIN_NAME}'
    config:
      maxParallelToolCalls: 3
      persona: You are terse.
      turnBudget: {{maxSteps: 4}}
      tools: [read_file]
      agents:
        - {{id: main, provider: demo, model: m, requireApproval: [read_file]}}
      subagents:
        - {{id: helper, provider: demo, model: m}}
      otel: {{captureContent: true}}
      compaction: {{triggerRatio: 0.5}}
      limits: {{maxToolResultBytes: 1000}}
      permissions: {{allow: [read_file]}}
      sandbox: read-only
"""


def _write(tmp_path: Path, text: str, name: str = "agent.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(source: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)  # type: ignore[arg-type]
    return str(info.value)


def test_the_short_form_loads_as_the_wrapper_does(tmp_path: Path) -> None:
    short = load_config(_write(tmp_path, SHORT, "short.yaml"))
    wrapped = load_config(_write(tmp_path, WRAPPED, "wrapped.yaml"))
    assert short.plugin == wrapped.plugin
    assert (short.store, short.providers) == (wrapped.store, wrapped.providers)
    assert short.agents[0].require_approval == ("read_file",)
    assert short.plugin.max_parallel_tool_calls == 3
    # unstructuring gives the wrapper shape back, which loads to the same config
    assert load_config(converter.unstructure(short)).plugin == short.plugin


def test_either_spelling_of_a_short_key_is_read() -> None:
    config = load_config({"max_parallel_tool_calls": 2, "agents": []})
    assert config.plugin.max_parallel_tool_calls == 2


def test_faults_in_the_short_form_name_the_short_path(tmp_path: Path) -> None:
    text = SHORT.replace("model: m, requireApproval", "model: 5, requireApproval").replace(
        "maxParallelToolCalls: 3", "maxParallelToolCalls: 0"
    )
    path = _write(tmp_path, text.replace("provider: demo, model: 5", "provider: nope, model: 5"))
    message = _error(path)
    assert f"{path}: maxParallelToolCalls: must be a positive integer" in message
    assert f"{path}: agents[0].provider: unknown provider 'nope' (known: demo)" in message
    assert f"{path}: agents[0].model: must be a non-empty string, got integer" in message
    assert "plugins" not in message


def test_a_tool_fault_in_the_short_form_names_the_short_path() -> None:
    message = _error({"tools": ["read_file", "no_such_tool"]})
    assert message.startswith("<config>: tools[1]: ")
    assert "plugins" not in message


def test_both_forms_in_one_file_are_refused_naming_each_key(tmp_path: Path) -> None:
    text = WRAPPED + "agents: []\npersona: hi\n"
    path = _write(tmp_path, text)
    message = _error(path)
    assert message.count("cannot be combined with plugins") == 2
    assert f"{path}: agents: cannot be combined with plugins" in message
    assert f"{path}: persona: cannot be combined with plugins" in message


def test_a_misspelt_top_level_key_is_answered_with_the_plugin_key() -> None:
    message = _error({"agnets": [{"id": "main"}]})
    assert "<config>: agnets: unknown key (did you mean 'agents'?" in message


@pytest.mark.parametrize(
    ("text", "where", "hint"),
    [
        (
            "persona: You are: helpful\n",
            "1:17",
            "a value with ': ' in it, or ending in ':', must be quoted:"
            ' persona: "You are: helpful"',
        ),
        ("store: memory:\n", "1:14", 'must be quoted: store: "memory:"'),
        ("agents:\n\t- id: main\n", "2:1", "indent with spaces"),
        ("permissions:\n  allow: [*]\n", "2:12", "quote a value that starts with it"),
        ("agents:\n  - id: main\n   model: m\n", "3:4", "check this line's indentation"),
        ('agents:\n  - {id: main, cwd: "C:\\Users\\me"}\n', "2:26", "use single quotes"),
        ("agents:\n  - {id: main, model: @cf/llama}\n", "2:23", "cannot start with '@'"),
    ],
)
def test_a_yaml_mistake_carries_a_hint(tmp_path: Path, text: str, where: str, hint: str) -> None:
    path = _write(tmp_path, text)
    message = _error(path)
    assert message.startswith(f"{path}: {where}: invalid YAML: ")
    assert hint in message.partition(" (hint: ")[2]


def test_a_secret_looking_value_is_not_shown_in_the_hint(tmp_path: Path) -> None:
    text = "providers:\n  p:\n    kind: openai\n    apiKey: sk-123: 456\n"
    message = _error(_write(tmp_path, text))
    assert "must be quoted)" in message
    assert "sk-123" not in message


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsh_agent_loop.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / ".xdg")},
    )


def test_the_cli_runs_a_short_form_config(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "providers:\n  demo: {kind: scripted, replies: [{text: Hello!}]}\n"
        "agents:\n  - {id: main, provider: demo, model: m}\n",
    )
    done = _cli(tmp_path, "run", "agent.yaml", "--store", "memory", "-p", "hi", "-q")
    assert done.returncode == 0, done.stderr
    assert "Hello!" in done.stdout


def test_the_cli_shows_the_short_path_and_the_yaml_hint(tmp_path: Path) -> None:
    _write(tmp_path, "agents:\n  - {id: main, provider: nope}\n", "bad.yaml")
    done = _cli(tmp_path, "run", "bad.yaml", "-p", "hi")
    assert done.returncode == 2
    assert "bad.yaml: agents[0].provider: unknown provider 'nope'" in done.stderr
    _write(tmp_path, "store: memory:\nagents: []\n", "colon.yaml")
    done = _cli(tmp_path, "run", "colon.yaml", "-p", "hi")
    assert done.returncode == 2
    assert "colon.yaml: 1:14: invalid YAML: mapping values are not allowed here" in done.stderr
    assert 'store: "memory:"' in done.stderr
