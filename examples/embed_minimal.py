"""The smallest useful embedding: one agent on a scripted model, its text streamed live.

``open_runtime`` owns every task it starts; ``agent.run_stream()`` queues a prompt and streams
the turn that answers it. Here we print text deltas as they arrive, then read the turn's
result (its text, never its reasoning), built from the stored log.

    python examples/embed_minimal.py
"""

import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, invariants, open_runtime


async def main() -> None:
    model = ScriptedModel(
        [
            Reply.text(
                "Hello! I am a scripted model, streaming one word at a time.",
                reasoning="Greet the user.",
            )
        ],
        latency=0.02,  # seconds before each chunk, like a real provider
    )
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="main", provider="scripted", model="demo")
        )
        agent = handle.agent
        streamed = []
        async with agent.run_stream("Say hello.") as stream:
            async for text in stream.text_deltas():
                streamed.append(text)
                print(text, end="", flush=True)
            result = await stream.result()  # the turn is stored when this returns
        print()

        assert result.text == "".join(streamed)
        assert result.reasoning == "Greet the user."
        events = agent.session.events
        assert invariants.check(events) == []
        print(f"{len(events)} events:", ", ".join(e.type for e in events))
        await handle.dispose()


if __name__ == "__main__":
    trio.run(main)
