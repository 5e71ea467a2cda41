"""Permission rules and their evaluation (``_permission_rules.py``, ``_agent/_permissions.py``).

The table below is the contract: each row is a policy, a call, and what must happen to it
(run, ask or deny). The gate is the one ``ToolBatch`` uses, built on the real built-in tools, so
"built-in" means what it means for an agent.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop import Tool, tool
from dsh_agent_loop._agent._permissions import (
    MAX_POLICIES,
    CompiledPolicy,
    Gate,
    compiled,
)
from dsh_agent_loop._agent.services import Services
from dsh_agent_loop._permission_rules import (
    RuleError,
    command_forms,
    exact_rule,
    parse_rule,
    path_forms,
    rule_problem,
)
from dsh_agent_loop._permissions import Permissions
from dsh_agent_loop._tools.builtin import BUILTIN_TOOLS

CWD = "/work/proj"


@tool
async def fetch(url: str, retries: int = 0) -> str:
    """Fetch a URL."""
    return url


@tool(requires_approval=True)
async def delete(path: str) -> str:
    """Delete something."""
    return path


@tool(requires_approval=lambda args: args["path"].startswith("/etc"))
async def touch(path: str) -> str:
    """Touch a file."""
    return path


@tool(requires_approval=lambda args: 1 / 0)
async def fragile(path: str) -> str:
    """A predicate that raises."""
    return path


@tool(name="write_file")
async def own_write_file(path: str, text: str) -> str:
    """A tool of the user's own that happens to be called write_file."""
    return path


USER_TOOLS = {t.name: t for t in (fetch, delete, touch, fragile)}


def tool_named(name: str) -> Tool:
    return BUILTIN_TOOLS.get(name) or USER_TOOLS[name]


def verdict(
    permissions: Permissions | None,
    name: str,
    arguments: dict[str, Any],
    *,
    granted: tuple[str, ...] = (),
    require: frozenset[str] = frozenset(),
    cwd: str | None = CWD,
    the_tool: Tool | None = None,
) -> str:
    """``run``, ``ask`` or the denial text of one call under ``permissions``."""
    policy = CompiledPolicy(permissions or Permissions(), granted)
    gate = Gate(policy, require, BUILTIN_TOOLS.get, cwd)
    found = gate.check(the_tool or tool_named(name), arguments)
    if found is None:
        return "run"
    return found.text if found.denied else "ask"


def denied_by(rule: str) -> str:
    return f"Error: tool call denied by rule {rule!r}"


P = Permissions
ALL = P(mode="allow-all")
GIT_STATUS = P(allow=["run_command(git status*)"])
# (policy, tool, arguments, expected)
TABLE: list[tuple[Permissions | None, str, dict[str, Any], str]] = [
    # nothing configured: the built-in write, edit and command ask; reads and user tools run
    (None, "read_file", {"path": "a.txt"}, "run"),
    (None, "list_dir", {}, "run"),
    (None, "search_text", {"pattern": "x"}, "run"),
    (None, "write_file", {"path": "a.txt", "content": ""}, "ask"),
    (None, "edit_file", {"path": "a.txt", "old": "a", "new": "b"}, "ask"),
    (None, "run_command", {"command": "ls"}, "ask"),
    (None, "fetch", {"url": "https://x"}, "run"),
    (None, "delete", {"path": "a"}, "ask"),
    (None, "touch", {"path": "/etc/x"}, "ask"),
    (None, "touch", {"path": "/tmp/x"}, "run"),
    (None, "fragile", {"path": "a"}, "ask"),
    # command globs: on the command line
    (GIT_STATUS, "run_command", {"command": "git status -s"}, "run"),
    (GIT_STATUS, "run_command", {"command": "  git status  "}, "run"),
    (GIT_STATUS, "run_command", {"command": "git diff"}, "ask"),
    (P(allow=["run_command(git *)"]), "run_command", {"command": "git log a/b"}, "run"),
    # a wildcard allow rule must match every simple command of the line
    (GIT_STATUS, "run_command", {"command": "git status; rm -rf ~"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status && x"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status | sh"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status $(rm x)"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status `rm x`"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status\nrm x"}, "ask"),
    (GIT_STATUS, "run_command", {"command": "git status 2>&1"}, "run"),
    (GIT_STATUS, "run_command", {"command": "git status ';x'"}, "run"),
    (
        P(allow=["run_command(git *)", "run_command(make*)"]),
        "run_command",
        {"command": "git pull && make -j4"},
        "run",
    ),
    # a rule without wildcards names the exact line, operators included
    (P(allow=["run_command(cd a && make)"]), "run_command", {"command": "cd a && make"}, "run"),
    (P(allow=["run_command(cd a && make)"]), "run_command", {"command": "cd a && make x"}, "ask"),
    (P(allow=[r"run_command(echo \*)"]), "run_command", {"command": "echo *"}, "run"),
    (P(allow=[r"run_command(echo \*)"]), "run_command", {"command": "echo x"}, "ask"),
    # deny and ask rules: the whole line or any simple command
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "rm -rf /"}, denied_by("run_command(rm *)")),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "make && rm -rf build"}, denied_by("run_command(rm *)")),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "echo $(rm -rf ~)"}, denied_by("run_command(rm *)")),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "FOO=1 rm x"}, denied_by("run_command(rm *)")),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "if true; then rm x; fi"}, denied_by("run_command(rm *)")),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command", {"command": "ls"}, "run"),
    (P(mode="allow-all", deny=["run_command(rm *)"]), "run_command",
     {"command": "echo 'rm x; y'"}, "run"),
    (P(mode="allow-all", ask=["run_command(git push*)"]), "run_command",
     {"command": "git commit -m x && git push"}, "ask"),
    # path globs: relative to the cwd, normalised, ** spans directories, * does not
    (P(allow=["write_file(src/**)"]), "write_file", {"path": "src/a/b.py", "content": ""}, "run"),
    (P(allow=["write_file(src/**)"]), "write_file", {"path": "./x/../src/a.py", "content": ""},
     "run"),
    (P(allow=["write_file(src/**)"]), "write_file", {"path": f"{CWD}/src/a.py", "content": ""},
     "run"),
    (P(allow=["write_file(src/**)"]), "write_file", {"path": "docs/a.md", "content": ""}, "ask"),
    (P(allow=["write_file(src/**)"]), "write_file", {"path": "src/../../proj/x", "content": ""},
     "ask"),
    (P(allow=["write_file(*.md)"]), "write_file", {"path": "a.md", "content": ""}, "run"),
    (P(allow=["write_file(*.md)"]), "write_file", {"path": "d/a.md", "content": ""}, "ask"),
    (P(allow=["write_file(**/*.{md,txt})"]), "write_file", {"path": "d/a.txt", "content": ""},
     "run"),
    (P(allow=["read_file(./src/**)"]), "read_file", {"path": "src/x"}, "run"),
    # a path outside the cwd never matches an allow rule
    (P(allow=["write_file(**)"]), "write_file", {"path": "../other/a", "content": ""}, "ask"),
    (P(allow=["write_file(**)"]), "write_file", {"path": "/etc/passwd", "content": ""}, "ask"),
    (P(allow=["write_file(/etc/**)"]), "write_file", {"path": "/etc/passwd", "content": ""},
     "ask"),
    # deny a file anywhere below the cwd (dot files match), or an absolute pattern
    (P(mode="allow-all", deny=["read_file(**/.env)"]), "read_file", {"path": ".env"},
     denied_by("read_file(**/.env)")),
    (P(mode="allow-all", deny=["read_file(**/.env)"]), "read_file", {"path": "a/b/.env"},
     denied_by("read_file(**/.env)")),
    (P(mode="allow-all", deny=["read_file(**/.env)"]), "read_file", {"path": "a/.envrc"}, "run"),
    (P(mode="allow-all", deny=["read_file(/etc/**)"]), "read_file", {"path": "../../../etc/x"},
     denied_by("read_file(/etc/**)")),
    (P(mode="allow-all", deny=["list_dir(secret/**)"]), "list_dir", {"path": "secret/x"},
     denied_by("list_dir(secret/**)")),
    # other tools: KEY=GLOB on one argument's string form, or *
    (P(mode="allow-all", deny=["fetch(url=http://*)"]), "fetch", {"url": "http://a"},
     denied_by("fetch(url=http://*)")),
    (P(mode="allow-all", deny=["fetch(url=http://*)"]), "fetch", {"url": "https://a"}, "run"),
    (P(mode="allow-all", deny=["fetch(retries=[3-9])"]), "fetch", {"url": "u", "retries": 5},
     denied_by("fetch(retries=[3-9])")),
    (P(mode="allow-all", deny=["fetch(retries=*)"]), "fetch", {"url": "u"}, "run"),
    (P(mode="allow-all", deny=["fetch(*)"]), "fetch", {"url": "u"}, denied_by("fetch(*)")),
    (P(allow=["delete(path=tmp/*)"]), "delete", {"path": "tmp/x"}, "run"),
    (P(allow=["delete(path=tmp/*)"]), "delete", {"path": "home/x"}, "ask"),
    # a bare name matches every call; * every tool
    (P(allow=["run_command"]), "run_command", {"command": "a; b"}, "run"),
    (P(allow=["*"]), "write_file", {"path": "../x", "content": ""}, "run"),
    (P(mode="allow-all", deny=["*"]), "read_file", {"path": "a"}, denied_by("*")),
    (P(mode="allow-all", deny=["delete"]), "fetch", {"url": "u"}, "run"),
    # deny, then ask, then allow
    (P(deny=["run_command(rm *)"], allow=["run_command"]), "run_command", {"command": "rm x"},
     denied_by("run_command(rm *)")),
    (P(ask=["run_command(git push*)"], allow=["run_command(git *)"]), "run_command",
     {"command": "git push"}, "ask"),
    (P(ask=["fetch"], deny=["fetch"]), "fetch", {"url": "u"}, denied_by("fetch")),
    (P(mode="allow-all", ask=["fetch"]), "fetch", {"url": "u"}, "ask"),
]  # fmt: skip


@pytest.mark.parametrize(("permissions", "name", "arguments", "expected"), TABLE)
def test_rules_by_calls(
    permissions: Permissions | None, name: str, arguments: dict[str, Any], expected: str
) -> None:
    assert verdict(permissions, name, arguments) == expected


MODE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "a"}),
    ("write_file", {"path": "a", "content": ""}),
    ("write_file", {"path": "../a", "content": ""}),
    ("edit_file", {"path": "a", "old": "x", "new": "y"}),
    ("run_command", {"command": "ls"}),
    ("delete", {"path": "a"}),
    ("fetch", {"url": "u"}),
]
DENY_ASKS = "Error: tool call denied by permission mode 'deny-asks' (the call needs approval)"
MODES = {
    "ask": ["run", "ask", "ask", "ask", "ask", "ask", "run"],
    "accept-edits": ["run", "run", "ask", "run", "ask", "ask", "run"],
    "allow-all": ["run", "run", "run", "run", "run", "run", "run"],
    "deny-asks": ["run", DENY_ASKS, DENY_ASKS, DENY_ASKS, DENY_ASKS, DENY_ASKS, "run"],
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_default(mode: str) -> None:
    got = [verdict(Permissions(mode=mode), name, args) for name, args in MODE_CALLS]  # type: ignore[arg-type]
    assert got == MODES[mode]


def test_deny_asks_names_the_mode_and_the_rule_that_asks() -> None:
    policy = Permissions(mode="deny-asks", ask=["fetch(url=http:*)"])
    assert verdict(policy, "fetch", {"url": "http://a"}) == (
        "Error: tool call denied by permission mode 'deny-asks' "
        "(rule 'fetch(url=http:*)' asks for approval)"
    )
    allowed = Permissions(mode="deny-asks", allow=["run_command(make*)"])
    assert verdict(allowed, "run_command", {"command": "make test"}) == "run"
    assert verdict(allowed, "run_command", {"command": "make; curl x"}).startswith(
        "Error: tool call denied by permission mode 'deny-asks'"
    )


def test_no_policy_is_the_ask_mode_with_no_rules() -> None:
    for name, arguments in MODE_CALLS:
        assert verdict(None, name, arguments) == verdict(Permissions(), name, arguments)


def test_require_approval_asks_as_the_mode_default() -> None:
    need = frozenset({"fetch", "write_file"})
    assert verdict(None, "fetch", {"url": "u"}, require=need) == "ask"
    accept = Permissions(mode="accept-edits")
    assert verdict(accept, "write_file", {"path": "a", "content": ""}, require=need) == "ask"
    assert verdict(Permissions(allow=["fetch"]), "fetch", {"url": "u"}, require=need) == "run"
    assert verdict(ALL, "fetch", {"url": "u"}, require=need) == "run"


def test_a_user_tool_named_like_a_built_in_keeps_its_own_approval() -> None:
    call = {"path": "a", "text": ""}
    assert verdict(None, "write_file", call, the_tool=own_write_file) == "run"
    # rules still read its path argument as a file tool's
    deny = Permissions(deny=["write_file(a)"])
    assert verdict(deny, "write_file", call, the_tool=own_write_file) == denied_by("write_file(a)")


def test_granted_rules_allow_after_deny_and_ask() -> None:
    granted = ("run_command(git status)", "write_file(src/a.py)")
    assert verdict(None, "run_command", {"command": "git status"}, granted=granted) == "run"
    assert verdict(None, "run_command", {"command": "git status -s"}, granted=granted) == "ask"
    assert verdict(None, "write_file", {"path": "src/a.py", "content": ""}, granted=granted) == (
        "run"
    )
    deny = Permissions(deny=["run_command(git *)"])
    assert verdict(deny, "run_command", {"command": "git status"}, granted=granted) == denied_by(
        "run_command(git *)"
    )
    ask = Permissions(ask=["run_command"])
    assert verdict(ask, "run_command", {"command": "git status"}, granted=granted) == "ask"
    # a granted rule the log holds that does not parse grants nothing (and breaks nothing)
    assert verdict(None, "run_command", {"command": "ls"}, granted=("run_command(",)) == "ask"


def test_accept_edits_inside_the_cwd_is_lexical_and_needs_a_cwd_only_for_absolute_paths() -> None:
    accept = Permissions(mode="accept-edits")
    write = {"content": ""}
    assert verdict(accept, "write_file", {"path": "a/../b", **write}) == "run"
    assert verdict(accept, "write_file", {"path": "a/../../b", **write}) == "ask"
    assert verdict(accept, "write_file", {"path": "/work/proj2/b", **write}) == "ask"
    assert verdict(accept, "write_file", {"path": "b", **write}, cwd=None) == "run"
    assert verdict(accept, "write_file", {"path": "/b", **write}, cwd=None) == "ask"


# --- syntax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected a tool name"),
        ("run command", "expected a tool name"),
        ("run_command(", "ends with ')'"),
        ("run_command(ls", "ends with ')'"),
        ("run_command()", "pattern between the parentheses is empty"),
        ("*(x)", "'*' names every tool and takes no pattern"),
        ("fetch(https://x)", "KEY=GLOB"),
        ("fetch(=x)", "KEY=GLOB"),
        ("write_file({1..2000})", "does not compile"),
    ],
)
def test_rules_that_do_not_parse(text: str, problem: str) -> None:
    with pytest.raises(RuleError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(text)
    assert problem in (rule_problem(text) or "")


def test_rules_that_parse() -> None:
    assert parse_rule("read_file").kind == "any"
    assert parse_rule("*").tool == "*"
    assert parse_rule("fetch(*)").kind == "any"
    rule = parse_rule("run_command(echo (x))")
    assert (rule.kind, rule.pattern) == ("command", "echo (x)")
    rule = parse_rule("fetch( url = https://* )")
    assert (rule.kind, rule.key, rule.pattern) == ("argument", "url", " https://* ")
    assert parse_rule("mcp_github_create-issue(title=*bug*)").tool == "mcp_github_create-issue"
    assert rule_problem(5) == "5 is not a permission rule: a rule is a string, not int"


def test_the_record_refuses_a_rule_that_does_not_parse() -> None:
    with pytest.raises(ValueError, match=r"Permissions.deny\[1\]: 'run_command\(' is not"):
        Permissions(deny=["read_file", "run_command("])
    assert Permissions(allow="read_file").allow == ("read_file",)


def test_command_forms_split_at_operators_outside_quotes() -> None:
    cases = {
        "git status": ["git status"],
        "a; b && c || d | e & f": ["a", "b", "c", "d", "e", "f"],
        "echo 'a;b' \"c|d\"": ["echo 'a;b' \"c|d\""],
        "echo $(rm -rf /) `id`": ["echo", "rm -rf /", "id"],
        "echo '$(not run)'": ["echo '$(not run)'"],
        "make 2>&1 | tee log &>/dev/null": ["make 2>&1", "tee log &>/dev/null"],
        "find . -exec rm {} \\;": ["find . -exec rm {} \\;"],
        "(cd a; make)": ["cd a", "make"],
        "{ rm x; }": ["rm x"],
        "while true; do ls; done": ["true", "ls"],
    }
    for command, simple in cases.items():
        assert command_forms(command) == (command.strip(), simple), command


def test_path_forms() -> None:
    assert path_forms("read_file", {"path": "./a/../b"}, CWD) == (f"{CWD}/b", "b")
    assert path_forms("read_file", {"path": "."}, CWD) == (CWD, ".")
    assert path_forms("list_dir", {}, CWD) == (CWD, ".")
    assert path_forms("read_file", {"path": "../x"}, CWD) == ("/work/x", None)
    assert path_forms("read_file", {"path": "/work/project"}, CWD) == ("/work/project", None)
    assert path_forms("read_file", {"path": "x"}, "/") == ("/x", "x")
    assert path_forms("read_file", {"path": 5}, CWD) == ("", None)
    assert path_forms("read_file", {"path": "a\x00b"}, CWD) == ("", None)


# --- "always": the exact rule of one call ------------------------------------------------------


def test_exact_rules() -> None:
    assert exact_rule("run_command", {"command": " ls -l "}, CWD) == "run_command(ls -l)"
    assert exact_rule("run_command", {"command": "ls *.py"}, CWD) == r"run_command(ls \*.py)"
    assert exact_rule("write_file", {"path": "./src/../a[1].py"}, CWD) == r"write_file(a\[1].py)"
    assert exact_rule("write_file", {"path": "../a"}, CWD) is None
    assert exact_rule("run_command", {"command": "  "}, CWD) is None
    assert exact_rule("fetch", {"url": "u"}, CWD) == "fetch"


@given(st.text(min_size=1).filter(lambda c: c.strip() and "\x00" not in c))
def test_an_exact_command_rule_allows_that_command_and_no_other(command: str) -> None:
    rule = exact_rule("run_command", {"command": command}, CWD)
    assert rule is not None
    assert verdict(Permissions(allow=[rule]), "run_command", {"command": command}) == "run"
    other = command + "x"
    assert verdict(Permissions(allow=[rule]), "run_command", {"command": other}) == "ask"


@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_characters="/\x00"), min_size=1).filter(
            lambda p: p not in (".", "..")
        ),
        min_size=1,
        max_size=3,
    )
)
def test_an_exact_path_rule_allows_that_path_and_no_other(parts: list[str]) -> None:
    path = "/".join(parts)
    call = {"path": path, "content": ""}
    rule = exact_rule("write_file", call, CWD)
    assert rule is not None
    assert verdict(Permissions(allow=[rule]), "write_file", call) == "run"
    assert verdict(Permissions(allow=[rule]), "write_file", {**call, "path": path + "x"}) == "ask"


# --- the compiled-policy cache ----------------------------------------------------------------


def _services() -> Services:
    return Services(
        router=None,  # type: ignore[arg-type]
        hooks=None,  # type: ignore[arg-type]
        tools=dict,
        builtin=BUILTIN_TOOLS.get,
        max_parallel_tool_calls=lambda: 1,
        persona=lambda: None,
        turn_budget=lambda: None,
        clock=lambda: 0.0,
        rng=None,  # type: ignore[arg-type]
    )


def test_a_policy_is_compiled_once_and_the_cache_is_bounded() -> None:
    services = _services()
    policy = Permissions(allow=["run_command(git *)"])
    first = compiled(services, policy, ())
    assert compiled(services, Permissions(allow=["run_command(git *)"]), ()) is first
    assert compiled(services, policy, ("fetch",)) is not first
    assert compiled(services, None, ()) is compiled(services, None, ())
    for i in range(MAX_POLICIES + 10):
        compiled(services, Permissions(allow=[f"fetch(url={i})"]), ())
    assert len(services.permission_policies) == MAX_POLICIES
