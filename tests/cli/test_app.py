"""The argument parser: common options anywhere after the verb, before or after positionals."""

from __future__ import annotations

import pytest

from dsh_agent_loop.cli._app import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--store", "memory:", "--debug", "c.yaml", "--prompt", "p"],
        ["run", "c.yaml", "--prompt", "p", "--store", "memory:", "--debug"],
        ["--store", "memory:", "run", "c.yaml", "--debug", "--prompt", "p"],
        ["run", "--prompt", "p", "c.yaml", "--debug", "--store=memory:"],
    ],
)
def test_run_options_anywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    got = (args.config_path, args.prompt, args.store, args.debug)
    assert got == ("c.yaml", "p", "memory:", True)


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "--store", "memory:", "--config", "c.yaml", "show", "ID"],
        ["sessions", "show", "ID", "--store", "memory:", "--config", "c.yaml"],
        ["sessions", "show", "--store", "memory:", "ID", "--config", "c.yaml"],
        ["sessions", "--config", "c.yaml", "show", "--store", "memory:", "ID"],
    ],
)
def test_sessions_options_at_either_level(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.sessions_verb, args.session_id) == ("show", "ID")
    assert (args.store, args.config) == ("memory:", "c.yaml")
    assert not hasattr(args, "debug")  # not given: absent, never reset by a sub-parser default


def test_simulate_and_chat_options() -> None:
    sim = build_parser().parse_args(["simulate", "--latency-ms", "2.5", "--agents", "3", "--debug"])
    assert (sim.agents, sim.turns, sim.tools, sim.latency_ms, sim.seed) == (3, 1, 1, 2.5, 0)
    chat = build_parser().parse_args(["chat", "--agent", "a", "--store", "memory:"])
    assert (chat.config_path, chat.agent, chat.store) == (None, "a", "memory:")
    export = build_parser().parse_args(["sessions", "export", "-o", "out.jsonl", "ID"])
    assert (export.session_id, export.output) == ("ID", "out.jsonl")
