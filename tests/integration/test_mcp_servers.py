"""Mythic's MCP servers on the real parts: `game-state` and `storyteller` against a real gateway
on loopback (the embedded model answering), and `lore` with the real embedding model and an
NPC's memory on the real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from mythic.client import MythicClient
from mythic.config import JobSettings, MemorySettings, MythicSettings
from mythic.engine import Engine
from mythic.jobs import JobQueue
from mythic.knowledge import load_world
from mythic.mcp.servers import game_state_server, lore_server, storyteller_server
from mythic.memory import Memory
from mythic.route import local_router
from mythic.server import Gateway, serving
from tests.conftest import EXAMPLE_WORLD
from tests.integration.services import REDIS_URL, postgres_dsn, redis_prefix

pytestmark = pytest.mark.integration

__all__ = ["postgres_dsn", "redis_prefix"]  # fixtures


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


@pytest.fixture
async def served(
    settings: MythicSettings, smollm: Engine, tmp_path: Path
) -> AsyncIterator[tuple[str, Gateway]]:
    """A real gateway on loopback with the small embedded model and a bronze job queue."""
    jobs = JobSettings(workers=1, poll_s=0.2, max_tokens=32)
    effective = settings.model_copy(
        update={
            "jobs": jobs,
            "memory": settings.memory.model_copy(update={"data_dir": tmp_path / "memory"}),
            "knowledge": settings.knowledge.model_copy(update={"watch": False}),
            "chat": settings.chat.model_copy(update={"max_tokens": 16, "temperature": 0.0}),
            "dialogue": settings.dialogue.model_copy(update={"decide": False}),
        }
    )
    queue = JobQueue(jobs, path=tmp_path / "jobs.sqlite3")
    gateway = Gateway(
        effective, load_world(EXAMPLE_WORLD), router=local_router(effective, smollm), jobs=queue
    )
    async with serving(gateway) as (host, port):
        yield f"http://{host}:{port}", gateway


async def test_game_state_reads_a_live_world_and_only_queues_proposals(
    served: tuple[str, Gateway],
) -> None:
    base, gateway = served
    async with asyncio.timeout(120), httpx.AsyncClient(timeout=60) as http:
        async with Client(game_state_server(base)) as client:
            world = data(await client.call_tool("world_state", {}))
            assert world["name"] == gateway.world.name and "marla" in world["npcs"]
            npcs = data(await client.call_tool("list_npcs", {}))["npcs"]
            assert {n["npc_id"] for n in npcs} == set(gateway.world.npcs)
            marla = data(await client.call_tool("npc_state", {"npc_id": "marla"}))
            assert marla == (await http.get(f"{base}/v1/npcs/marla")).json()
            assert marla["name"] == gateway.world.npcs["marla"].name
            unknown = await client.call_tool("npc_state", {"npc_id": "nobody"})
            assert unknown.is_error and "404" in text(unknown) and "nobody" in text(unknown)

            async with MythicClient(f"{base.replace('http', 'ws', 1)}/v1/ws") as game:
                await game.start_scene("booth", ["marla", "captain_strand"], max_exchanges=0)
                scenes = data(await client.call_tool("list_scenes", {}))["scenes"]
                assert [(s["scene_id"], s["npcs"]) for s in scenes] == [
                    ("booth", ["marla", "captain_strand"])
                ]
                booth = data(await client.call_tool("scene_state", {"scene_id": "booth"}))
                assert booth["sessions"] == [game.session_id] and booth["speaking"] is None
            gone = await client.call_tool("scene_state", {"scene_id": "attic"})
            assert gone.is_error and "no open scene 'attic'" in text(gone)

            before = (await http.get(f"{base}/v1/npcs/marla")).json()
            proposed = data(
                await client.call_tool(
                    "propose_event",
                    {
                        "kind": "quest.offer",
                        "description": "Marla asks the player to find the sunken bell.",
                        "npc_id": "marla",
                        "data": {"reward": 30},
                    },
                )
            )
            assert proposed["proposal_id"] == 1 and proposed["status"] == "proposed"
            wrong = await client.call_tool(
                "propose_event", {"kind": "spawn", "description": "a crow", "npc_id": "nobody"}
            )
            assert wrong.is_error and "no NPC 'nobody'" in text(wrong)
            listed = data(await client.call_tool("list_proposals", {}))
            assert [p["kind"] for p in listed["proposals"]] == ["quest.offer"]

        # The game reads the proposal; nothing about the NPC changed.
        game = (await http.get(f"{base}/v1/proposals", params={"after": 0})).json()
        assert game["last_id"] == 1 and game["proposals"][0]["data"] == {"reward": 30}
        assert (await http.get(f"{base}/v1/npcs/marla")).json() == before


async def test_storyteller_submits_and_reads_bronze_jobs(served: tuple[str, Gateway]) -> None:
    base, _gateway = served
    async with asyncio.timeout(120), Client(storyteller_server(base)) as client:
        job = {"kind": "lore", "payload": {"topic": "The Sunken Bell"}, "job_id": "mcp-bell"}
        first = data(await client.call_tool("submit_job", job))
        assert first["job_id"] == "mcp-bell" and first["created"] is True
        again = data(await client.call_tool("submit_job", job))
        assert again["created"] is False  # idempotent by job_id
        read = data(await client.call_tool("read_job", {"job_id": "mcp-bell"}))
        assert read["kind"] == "lore" and read["status"] in {"queued", "running", "done"}
        listed = data(await client.call_tool("list_jobs", {"limit": 5}))
        assert [j["job_id"] for j in listed["jobs"]] == ["mcp-bell"]

        bad = await client.call_tool("submit_job", {"kind": "quest", "payload": {"npc_id": "x"}})
        assert bad.is_error and "422" in text(bad) and "no NPC 'x'" in text(bad)
        missing = await client.call_tool("read_job", {"job_id": "never"})
        assert missing.is_error and "no job 'never'" in text(missing)


async def test_lore_searches_with_embeddings_and_recalls_from_redis_and_postgres(
    settings: MythicSettings, redis_prefix: str, postgres_dsn: str, tmp_path: Path
) -> None:
    memory_settings = MemorySettings(
        data_dir=tmp_path, warm_url=REDIS_URL, warm_prefix=redis_prefix, cold_url=postgres_dsn
    )
    effective = settings.model_copy(update={"memory": memory_settings})
    async with Memory(memory_settings) as memory:
        memory.record_turn("marla", "p-ada", "s1", "player", "My name is Ada, from the coast.")
        memory.record_turn("marla", "p-ada", "s1", "npc", "Welcome, Ada.")
        memory.set_card("marla", "p-ada", {"trust": 0.4}, name="relationship")
        await memory.settle()

    world = load_world(EXAMPLE_WORLD)
    async with asyncio.timeout(120), Client(lore_server(world, effective)) as client:
        found = data(await client.call_tool("search_lore", {"query": "a bell under water"}))
        assert found["hits"] and found["hits"][0]["score"] > 0
        recall = data(await client.call_tool("recall", {"npc_id": "marla", "player_id": "p-ada"}))
        assert [t["text"] for t in recall["turns"]] == [
            "My name is Ada, from the coast.",
            "Welcome, Ada.",
        ]
        assert recall["relationship"]["trust"] == pytest.approx(0.4)
        assert {e["text"] for e in recall["archive"]} >= {"Welcome, Ada."}
