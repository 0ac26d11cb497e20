"""The `lore` MCP server: search a world's lore, read its persona cards, and read what an NPC
remembers of a player. Nothing here writes: not the world's files, not memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from pydantic import Field

from mythic.config import MythicSettings
from mythic.knowledge import Hit, Knowledge, Query, World
from mythic.mcp.servers._common import NPC_ID_PATTERN, READ_ONLY, ToolRefusedError, capped
from mythic.memory import (
    ColdStore,
    HistoryQuery,
    MemoryStoreError,
    Recall,
    SystemClock,
    WarmStore,
    open_cold,
    open_warm,
)

MAX_HITS = 20

NpcId = Annotated[str, Field(pattern=NPC_ID_PATTERN, description="An NPC's id (its card's name).")]
PlayerId = Annotated[
    str, Field(min_length=1, max_length=128, description="The player's id, as the game gave it.")
]


class _Stores:
    """The memory stores `recall` reads, opened at its first call and closed when the MCP
    server stops."""

    def __init__(self, settings: MythicSettings) -> None:
        self.settings = settings.memory
        self.warm: WarmStore | None = None
        self.cold: ColdStore | None = None

    def open(self) -> tuple[WarmStore, ColdStore] | None:
        """The stores; None when they are the embedded files and those do not exist yet (no
        NPC remembers anything, and reading must not create them)."""
        s = self.settings
        if not s.enabled:
            raise ToolRefusedError("memory is off in this configuration (memory.enabled: false)")
        embedded = [
            s.data_dir / name
            for name, url in (("warm.sqlite3", s.warm_url), ("archive.sqlite3", s.cold_url))
            if url is None
        ]
        if self.warm is None or self.cold is None:
            if not all(path.exists() for path in embedded):
                return None
            self.warm = open_warm(s, SystemClock())
            self.cold = open_cold(s.cold_url, s.data_dir / "archive.sqlite3")
        return self.warm, self.cold

    async def aclose(self) -> None:
        warm, cold, self.warm, self.cold = self.warm, self.cold, None, None
        if warm is not None:
            await warm.aclose()
        if cold is not None:
            await cold.aclose()


def _hit(hit: Hit) -> dict[str, Any]:
    c = hit.chunk
    return {
        "id": c.id,
        "title": c.title,
        "zone": c.zone,
        "source": c.source,
        "tags": list(c.tags),
        "score": round(hit.score, 4),
        "text": c.text,
    }


def lore_server(
    world: World, settings: MythicSettings, *, knowledge: Knowledge | None = None
) -> MCPServer[None]:
    """The `lore` server of `world`.

    Args:
        world: the loaded world.
        settings: retrieval (`knowledge`) and the memory stores `recall` reads (`memory`).
        knowledge: the world's indexes when already built (built here otherwise: seconds,
            the lore is embedded).
    """
    if knowledge is None:
        lore_settings = settings.knowledge.model_copy(update={"top_k": MAX_HITS, "watch": False})
        knowledge = Knowledge(world, lore_settings)
    known = knowledge
    stores = _Stores(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await stores.aclose()

    server: MCPServer[None] = MCPServer(
        "mythic-lore",
        instructions=(
            f"The lore, persona cards and NPC memories of the world {world.name!r}, read-only."
        ),
        lifespan=lifespan,
    )

    def persona(npc_id: str) -> dict[str, Any]:
        card = world.npcs.get(npc_id)
        if card is None:
            raise ToolRefusedError(
                f"no NPC {npc_id!r} in world {world.name!r}; known: {', '.join(sorted(world.npcs))}"
            )
        return {"npc_id": npc_id, **card.model_dump(mode="json", exclude_none=True)}

    def search(text: str, k: int, npc_id: str | None, zone: str | None) -> list[Hit]:
        query = Query(text)
        if npc_id is not None:
            return known.retrieve(npc_id, query, prefer_zone=zone)[:k]
        # The whole world: the best hits of every NPC's knowledge, each chunk once.
        best: dict[str, Hit] = {}
        for npc in sorted(world.npcs):
            for hit in known.retrieve(npc, query, prefer_zone=zone):
                seen = best.get(hit.chunk.id)
                if hit.chunk.source != "persona" and (seen is None or hit.score > seen.score):
                    best[hit.chunk.id] = hit
        return sorted(best.values(), key=lambda h: -h.score)[:k]

    @server.tool(annotations=READ_ONLY)
    async def search_lore(
        query: Annotated[str, Field(min_length=1, max_length=500, description="What to find.")],
        k: Annotated[int, Field(ge=1, le=MAX_HITS, description="How many passages.")] = 5,
        npc_id: Annotated[
            str | None,
            Field(
                pattern=NPC_ID_PATTERN,
                description="Search only what this NPC knows (its zones and faction); "
                "unset: the whole world.",
            ),
        ] = None,
        zone: Annotated[
            str | None, Field(max_length=64, description="A zone whose lore ranks higher.")
        ] = None,
    ) -> dict[str, Any]:
        """Search the world's lore (hybrid BM25 and embeddings, as NPCs' turns retrieve it):
        the best passages, with their source file and zone."""
        if npc_id is not None:
            persona(npc_id)
        if zone is not None and zone not in world.card.zones:
            raise ToolRefusedError(
                f"no zone {zone!r} in world {world.name!r}; "
                f"known: {', '.join(sorted(world.card.zones))}"
            )
        hits = await asyncio.to_thread(search, query, k, npc_id, zone)
        return capped({"query": query, "hits": [_hit(h) for h in hits]})

    @server.tool(annotations=READ_ONLY)
    async def list_npcs() -> dict[str, Any]:
        """Every NPC of the world: id, name, archetype, zone and faction."""
        return capped(
            {
                "world": world.name,
                "npcs": [
                    {
                        "npc_id": npc_id,
                        "name": p.name,
                        "archetype": p.archetype,
                        "zone": p.zone,
                        "faction": p.faction,
                    }
                    for npc_id, p in sorted(world.npcs.items())
                ],
            }
        )

    @server.tool(annotations=READ_ONLY)
    async def read_card(npc_id: NpcId) -> dict[str, Any]:
        """An NPC's persona card: who it is, how it talks, its rules and taboos."""
        return capped(persona(npc_id))

    @server.tool(annotations=READ_ONLY)
    async def recall(
        npc_id: NpcId,
        player_id: PlayerId,
        limit: Annotated[
            int, Field(ge=1, le=200, description="How many archived events, newest.")
        ] = 20,
    ) -> dict[str, Any]:
        """What an NPC remembers of a player: the warm tier (recent turns, session summaries,
        salient facts, relationship and quest cards) and the newest events of the archive."""
        persona(npc_id)
        opened = stores.open()
        found, events = Recall(), []
        if opened is not None:
            warm, cold = opened
            try:
                found = await warm.load((npc_id, player_id))
                events = await cold.history(
                    HistoryQuery(player_id=player_id, npc_id=npc_id, limit=limit)
                )
            except MemoryStoreError as exc:
                raise ToolRefusedError(f"memory cannot be read: {exc.message}") from exc
        return capped(
            {
                "npc_id": npc_id,
                "player_id": player_id,
                "relationship": found.relationship.model_dump() if found.relationship else None,
                "quest": found.quest.model_dump() if found.quest else None,
                "facts": [f.to_dict() for f in found.facts],
                "summaries": [{"text": s.text, "ts": s.ts} for s in found.summaries],
                "turns": [t.to_dict() for t in found.turns],
                "archive": [e.to_dict() for e in events[-limit:]],
            }
        )

    @server.resource(
        "lore://world", name="world", mime_type="application/json", description="world.yaml"
    )
    def world_card() -> str:
        return json.dumps(world.card.model_dump(mode="json", exclude_none=True))

    @server.resource(
        "lore://npcs/{npc_id}",
        name="persona card",
        mime_type="application/json",
        description="An NPC's persona card (npcs/<id>.yaml).",
    )
    def npc_card(npc_id: str) -> str:
        if npc_id not in world.npcs:
            raise ResourceNotFoundError(f"no NPC {npc_id!r} in world {world.name!r}")
        return json.dumps(persona(npc_id))

    return server
