"""A fleet worker process for the cross-process tests: one runtime with ``fleet=FleetOptions``.

Usage::

    python worker_proc.py --store URL --id NAME [--latency S] [--max-agents N]
                          [--idle-unload S] [--lease S] [--drain-timeout S]
                          [--require-approval TOOL]

It runs ``open_runtime(store=URL, fleet=FleetOptions(...))`` with one provider, ``scripted``, a
``ScriptedModel`` (``loop=True``, ``latency`` seconds before every streamed word) whose reply
depends on the newest user message (docs/design.md#fleet-workers):

- ``fail ...``: the attempt fails ``AUTH`` (not retried): the turn ends ``error``;
- ``json {...}``: a ``final_result`` call with that JSON as its arguments (structured output);
- ``call ...``: a call of the tool ``act`` (or of TOOL, which waits for approval);
- ``slow N``: N words of text (N times the latency: a turn to kill or stop mid-way);
- anything else: ``echo <message>``; after a tool result: ``tool said <result>``.

Stdout, one flushed line each: the ``dsh_agent_loop.fleet`` logger's lines, ``READY <id>``
once the worker runs, ``RAN <tool> <call id>`` when a tool runs, ``EXIT`` after a clean stop.
SIGTERM or SIGINT leaves the runtime block: the worker drains (``drain_timeout_s``) and the
process exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Mapping
from typing import Any

import trio

from dsh_agent_loop import (
    FleetOptions,
    ModelRequest,
    Reply,
    ScriptedModel,
    ToolContext,
    open_runtime,
    tool,
)
from dsh_agent_loop.stores import store_from_url


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _Lines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        say(f"FLEET {record.levelname} {record.getMessage()}")


def _text_of(message: Any) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))


def make_reply(approval_tool: str | None) -> Any:
    """The scripted model's one (looping) entry: a reply chosen from the newest message."""
    tool_name = approval_tool or "act"

    def reply(request: ModelRequest) -> Reply:
        last = request.messages[-1]
        if last.get("role") == "tool":
            return Reply.text(f"tool said {_text_of(last)}")
        text = _text_of(last).strip()
        if text.startswith("fail"):
            return Reply.error("AUTH", "scripted failure")
        if text.startswith("json "):
            return Reply.tool_calls(("final_result", json.loads(text[5:])))
        if text.startswith("call"):
            return Reply.tool_calls((tool_name, {"what": text}), text="calling")
        if text.startswith("slow "):
            return Reply.text(" ".join(["slow"] * int(text.split()[1])))
        return Reply.text(f"echo {text}")

    return reply


def make_tools(approval_tool: str | None) -> list[Any]:
    async def run(what: str, ctx: ToolContext) -> str:
        """Do the thing asked."""
        say(f"RAN {ctx.call_id}")
        return f"did {what}"

    tools = {"act": tool(name="act")(run)}
    if approval_tool is not None:
        tools[approval_tool] = tool(name=approval_tool, requires_approval=True)(run)
    return list(tools.values())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--max-agents", type=int, default=10_000)
    parser.add_argument("--idle-unload", type=float, default=300.0)
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--require-approval", default=None)
    args = parser.parse_args()
    log = logging.getLogger("dsh_agent_loop.fleet")
    log.addHandler(_Lines())
    log.setLevel(logging.INFO)
    log.propagate = False
    model = ScriptedModel(
        [make_reply(args.require_approval)], loop=True, latency=args.latency, record=False
    )
    options = FleetOptions(
        worker_id=args.id,
        max_agents=args.max_agents,
        idle_unload_s=args.idle_unload,
        drain_timeout_s=args.drain_timeout,
        lease_s=args.lease,
    )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_runtime(
            store=store_from_url(args.store),
            providers={"scripted": model},
            tools=make_tools(args.require_approval),
            fleet=options,
        ):
            say(f"READY {args.id}")
            async for signum in signals:
                say(f"SIGNAL {signum}")
                break
    say("EXIT")


if __name__ == "__main__":
    trio.run(main)
