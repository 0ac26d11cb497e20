"""Mythic as an MCP client against a real MCP server process (tests/mcp_servers/weather.py,
over stdio): calls, a crash and the reconnect, a server that speaks garbage; and an NPC of
the real server calling its tools in real turns with the real model, a write tool waiting for
the game's approval and refused when the game denies it."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mythic.client import MythicClient, ToolResult
from mythic.config import McpServerSettings, McpSettings, MythicSettings
from mythic.contracts import LLMStreamDelta, ToolCall
from mythic.dialogue._decision import Decision
from mythic.dialogue._events import PlayerLine
from mythic.engine import Engine
from mythic.mcp import McpClient, McpServerError, McpUnavailableError
from tests.integration.test_server import running

pytestmark = pytest.mark.integration

WEATHER = Path(__file__).parents[1] / "mcp_servers" / "weather.py"


@pytest.fixture
def engines(smollm: Engine, qwen: Engine) -> tuple[Engine, Engine]:
    """SmolLM2 talks; Qwen 0.5B decides intents and tools (as in test_server)."""
    return smollm, qwen


def weather_server(log: Path, *args: str) -> McpServerSettings:
    """The weather server as a process over stdio, logging the calls it receives to `log`."""
    return McpServerSettings(
        name="weather",
        command=sys.executable,
        args=[str(WEATHER), *args],
        env={"WEATHER_MCP_LOG": str(log)},
    )


def received(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
async def stdio(tmp_path: Path) -> AsyncIterator[tuple[McpClient, Path]]:
    log = tmp_path / "calls.jsonl"
    settings = McpSettings(
        servers=[weather_server(log)],
        npcs={"*": ["weather"]},
        call_timeout_s=10.0,
        connect_timeout_s=60.0,
        reconnect_s=0.05,
    )
    async with McpClient(settings) as client:
        yield client, log


async def test_a_tool_of_a_server_process_over_stdio(stdio: tuple[McpClient, Path]) -> None:
    client, log = stdio
    names = sorted(t.name for t in client.offered("marla"))
    assert "weather.forecast" in names and "weather.ring_bell" in names
    result = await client.call_checked("marla", "weather.forecast", {"place": "old_town"})
    assert result == {"place": "old_town", "forecast": "heavy rain until dusk"}
    outcome = await client.call("marla", "weather.forecast", {"place": {"$gt": ""}})
    assert outcome.status == "rejected"
    assert received(log) == [{"tool": "forecast", "args": {"place": "old_town"}}]


async def test_a_crashing_server_fails_the_call_and_is_connected_again(
    stdio: tuple[McpClient, Path],
) -> None:
    client, log = stdio
    with pytest.raises(McpServerError):
        await client.call_checked("marla", "weather.crash", {})
    async with asyncio.timeout(60):
        while client.connects("weather") < 2:  # noqa: ASYNC110 - the keeper's counter
            await asyncio.sleep(0.02)
    result = await client.call_checked("marla", "weather.roll_dice", {"sides": 6})
    assert result["sides"] == 6
    assert [c["tool"] for c in received(log)] == ["crash", "roll_dice"]


async def test_a_server_speaking_garbage_offers_no_tools(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    settings = McpSettings(
        servers=[weather_server(log, "--junk")],
        npcs={"*": ["weather"]},
        connect_timeout_s=3.0,
        reconnect_s=30.0,
    )
    client = McpClient(settings)
    runner = asyncio.create_task(client.run())
    try:
        assert not await client.wait_connected(3.0)
        assert client.offered("marla") == []
        with pytest.raises(McpUnavailableError):
            await client.call_checked("marla", "weather.forecast", {"place": "docks"})
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner


def _mcp(log: Path, allowed: list[str]) -> dict[str, Any]:
    return {
        "servers": [weather_server(log)],
        "npcs": {"marla": allowed},
        "call_timeout_s": 10.0,
        "connect_timeout_s": 60.0,
    }


_DIALOGUE = {"decider": "model", "tool_timeout_s": 10.0, "max_concurrent_speakers": 4}
_CHAT = {"max_tokens": 40, "temperature": 0.0}


async def _last_turn(address: str, npc_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        response = await http.get(f"/v1/npcs/{npc_id}")
        response.raise_for_status()
        turn: dict[str, Any] = response.json()["last_turn"]
        return turn


async def test_an_npc_calls_a_read_tool_of_an_mcp_server_process_in_a_turn(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    mcp = _mcp(log, ["weather.forecast"])
    async with running(engines, settings, chat=_CHAT, dialogue=_DIALOGUE, mcp=mcp) as served:
        address, gateway = served
        assert gateway.mcp is not None and await gateway.mcp.wait_connected(60)
        calls: list[ToolCall] = []

        async def game(call: ToolCall) -> ToolResult:
            calls.append(call)
            return "ok", None

        async with MythicClient(f"ws://{address}/v1/ws", tool_handler=game) as client:
            await client.scene("marla", zone="old_town", time="09:00")
            async with asyncio.timeout(180):
                turn = await client.say("marla", "What is the weather forecast for old_town?")
                events = [event async for event in turn]
        last = await _last_turn(address, "marla")
    assert [c["name"] for c in last["tool_calls"]] == ["weather.forecast"], turn.text
    assert last["tool_calls"][0]["status"] == "ok"
    assert [c["tool"] for c in received(log)] == ["forecast"]
    assert calls == []  # a read tool needs no approval: the game is not asked
    finals = [e.finish_reason for e in events if isinstance(e, LLMStreamDelta) and e.final]
    assert finals[0] == "tool_call" and len(finals) == 2
    assert gateway.cast.stats.tool_calls["mcp_ok"] == 1


async def test_a_write_tool_waits_for_the_games_approval_and_is_refused_when_denied(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    mcp = _mcp(log, ["weather.ring_bell"])
    async with running(engines, settings, chat=_CHAT, dialogue=_DIALOGUE, mcp=mcp) as served:
        address, gateway = served
        assert gateway.mcp is not None and await gateway.mcp.wait_connected(60)
        asked: list[ToolCall] = []

        async def game(call: ToolCall) -> ToolResult:
            asked.append(call)
            return "rejected", None

        async with MythicClient(f"ws://{address}/v1/ws", tool_handler=game) as client:
            await client.scene("marla", zone="old_town", time="09:00")
            async with asyncio.timeout(180):
                turn = await client.say("marla", "Please ring the town bell three times!")
                events = [event async for event in turn]
        last = await _last_turn(address, "marla")
    assert [(c.name, c.needs_approval) for c in asked] == [("weather.ring_bell", True)], turn.text
    assert last["tool_calls"][0]["status"] == "rejected"
    assert received(log) == []  # denied: the MCP server never saw the call
    voiced = "".join(
        e.delta for e in events[events.index(asked[0]) :] if isinstance(e, LLMStreamDelta)
    )
    assert voiced == "No, I can't do that right now."
    assert gateway.cast.stats.tool_calls["approval_rejected"] == 1


async def test_a_hanging_mcp_server_times_out_in_a_turn_and_the_npc_answers_without_it(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    """The decision is fixed to the hanging tool (what the model picks is the tests above'):
    the call times out, the NPC still answers, the breaker opens and the next turn's call is
    refused at once; every turn ends with its final delta."""
    log = tmp_path / "calls.jsonl"
    mcp = {**_mcp(log, ["weather"]), "call_timeout_s": 0.5, "breaker_failures": 1}
    async with running(engines, settings, chat=_CHAT, dialogue=_DIALOGUE, mcp=mcp) as served:
        address, gateway = served
        assert gateway.mcp is not None and await gateway.mcp.wait_connected(60)
        actor = gateway.cast.actor("marla")

        async def hang(line: PlayerLine) -> Decision | None:
            del line
            return Decision("hint", ("weather.hang", {}))

        actor.decider.decide = hang  # type: ignore[method-assign]
        statuses: list[str] = []
        async with MythicClient(f"ws://{address}/v1/ws") as client:
            for text in ["Ask the oracle for me.", "Ask the oracle again."]:
                async with asyncio.timeout(180):
                    turn = await client.say("marla", text)
                    events = [event async for event in turn]
                finals = [e for e in events if isinstance(e, LLMStreamDelta) and e.final]
                assert finals[0].finish_reason == "tool_call"
                assert finals[-1].finish_reason in ("stop", "length")
                statuses.append((await _last_turn(address, "marla"))["tool_calls"][0]["status"])
        assert gateway.mcp.breaker("weather").opens == 1
    assert statuses == ["timeout", "error"]
    assert [c["tool"] for c in received(log)] == ["hang"]  # the second never left


async def test_a_configured_approver_denies_or_allows_write_tools_without_asking_the_game(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    mcp = {**_mcp(log, ["weather"]), "approver": "deny"}
    async with running(engines, settings, chat=_CHAT, dialogue=_DIALOGUE, mcp=mcp) as served:
        address, gateway = served
        assert gateway.mcp is not None and await gateway.mcp.wait_connected(60)

        async def ring(line: PlayerLine) -> Decision | None:
            del line
            return Decision("hint", ("weather.ring_bell", {"times": 2}))

        gateway.cast.actor("marla").decider.decide = ring  # type: ignore[method-assign]
        asked: list[ToolCall] = []

        async def game(call: ToolCall) -> ToolResult:
            asked.append(call)
            return "ok", None

        statuses: list[str] = []
        async with MythicClient(f"ws://{address}/v1/ws", tool_handler=game) as client:
            for approver in ["deny", "allow"]:
                gateway.settings.mcp.approver = approver  # type: ignore[assignment]
                async with asyncio.timeout(180):
                    turn = await client.say("marla", "Ring the bell twice.")
                    _ = [event async for event in turn]
                statuses.append((await _last_turn(address, "marla"))["tool_calls"][0]["status"])
    assert statuses == ["rejected", "ok"]
    assert asked == []
    assert received(log) == [{"tool": "ring_bell", "args": {"times": 2}}]
