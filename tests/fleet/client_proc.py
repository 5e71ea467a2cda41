"""A fleet client process for the soak test: sends messages to sessions, in order, and records it.

Usage::

    python client_proc.py --store URL --sessions FILE --count N --tag T --out FILE [--seed S]

Sends ``count`` messages, one after another, each to a session drawn (seeded) from the ids in
FILE, with message id ``<tag>-<i>``; after each ``send`` returns, appends ``<session> <id>`` to
the out file, so the file is the order in which the sends returned (docs/design.md#fleet-clients).
Prints ``HALF`` half-way and ``DONE`` at the end, one flushed line each.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import trio

from dsh_agent_loop import open_client


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--sessions", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sids = Path(args.sessions).read_text().split()  # noqa: ASYNC240  # once, before any task
    rng = random.Random(args.seed)
    async with open_client(args.store) as client:
        with Path(args.out).open("w") as out:  # noqa: ASYNC230  # a local file, line by line
            for i in range(args.count):
                sid = rng.choice(sids)
                mid = await client.send(sid, f"m {args.tag}-{i}", message_id=f"{args.tag}-{i}")
                out.write(f"{sid} {mid}\n")
                if i + 1 == args.count // 2:
                    out.flush()
                    say("HALF")
    say("DONE")


if __name__ == "__main__":
    trio.run(main)
