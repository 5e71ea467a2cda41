"""``cli/_approvals.py``: ``--permission-mode`` on a loaded config, and calls shown whole."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from dsh_agent_loop._agent.approvals import ApprovalRequest
from dsh_agent_loop._frozen import freeze
from dsh_agent_loop._permissions import PERMISSION_MODES, Permissions
from dsh_agent_loop.cli._app import build_parser
from dsh_agent_loop.cli._approvals import (
    MODES_TEXT,
    ResumeHint,
    call_text,
    pending_line,
    permission_mode,
    with_permission_mode,
)
from dsh_agent_loop.config import load_config

PLUGIN = "@deepseek-ai/dsh-agent-loop"
LONG = "echo " + " ".join(f"word{n}" for n in range(100)) + "; touch HIDDEN"
CONTROLS = "a\x1b[2Jb\x9bc\u202ed"


def _config(block: dict[str, object]) -> object:
    raw = {"plugins": [{"name": PLUGIN, "config": block}], "providers": {"p": {"kind": "scripted"}}}
    return load_config(raw)


def test_the_mode_replaces_every_policy_mode_and_keeps_the_rules() -> None:
    config = _config(
        {
            "permissions": {"mode": "ask", "allow": ["read_file"], "deny": ["run_command(rm *)"]},
            "agents": [
                {"id": "own", "provider": "p", "model": "m", "permissions": {"ask": ["x(*)"]}},
                {"id": "inherits", "provider": "p", "model": "m"},
            ],
            "subagents": [
                {"id": "helper", "provider": "p", "model": "m", "permissions": {"allow": ["y"]}},
                {"id": "plain", "provider": "p", "model": "m", "tool": "plain"},
            ],
        }
    )
    moded = with_permission_mode(config, "allow-all")  # type: ignore[arg-type]
    plugin = moded.plugin
    assert plugin.permissions == Permissions(
        mode="allow-all", allow=("read_file",), deny=("run_command(rm *)",)
    )
    own, inherits = plugin.agents
    assert own.permissions == Permissions(mode="allow-all", ask=("x(*)",))
    assert inherits.permissions is None  # it follows the runtime's policy, now allow-all
    helper, plain = plugin.subagents
    assert helper.permissions == Permissions(mode="allow-all", allow=("y",))
    assert plain.permissions is None
    assert (own.id, own.provider, helper.tool) == ("own", "p", "delegate")  # nothing else moved


def test_a_config_without_a_policy_gets_one_and_no_mode_changes_nothing() -> None:
    config = _config({"agents": [{"id": "a", "provider": "p", "model": "m"}]})
    assert with_permission_mode(config, None) is config  # type: ignore[arg-type]
    moded = with_permission_mode(config, "deny-asks")  # type: ignore[arg-type]
    assert moded.plugin.permissions == Permissions(mode="deny-asks")


def test_the_option_takes_each_mode_and_refuses_others_listing_them() -> None:
    for mode in PERMISSION_MODES:
        assert permission_mode(mode) == mode
        for verb in (["run", "c.yaml"], ["chat"], ["simulate", "--agents", "1"]):
            args = build_parser().parse_args([*verb, "--permission-mode", mode])
            assert args.permission_mode == mode
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        permission_mode("yolo")
    assert str(refused.value) == f"expected one of {MODES_TEXT}, got 'yolo'"
    assert MODES_TEXT == "ask, accept-edits, allow-all, deny-asks"


def _request(arguments: dict[str, object], name: str = "run_command") -> ApprovalRequest:
    return ApprovalRequest(call_id="c1", name=name, arguments=freeze(arguments), turn=1, step=1)


def test_the_question_shows_every_argument_whole_with_controls_visible() -> None:
    text = call_text("main.helper", _request({"command": LONG, "timeout_s": 5, "x\ny": CONTROLS}))
    lines = text.splitlines()
    assert lines[0] == "main.helper asks to run run_command:"
    assert lines[1] == f'  command: "{LONG}"'  # not cut, however long
    assert lines[2] == "  timeout_s: 5"
    # A key is quoted when it is not a plain name, so it cannot fake a line of its own.
    assert lines[3] == '  "x\\ny": "a\\u001b[2Jb\\u009bc\\u202ed"'
    assert len(lines) == 4
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", text)


def test_the_run_line_is_one_line_with_the_whole_call_and_the_command() -> None:
    request = _request({"command": LONG + "\n" + CONTROLS})
    how = ResumeHint(config="c.yaml", first_agent="main").how("main", "s1")
    line = pending_line("main", request, how)
    assert "\n" not in line
    assert line.startswith('main: run_command {"command": "echo word0 ')
    assert '; touch HIDDEN\\na\\u001b[2Jb\\u009bc\\u202ed"}' in line
    assert line.endswith(" is waiting for approval; decide with: dsh-agent chat c.yaml --resume s1")
    forgotten = ResumeHint(config="c.yaml", first_agent="main", forgets=True).how("main", "s1")
    assert forgotten.startswith("it is lost when run exits, as the memory: store keeps nothing")
    assert "dsh-agent chat" not in forgotten


def test_the_resume_hint_names_what_chat_needs_quoted_for_a_shell() -> None:
    plain = ResumeHint(config="run.yaml", first_agent="main")
    assert plain.command("main", "main-session-1") == (
        "dsh-agent chat run.yaml --resume main-session-1"
    )
    full = ResumeHint(
        config="my dir/run.yaml",
        first_agent="main",
        store="sqlite:///x.db",
        tools=("mytools:shout",),
        mode="accept-edits",
    )
    command = full.command("other", "other-session-2")
    assert shlex.split(command) == [
        "dsh-agent",
        "chat",
        "my dir/run.yaml",
        "--agent",
        "other",
        "--resume",
        "other-session-2",
        "--store",
        "sqlite:///x.db",
        "--tool",
        "mytools:shout",
        "--permission-mode",
        "accept-edits",
    ]
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.config_path, args.agent, args.resume) == (
        "my dir/run.yaml",
        "other",
        "other-session-2",
    )
