"""The `game-state` MCP server: read-only snapshots of what a running Mythic server knows of its
world, its NPCs and their scenes, and its open group scenes; and one write that is never
applied: `propose_event` queues an event for the game to arbitrate (`/v1/proposals`)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from mythic.contracts import ID_PATTERN
from mythic.mcp.servers._common import NPC_ID_PATTERN, READ_ONLY, MythicAPI, capped

PROPOSE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
"""`propose_event`: it changes nothing itself, but the game may act on it, so a client should
ask its user before calling it."""

NpcId = Annotated[str, Field(pattern=NPC_ID_PATTERN, description="An NPC's id.")]


def game_state_server(url: str, *, timeout_s: float = 5.0) -> MCPServer[None]:
    """The `game-state` server of the Mythic server at `url` (`http://HOST:PORT`).

    Raises:
        ToolRefusedError: `url` is not an http(s) address.
    """
    api = MythicAPI(url, timeout_s=timeout_s)
    server: MCPServer[None] = MCPServer(
        "mythic-game-state",
        instructions=(
            "Read-only snapshots of a running Mythic world: its NPCs, their dialogue state and "
            "scene. propose_event only queues a proposal; the game decides."
        ),
    )

    @server.tool(annotations=READ_ONLY)
    async def world_state() -> dict[str, Any]:
        """The world in play: its name, NPCs, zones, indexed lore and reload state."""
        return capped(await api.call("GET", "/v1/world"))

    @server.tool(annotations=READ_ONLY)
    async def list_npcs() -> dict[str, Any]:
        """Every NPC with its dialogue state (idle, listening, thinking, speaking) and, for
        the active ones, sessions, scene and last intent."""
        return capped(await api.call("GET", "/v1/npcs"))

    @server.tool(annotations=READ_ONLY)
    async def npc_state(npc_id: NpcId) -> dict[str, Any]:
        """One NPC as the server knows it now: dialogue state, sessions, its scene (zone,
        time, game date, objects), what it remembers, its last intent and turn."""
        return capped(await api.call("GET", f"/v1/npcs/{npc_id}"))

    @server.tool(annotations=READ_ONLY)
    async def list_scenes() -> dict[str, Any]:
        """The open group scenes: their NPCs and players, who is speaking, their last lines
        and who heard each."""
        return capped(await api.call("GET", "/v1/scenes"))

    @server.tool(annotations=READ_ONLY)
    async def scene_state(
        scene_id: Annotated[str, Field(pattern=ID_PATTERN, description="A scene's id.")],
    ) -> dict[str, Any]:
        """One open group scene."""
        return capped(await api.call("GET", f"/v1/scenes/{scene_id}"))

    @server.tool(annotations=READ_ONLY)
    async def list_proposals(
        after: Annotated[int, Field(ge=0, description="Only proposals after this id.")] = 0,
        limit: Annotated[int, Field(ge=1, le=256)] = 50,
    ) -> dict[str, Any]:
        """Events proposed so far and waiting for the game, oldest first."""
        return capped(
            await api.call("GET", "/v1/proposals", params={"after": after, "limit": limit})
        )

    @server.tool(annotations=PROPOSE)
    async def propose_event(
        kind: Annotated[
            str,
            Field(
                pattern=r"^[a-z][a-z0-9_.-]{0,63}$",
                description="The sort of event in the game's words: spawn, quest.offer, ...",
            ),
        ],
        description: Annotated[
            str, Field(min_length=1, max_length=2000, description="What should happen.")
        ],
        npc_id: Annotated[
            str | None, Field(pattern=NPC_ID_PATTERN, description="The NPC it concerns.")
        ] = None,
        data: Annotated[
            dict[str, Any] | None, Field(description="The game's own fields (at most 4 KB).")
        ] = None,
    ) -> dict[str, Any]:
        """Propose an event to the game. Nothing is applied: the proposal is queued, and the
        game reads it and decides whether (and how) it happens."""
        body = {"kind": kind, "description": description, "npc_id": npc_id, "data": data or {}}
        return capped(await api.call("POST", "/v1/proposals", body=body))

    return server
