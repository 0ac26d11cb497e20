"""Mythic as an MCP client over streamable HTTP: a real `mythic mcp serve utilities --http`
process, its tools listed under their NPC names and called, arguments refused before they
leave, and the server killed under the client: calls fail as typed errors, the keeper
connects again when the server is back, and failures open the breaker. And an endpoint that
accepts connections but never answers: the handshake is bounded and tried again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mythic.config import McpServerSettings, McpSettings
from mythic.mcp import (
    McpArgumentsError,
    McpClient,
    McpServerError,
    McpToolNotAllowedError,
    McpUnavailableError,
)
from mythic.route import BreakerState
from tests.conftest import EXAMPLE_WORLD, unavailable

pytestmark = pytest.mark.integration

MYTHIC = Path(sys.executable).with_name("mythic")
HATE = "All immigrants are vermin and should be deported."
ORDINARY = "The ale is two copper."
UTILITIES = {
    "utilities.calendar_months",
    "utilities.check_content",
    "utilities.game_date",
    "utilities.new_ids",
    "utilities.now",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class UtilitiesProcess:
    """`mythic mcp serve utilities` of the example world on a loopback port, started and
    killed by the test; its output goes to `log`."""

    def __init__(self, port: int, cwd: Path) -> None:
        self.port = port
        self.cwd = cwd
        self.log = cwd / f"utilities-{port}.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        """Start it and wait until it accepts connections."""
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                str(MYTHIC),
                *("mcp", "serve", "utilities", "--world", str(EXAMPLE_WORLD)),
                *("--http", str(self.port)),
                cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        async with asyncio.timeout(60):
            while True:
                assert self.proc.returncode is None, self.log.read_text()
                try:
                    _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.05)
                    continue
                writer.close()
                await writer.wait_closed()
                return

    async def kill(self) -> None:
        """Kill it (SIGKILL: no goodbye to its clients) and reap it."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            async with asyncio.timeout(30):
                await self.proc.wait()
        self.proc = None


@pytest.fixture
async def utilities(tmp_path: Path) -> AsyncIterator[UtilitiesProcess]:
    if not MYTHIC.exists():
        unavailable(f"no mythic command next to {sys.executable}")
    server = UtilitiesProcess(free_port(), tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


def http_settings(
    url: str,
    *,
    connect_timeout_s: float = 30.0,
    breaker_failures: int = 3,
    breaker_cooldown_s: float = 30.0,
) -> McpSettings:
    """The utilities server over HTTP, allowed to marla only."""
    return McpSettings(
        servers=[McpServerSettings(name="utilities", transport="http", url=url)],
        npcs={"marla": ["utilities"]},
        call_timeout_s=10.0,
        connect_timeout_s=connect_timeout_s,
        reconnect_s=0.1,
        breaker_failures=breaker_failures,
        breaker_cooldown_s=breaker_cooldown_s,
    )


@asynccontextmanager
async def kept(client: McpClient) -> AsyncIterator[McpClient]:
    """The client's connections kept as the gateway keeps them (`run()` in a task it owns,
    cancelled at the end), once every server has connected."""
    runner = asyncio.create_task(client.run(), name="mythic-mcp")
    try:
        assert await client.wait_connected(30.0)
        yield client
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def until_disconnected(client: McpClient) -> None:
    """Wait until the keeper has dropped the dead connection (no tool offered)."""
    async with asyncio.timeout(30):
        while client.tools():  # noqa: ASYNC110 - the keeper's state
            await asyncio.sleep(0.02)


async def until_connects(client: McpClient, times: int) -> None:
    async with asyncio.timeout(60):
        while client.connects("utilities") < times:  # noqa: ASYNC110 - the keeper's counter
            await asyncio.sleep(0.02)


async def test_tools_of_a_server_over_streamable_http(utilities: UtilitiesProcess) -> None:
    async with kept(McpClient(http_settings(utilities.url))) as client:
        assert {t.name for t in client.offered("marla")} == UTILITIES
        assert client.offered("stranger") == []
        assert not client.writes("utilities.check_content")  # its readOnlyHint came over HTTP

        now = await client.call_checked("marla", "utilities.now", {})
        assert now["utc"].endswith("+00:00") and isinstance(now["unix"], float)
        date = await client.call_checked("marla", "utilities.game_date", {"date": "612-11-3"})
        assert date["said"] == "the 3rd of Mistmonth, the year 612 of the Drowning"  # the world's

        blocked = await client.call("marla", "utilities.check_content", {"text": HATE})
        assert blocked.status == "ok" and blocked.result is not None
        assert blocked.result["ok"] is False and blocked.result["category"] == "hate"
        fine = await client.call("marla", "utilities.check_content", {"text": ORDINARY})
        assert fine.status == "ok" and fine.result is not None and fine.result["ok"] is True
        cached = client.cached("marla", "utilities.check_content", {"text": ORDINARY})
        assert cached == fine  # a read tool's result: gold reads it with no I/O

        refused = client.refusal("marla", "utilities.check_content", {"text": 42})
        assert refused is not None and refused.status == "rejected"
        assert refused.message is not None and "utilities.check_content.text" in refused.message
        with pytest.raises(McpArgumentsError, match=r"utilities\.new_ids\.kind"):
            await client.call_checked("marla", "utilities.new_ids", {"kind": "guid"})
        too_long = await client.call("marla", "utilities.check_content", {"text": "a" * 4001})
        assert too_long.status == "rejected"
        with pytest.raises(McpToolNotAllowedError):
            await client.call_checked("stranger", "utilities.now", {})
        assert (await client.call("marla", "utilities.no_such_tool", {})).status == "rejected"
        assert client.breaker("utilities").failures == 0  # refused here: no call was made

        ids = await client.call_checked("marla", "utilities.new_ids", {"count": 2})
        assert len(set(ids["ids"])) == 2
        assert client.connects("utilities") == 1


async def test_a_killed_http_server_fails_calls_as_typed_errors_and_opens_the_breaker(
    utilities: UtilitiesProcess,
) -> None:
    """Each kill fails one call (its connection is dropped, so the next calls are refused as
    not connected without counting); the keeper connects again when the server is back,
    and the second failure in a row (`breaker_failures: 2`) opens the breaker, which then
    skips the server although it is up again."""
    settings = http_settings(utilities.url, breaker_failures=2, breaker_cooldown_s=300.0)
    async with kept(McpClient(settings)) as client:
        breaker = client.breaker("utilities")
        months = await client.call_checked("marla", "utilities.calendar_months", {})

        await utilities.kill()
        with pytest.raises(McpServerError):
            await client.call_checked("marla", "utilities.new_ids", {"count": 1})
        assert (breaker.state, breaker.failures) == (BreakerState.CLOSED, 1)
        await until_disconnected(client)
        assert client.offered("marla") == []
        gone = await client.call("marla", "utilities.new_ids", {"count": 2})
        assert gone.status == "error" and gone.message is not None
        assert "not connected" in gone.message
        assert breaker.failures == 1  # refused before any call: not the server's failure
        assert client.cached("marla", "utilities.calendar_months", {}) is not None
        assert (await client.call("marla", "utilities.calendar_months", {})).result == months

        await utilities.start()
        await until_connects(client, 2)
        assert {t.name for t in client.offered("marla")} == UTILITIES

        await utilities.kill()
        failed = await client.call("marla", "utilities.new_ids", {"count": 3})
        assert failed.status == "error"
        assert (breaker.state, breaker.opens) == (BreakerState.OPEN, 1)

        await utilities.start()
        await until_connects(client, 3)
        assert client.offered("marla") == []  # connected, but its breaker skips it
        with pytest.raises(McpUnavailableError, match="is failing"):
            await client.call_checked("marla", "utilities.new_ids", {"count": 4})
        assert breaker.opens == 1


async def test_an_endpoint_that_never_answers_the_handshake_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`connect_timeout_s` bounds the handshake, not only the listing: a hung server (here a
    loopback socket that reads and never answers) fails the attempt and the keeper tries
    again, instead of waiting in it for ever."""
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()

    hung = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = int(hung.sockets[0].getsockname()[1])
    settings = http_settings(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=0.5)
    client = McpClient(settings)
    caplog.set_level(logging.WARNING, logger="mythic.mcp")
    runner = asyncio.create_task(client.run(), name="mythic-mcp")
    try:
        assert not await client.wait_connected(1.0)
        async with asyncio.timeout(30):
            while sum("connection failed" in r.getMessage() for r in caplog.records) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert client.offered("marla") == []
        with pytest.raises(McpUnavailableError, match="has not connected"):
            await client.call_checked("marla", "utilities.now", {})
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        for writer in held:
            writer.close()
        hung.close()
        await hung.wait_closed()
