"""Talk to an NPC through a running Mythic server with the Python client SDK.

    make run        # in another terminal: serves the example world
    .venv/bin/python examples/talk_to_npc.py ws://127.0.0.1:8765/v1/ws marla "Where is the marsh?"

Streams the reply as it is generated, and plays the game's side of tool calls: it prints each
`ToolCall` and acknowledges it, so the NPC can voice the result.
"""

from __future__ import annotations

import asyncio
import json
import sys

from mythic.client import MythicClient, ToolResult
from mythic.contracts import Error, IntentUpdate, LLMStreamDelta, ToolCall


async def game_tool(call: ToolCall) -> ToolResult:
    """The game executes the tool (here: prints it) and reports the result."""
    print(f"\n  <game> {call.name} {json.dumps(call.args)}", flush=True)
    return "ok", {"done": True}


async def main(url: str, npc_id: str, lines: list[str]) -> None:
    async with MythicClient(url, tool_handler=game_tool) as client:
        await client.scene(npc_id, time="21:10", objects={"player": 1.5})
        for line in lines:
            print(f"you> {line}")
            print(f"{npc_id}: ", end="", flush=True)
            turn = await client.say(npc_id, line)
            async for event in turn:
                if isinstance(event, LLMStreamDelta):
                    print(event.delta, end="", flush=True)
                elif isinstance(event, Error):
                    print(f"\n  <error> {event.code}: {event.message}", flush=True)
            print(f"   [{turn.finish_reason}]")
        while not client.events.empty():
            event = client.events.get_nowait()
            if isinstance(event, IntentUpdate):
                print(f"  <intent> {npc_id} {event.intent} (target {event.target})")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
