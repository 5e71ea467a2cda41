"""The smallest useful embedding: one agent on a scripted model, its text streamed live.

``open_runtime`` owns every task it starts; ``agent.subscribe()`` yields a trio receive
channel of the agent's stream frames, committed events and notifications. Here we print
text deltas as they arrive and stop when the agent reports ``idle``.

    python examples/embed_minimal.py
"""

import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, invariants, open_runtime


async def main() -> None:
    model = ScriptedModel(
        [Reply.text("Hello! I am a scripted model, streaming one word at a time.")],
        latency=0.02,  # seconds before each chunk, like a real provider
    )
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="main", provider="scripted", model="demo")
        )
        agent = handle.agent
        streamed = []
        async with agent.subscribe(types=["agent/assistant-stream", "agent/status"]) as frames:
            agent.followup("Say hello.")
            async for event in frames:
                if event.type == "agent/status":
                    if event.data["status"] == "idle":
                        break
                elif event.data["frame"] == "chunk" and event.data["chunk"].type == "text-delta":
                    text = event.data["chunk"].text
                    streamed.append(text)
                    print(text, end="", flush=True)
        print()
        await agent.wait_idle()  # the turn is stored when this returns

        events = agent.session.events
        answer = agent.session.derive_messages()[-1]
        assert answer["role"] == "assistant"
        assert answer["content"][0]["text"] == "".join(streamed)
        assert invariants.check(events) == []
        print(f"{len(events)} events:", ", ".join(e.type for e in events))
        await handle.dispose()


if __name__ == "__main__":
    trio.run(main)
