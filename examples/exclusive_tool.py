"""An exclusive tool between parallel tools: see the barrier in the session log.

The model asks for five calls in one step: two parallel lookups, an exclusive ``save_note``,
then two more lookups. The lookups before the barrier overlap; ``save_note`` waits for both,
runs alone, and holds back the lookups after it. Whatever order the handlers finish in,
``tool/result`` events are committed in model order.

Runs under trio's autojump ``MockClock``, so the sleeps below take no wall-clock time.

    python examples/exclusive_tool.py
"""

import trio
import trio.testing

from dsh_agent_loop import (
    AgentOptions,
    MemoryStore,
    Reply,
    ScriptedModel,
    invariants,
    open_runtime,
    tool,
)

timeline: list[tuple[float, str]] = []


def note(what: str) -> None:
    timeline.append((trio.current_time(), what))


@tool
async def lookup(city: str, seconds: float) -> str:
    """Look up the weather in a city (parallel: shares the step's pool)."""
    note(f"lookup({city}) starts")
    await trio.sleep(seconds)
    note(f"lookup({city}) ends")
    return f"sunny in {city}"


@tool(execution_mode="exclusive")
async def save_note(text: str) -> str:
    """Save a note (exclusive: runs alone, an ordering barrier)."""
    note("save_note starts")
    await trio.sleep(1.0)
    note("save_note ends")
    return f"saved {text!r}"


async def main() -> None:
    model = ScriptedModel(
        [
            Reply.tool_calls(
                ("lookup", {"city": "Paris", "seconds": 3.0}),
                ("lookup", {"city": "Rome", "seconds": 1.0}),
                ("save_note", {"text": "both looked up"}),
                ("lookup", {"city": "Oslo", "seconds": 2.0}),
                ("lookup", {"city": "Lima", "seconds": 0.5}),
            ),
            Reply.text("All done."),
        ]
    )
    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": model},
        tools=[lookup, save_note],
        max_parallel_tool_calls=4,
        clock=trio.current_time,
    ) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="main", provider="scripted", model="m")
        )
        agent = handle.agent
        agent.followup("Check the weather, then save a note.")
        await agent.wait_idle()
        events = agent.session.events

    print("handlers:")
    for at, what in timeline:
        print(f"  t={at:3.1f}s  {what}")

    calls = {e.data["call_id"]: e.data for e in events if e.type == "tool/call"}
    order = []
    print("log:")
    for event in events:
        if event.type == "tool/call":
            args = event.data["arguments"]
            print(f"  seq {event.seq:2}  tool/call    {event.data['name']:9} {args}")
            order.append(("call", event.data["call_id"]))
        elif event.type == "tool/result":
            call_id = event.data["message"]["call_id"]
            text = event.data["message"]["content"][0]["text"]
            print(f"  seq {event.seq:2}  tool/result  {calls[call_id]['name']:9} {text}")
            order.append(("result", call_id))

    # The barrier: both earlier lookups finished before save_note started, and save_note
    # finished before any later lookup started.
    seen = [what for _, what in timeline]
    assert seen.index("save_note starts") > seen.index("lookup(Paris) ends")
    assert seen.index("save_note starts") > seen.index("lookup(Rome) ends")
    assert seen.index("lookup(Oslo) starts") > seen.index("save_note ends")
    assert seen.index("lookup(Lima) starts") > seen.index("save_note ends")
    # Results are committed in model order, whatever order the handlers finished in.
    results = [call_id for kind, call_id in order if kind == "result"]
    assert results == list(calls), results
    assert invariants.check(events) == []
    print("ok: barrier respected, results in model order, log well formed")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
