"""Mythic's MCP servers through the SDK's in-memory client: their tools and schemas, read-only
hints, typed refusals for bad arguments and unknown NPCs, capped results, and the proposal
queue that `propose_event` feeds."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.types import CallToolResult, TextContent, TextResourceContents

from mythic.config import KnowledgeSettings, MemorySettings, MythicSettings
from mythic.knowledge import Knowledge, Query, load_world
from mythic.mcp.servers import (
    MAX_RESULT_CHARS,
    MythicAPI,
    ServerUnreachableError,
    ToolRefusedError,
    capped,
    game_state_server,
    lore_server,
    storyteller_server,
    ulid,
    utilities_server,
)
from mythic.memory import Memory
from mythic.server._proposals import EventProposal, ProposalQueue
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.unit


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def resource(client: Client, uri: str) -> dict[str, Any]:
    """A JSON resource, read."""
    contents = (await client.read_resource(uri)).contents
    assert len(contents) == 1 and isinstance(contents[0], TextResourceContents)
    found: dict[str, Any] = json.loads(contents[0].text)
    return found


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def world_settings(tmp_path_factory: pytest.TempPathFactory) -> MythicSettings:
    data_dir = tmp_path_factory.mktemp("memory")
    return MythicSettings(
        knowledge=KnowledgeSettings(retrieval="bm25", watch=False),
        memory=MemorySettings(data_dir=data_dir),
    )


@pytest.fixture(scope="module")
def lore_knowledge(world_settings: MythicSettings) -> Knowledge:
    lore = world_settings.knowledge.model_copy(update={"top_k": 20})
    return Knowledge(load_world(EXAMPLE_WORLD), lore)


async def test_utilities_tell_the_game_calendar_and_make_ids() -> None:
    world = load_world(EXAMPLE_WORLD)
    async with Client(utilities_server(world)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"now", "game_date", "calendar_months", "new_ids"} <= set(tools)
        assert tools["game_date"].annotations is not None
        assert tools["game_date"].annotations.read_only_hint is True
        assert tools["new_ids"].input_schema["properties"]["count"]["maximum"] == 100

        date = data(await client.call_tool("game_date", {"date": "612-11-3", "today": "612-11-4"}))
        assert date["said"] == world.card.calendar.say(date["minutes"])
        assert "Drowning" in date["said"] and date["ago"] == "yesterday"
        months = data(await client.call_tool("calendar_months", {}))
        assert months["months"][0]["name"] == "Deepwinter"
        assert "T" in data(await client.call_tool("now", {}))["utc"]

        ids = data(await client.call_tool("new_ids", {"kind": "ulid", "count": 3}))["ids"]
        assert len(set(ids)) == 3 and all(len(i) == 26 for i in ids)
        uuids = data(await client.call_tool("new_ids", {}))["ids"]
        assert len(uuids) == 1 and len(uuids[0]) == 36

        # Bad arguments: an isError result that says why, and the server goes on.
        bad_month = await client.call_tool("game_date", {"date": "612-99-1"})
        assert bad_month.is_error and "month 99" in text(bad_month)
        bad_shape = await client.call_tool("game_date", {"date": "yesterday"})
        assert bad_shape.is_error and "date" in text(bad_shape)
        too_many = await client.call_tool("new_ids", {"count": 10_000})
        assert too_many.is_error and "count" in text(too_many)
        assert not (await client.call_tool("now", {})).is_error


async def test_utilities_filter_content_with_the_worlds_policy() -> None:
    async with Client(utilities_server(load_world(EXAMPLE_WORLD))) as client:
        tool = next(t for t in (await client.list_tools()).tools if t.name == "check_content")
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        clean = data(await client.call_tool("check_content", {"text": "The fog is thick."}))
        assert clean["ok"] is True and clean["rating"] == "teen"
        sworn = data(await client.call_tool("check_content", {"text": "You fucking idiot."}))
        assert sworn["ok"] is False and sworn["category"] == "strong_profanity"
        line = {"text": "Mail me at ada@example.com", "where": "player"}
        player = data(await client.call_tool("check_content", line))
        assert player["ok"] and player["redacted"] == 1 and "ada@" not in player["text"]
        marla = data(await client.call_tool("check_content", {"text": "hi", "npc_id": "marla"}))
        assert marla["ok"] is True
        unknown = await client.call_tool("check_content", {"text": "hi", "npc_id": "nobody"})
        assert unknown.is_error and "no NPC 'nobody'" in text(unknown)
        bad_where = await client.call_tool("check_content", {"text": "hi", "where": "narrator"})
        assert bad_where.is_error and "where" in text(bad_where)


def test_ulids_sort_by_time_and_use_crockford_base32() -> None:
    first, later = ulid(1_000), ulid(2_000)
    assert first < later and len(first) == 26
    assert set(first + later) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def test_results_are_capped() -> None:
    big = {"hits": [{"text": "x" * 10_000} for _ in range(50)], "query": "q"}
    fitted = capped(big)
    assert len(json.dumps(fitted)) <= MAX_RESULT_CHARS
    assert fitted["truncated"] is True and fitted["query"] == "q"
    assert 0 < len(fitted["hits"]) < 50 and fitted["hits"][0]["text"].endswith("[...]")
    small = {"hits": [1, 2]}
    assert capped(small) == small


async def test_lore_searches_the_world_and_reads_cards(
    world_settings: MythicSettings, lore_knowledge: Knowledge
) -> None:
    world = lore_knowledge.world
    server = lore_server(world, world_settings, knowledge=lore_knowledge)
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"search_lore", "list_npcs", "read_card", "recall"}
        assert all(t.annotations and t.annotations.read_only_hint for t in tools.values())
        assert tools["search_lore"].input_schema["required"] == ["query"]

        npcs = data(await client.call_tool("list_npcs", {}))["npcs"]
        assert {n["npc_id"] for n in npcs} == set(world.npcs)

        found = data(await client.call_tool("search_lore", {"query": "bell", "k": 3}))
        assert 0 < len(found["hits"]) <= 3
        assert all("bell" in h["text"].lower() for h in found["hits"])
        npc_id = next(iter(sorted(world.npcs)))
        theirs = data(
            await client.call_tool("search_lore", {"query": "bell", "k": 20, "npc_id": npc_id})
        )
        known = {h.chunk.id for h in lore_knowledge.retrieve(npc_id, Query("bell"))}
        assert {h["id"] for h in theirs["hits"]} <= known

        card = data(await client.call_tool("read_card", {"npc_id": npc_id}))
        assert card["name"] == world.npcs[npc_id].name
        assert (await resource(client, f"lore://npcs/{npc_id}"))["name"] == card["name"]
        assert (await resource(client, "lore://world"))["name"] == world.name
        with pytest.raises(MCPError, match="no NPC 'nobody'"):
            await client.read_resource("lore://npcs/nobody")

        unknown = await client.call_tool("read_card", {"npc_id": "nobody"})
        assert unknown.is_error and "no NPC 'nobody'" in text(unknown)
        bad_id = await client.call_tool("read_card", {"npc_id": "Not An Id!"})
        assert bad_id.is_error and "npc_id" in text(bad_id)
        empty = await client.call_tool("search_lore", {"query": ""})
        assert empty.is_error and "query" in text(empty)
        no_zone = await client.call_tool("search_lore", {"query": "bell", "zone": "atlantis"})
        assert no_zone.is_error and "no zone 'atlantis'" in text(no_zone)
        assert not (await client.call_tool("list_npcs", {})).is_error


async def test_lore_recalls_memory_from_the_embedded_stores(
    world_settings: MythicSettings, lore_knowledge: Knowledge
) -> None:
    world = lore_knowledge.world
    npc_id = next(iter(sorted(world.npcs)))
    async with Memory(world_settings.memory) as memory:
        memory.record_turn(npc_id, "p-ada", "s1", "player", "I lost my lantern by the docks.")
        memory.record_turn(npc_id, "p-ada", "s1", "npc", "Then walk carefully, stranger.")
        await memory.settle()
    server = lore_server(world, world_settings, knowledge=lore_knowledge)
    async with Client(server) as client:
        found = data(await client.call_tool("recall", {"npc_id": npc_id, "player_id": "p-ada"}))
        assert [t["text"] for t in found["turns"]][-2:] == [
            "I lost my lantern by the docks.",
            "Then walk carefully, stranger.",
        ]
        assert len(found["archive"]) == 2
        nothing = data(await client.call_tool("recall", {"npc_id": npc_id, "player_id": "p-x"}))
        assert nothing["turns"] == [] and nothing["archive"] == []
        unknown = await client.call_tool("recall", {"npc_id": "nobody", "player_id": "p-ada"})
        assert unknown.is_error and "no NPC" in text(unknown)


async def test_a_mythic_server_that_is_not_there_is_a_clear_tool_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for server, tool, args in (
        (game_state_server(url), "list_npcs", {}),
        (game_state_server(url), "propose_event", {"kind": "spawn", "description": "a crow"}),
        (storyteller_server(url), "list_jobs", {}),
    ):
        async with Client(server) as client:
            result = await client.call_tool(tool, args)
            assert result.is_error and "cannot be reached" in text(result)
            assert (await client.list_tools()).tools  # still serving


async def test_game_state_marks_its_one_write_and_storyteller_validates_kinds() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    async with Client(game_state_server(url)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        propose = tools["propose_event"].annotations
        assert propose is not None and propose.read_only_hint is False
        assert propose.destructive_hint is True
        reads = [t for name, t in tools.items() if name != "propose_event"]
        assert all(t.annotations and t.annotations.read_only_hint for t in reads)
        bad = await client.call_tool("propose_event", {"kind": "Spawn Now", "description": "x"})
        assert bad.is_error and "kind" in text(bad)
    async with Client(storyteller_server(url)) as client:
        bad_kind = await client.call_tool("submit_job", {"kind": "poem"})
        assert bad_kind.is_error and "kind" in text(bad_kind)


def test_mythic_api_wants_an_http_address() -> None:
    with pytest.raises(ToolRefusedError, match="expected http"):
        MythicAPI("localhost:8765")
    assert ServerUnreachableError.retryable and not ToolRefusedError.retryable


def test_the_proposal_queue_is_bounded_and_read_by_cursor() -> None:
    queue = ProposalQueue(capacity=3)
    for n in range(5):
        queue.add(EventProposal(kind="spawn", description=f"crow {n}"))
    assert queue.dropped == 2 and queue.last_id == 5
    assert [p["proposal_id"] for p in queue.since(0, 10)] == [3, 4, 5]
    assert [p["description"] for p in queue.since(4, 10)] == ["crow 4"]
    assert queue.since(0, 1)[0]["status"] == "proposed"
    with pytest.raises(ValueError, match="4096 bytes"):
        EventProposal(kind="spawn", description="x", data={"blob": "y" * 5000})


async def test_recall_creates_no_store_where_nothing_is_remembered(
    tmp_path: Path, lore_knowledge: Knowledge
) -> None:
    fresh = MythicSettings(memory=MemorySettings(data_dir=tmp_path / "memory"))
    server = lore_server(lore_knowledge.world, fresh, knowledge=lore_knowledge)
    async with Client(server) as client:
        found = data(await client.call_tool("recall", {"npc_id": "marla", "player_id": "p-1"}))
        assert found["turns"] == [] and found["relationship"] is None
    assert not (tmp_path / "memory").exists()  # read-only: nothing written, not even a file
