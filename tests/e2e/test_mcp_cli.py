"""`mythic mcp serve` as an MCP client runs it: a real process spoken to over stdio by the SDK's
stdio client (`utilities`, `lore`), over streamable HTTP (`--http`), and refusing a command
line that cannot work with a clear message."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.e2e

MYTHIC = str(Path(sys.executable).with_name("mythic"))


def text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def stdio(*args: str, cwd: Path) -> StdioServerParameters:
    return StdioServerParameters(command=MYTHIC, args=["mcp", "serve", *args], cwd=str(cwd))


async def test_utilities_over_stdio(tmp_path: Path) -> None:
    server = stdio("utilities", "--world", str(EXAMPLE_WORLD), cwd=tmp_path)
    async with asyncio.timeout(60), Client(server) as client:
        assert client.server_info is not None and client.server_info.name == "mythic-utilities"
        date = data(await client.call_tool("game_date", {"date": "612-11-3"}))
        assert date["said"].startswith("the 3rd of ") and "Drowning" in date["said"]
        bad = await client.call_tool("game_date", {"date": "612-11-99"})
        assert bad.is_error and "day 99" in text(bad)
        ids = data(await client.call_tool("new_ids", {"kind": "ulid", "count": 2}))["ids"]
        assert len(set(ids)) == 2  # the process survived the bad call
        sworn = data(await client.call_tool("check_content", {"text": "You fucking idiot."}))
        assert sworn["ok"] is False and sworn["category"] == "strong_profanity"


async def test_lore_over_stdio(tmp_path: Path) -> None:
    server = stdio("lore", "--world", str(EXAMPLE_WORLD), cwd=tmp_path)
    async with asyncio.timeout(240), Client(server, read_timeout_seconds=180) as client:
        found = data(await client.call_tool("search_lore", {"query": "the cathedral", "k": 2}))
        assert 0 < len(found["hits"]) <= 2
        card = data(await client.call_tool("read_card", {"npc_id": "marla"}))
        assert card["npc_id"] == "marla"
        unknown = await client.call_tool("recall", {"npc_id": "nobody", "player_id": "p1"})
        assert unknown.is_error and "no NPC 'nobody'" in text(unknown)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_utilities_over_streamable_http(tmp_path: Path) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        MYTHIC,
        *("mcp", "serve", "utilities", "--http", str(port)),
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            while True:
                assert proc.returncode is None, "mythic mcp serve --http stopped"
                try:
                    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.1)
                    continue
                writer.close()
                await writer.wait_closed()
                break
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                months = data(await client.call_tool("calendar_months", {}))
                assert months["months"][0]["name"] == "January"  # no world: Gregorian
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("lore",), "needs a world"),
        (("lore", "--world", "no-such-folder"), "not a folder"),
        (("game-state", "--server", "localhost:8765"), "expected http://HOST:PORT"),
        (("oracle",), "Invalid value"),
    ],
)
def test_a_command_line_that_cannot_work_says_why(
    no_config_env: Path, args: tuple[str, ...], says: str
) -> None:
    done = subprocess.run(
        [MYTHIC, "mcp", "serve", *args],
        cwd=no_config_env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert done.stdout == ""  # stdout is the protocol: nothing else goes there
