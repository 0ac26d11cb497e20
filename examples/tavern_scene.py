"""A tavern scene through a running Mythic server with the Python client SDK: the barkeep, a
guard and a vampire noble at one table, the player joining and leaving.

    make run        # in another terminal: serves the example world
    .venv/bin/python examples/tavern_scene.py ws://127.0.0.1:8765/v1/ws

The player's lines go to the scene: the NPC a line names answers it (the others hear it), a line
that names nobody goes to the NPC the player faces; the NPCs talk among themselves while the
player is away (an ambient exchange, below every player's line), and the player comes back.
"""

from __future__ import annotations

import asyncio
import sys

from mythic.client import MythicClient, SceneTalk
from mythic.contracts import SceneTurn

TAVERN = ["marla", "captain_strand", "countess_isolde"]


async def show(talk: SceneTalk) -> None:
    """Print each reply of the line as it streams, with who says it."""
    async for event in talk:
        if isinstance(event, SceneTurn) and event.speakers:
            print(f"  {', '.join(event.speakers)} ({event.chosen_by}): ", end="", flush=True)
        elif event.type == "LLMStreamDelta":
            print(event.delta, end="", flush=True)
            if event.final:
                print(f"   [{event.finish_reason}]")


async def main(url: str) -> None:
    async with MythicClient(url, player_id="tavern-guest") as client:
        # The player walks in: a scene of the three at the table.
        scene = await client.start_scene("tavern", TAVERN, max_exchanges=1)
        print(f"in the tavern: {', '.join(scene.npcs)}")
        for line, facing in (
            ("Captain Strand, when does the curfew begin?", None),
            ("What will you drink tonight?", "countess_isolde"),
        ):
            print(f"you> {line}")
            await show(await scene.say(line, to=facing))
        # The captain leaves on her rounds; the other two talk while the player is at the bar.
        await scene.leave("captain_strand")
        print(f"the captain leaves: {', '.join(scene.npcs)}")
        print("(the player steps away; the two talk among themselves)")
        await show(await scene.ambient(4, topic="the fog tonight", opener="marla"))
        # The captain comes back; the player asks after her, and leaves the tavern.
        await scene.join("captain_strand")
        print(f"the captain is back: {', '.join(scene.npcs)}")
        print("you> Marla, one more ale before I go.")
        await show(await scene.say("Marla, one more ale before I go."))
        await scene.end("the player left the tavern")
        print(f"scene over: {scene.ended}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1]))
