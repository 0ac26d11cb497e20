"""The client's own logic, without a server: how a turn's reply text is put together, and
its connection's life (reconnecting within bounds, disconnect and resume) against a scripted
peer on loopback, the other side of the boundary. The real server's behaviour is the
conformance suite's (tests/integration/test_conformance.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from mythic.client import ConnectionLostError, MythicClient
from mythic.client._client import reply_text
from mythic.contracts import LLMStreamDelta, Welcome, dump_message

pytestmark = pytest.mark.unit


def delta(seq: int, text: str, reason: Any = None) -> LLMStreamDelta:
    return LLMStreamDelta(
        npc_id="marla", session_id="s", turn_id="t", seq=seq, delta=text,
        final=reason is not None, finish_reason=reason,
    )  # fmt: skip


def test_a_voiced_tool_result_is_spaced_from_the_reply_before_it() -> None:
    reply = [delta(0, "The mill is north"), delta(1, ".", "tool_call")]
    follow = [delta(2, "There: follow"), delta(3, " the mark."), delta(4, "", "stop")]
    assert reply_text([*reply, *follow]) == "The mill is north. There: follow the mark."
    # Within a segment the deltas join as sent; a space already there is not doubled.
    assert reply_text([delta(0, "Aye,"), delta(1, " friend", "stop")]) == "Aye, friend"
    spaced = [delta(0, "North. ", "tool_call"), delta(1, "There.", "stop")]
    assert reply_text(spaced) == "North. There."
    # An empty delta after the tool call does not lose the gap; an empty reply gets none.
    gap = [delta(0, "North.", "tool_call"), delta(1, ""), delta(2, "There.", "stop")]
    assert reply_text(gap) == "North. There."
    assert reply_text([delta(0, "", "tool_call"), delta(1, "There.", "stop")]) == "There."


Script = Callable[["Peer", ServerConnection, int], Awaitable[None]]


class Peer:
    """A server on loopback that plays `script(peer, ws, n)` for its n-th connection (from
    0); `received[n]` is what the client sent on it, `ended[n]` is set when it is over."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.url = ""
        self.received: list[list[dict[str, Any]]] = []
        self.ended: list[asyncio.Event] = []

    async def _handle(self, ws: ServerConnection) -> None:
        n = len(self.received)
        self.received.append([])
        self.ended.append(asyncio.Event())
        try:
            with contextlib.suppress(ConnectionClosed):
                await self.script(self, ws, n)
        finally:
            self.ended[n].set()

    async def recv(self, ws: ServerConnection, n: int) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(await ws.recv())
        self.received[n].append(message)
        return message

    async def welcome(self, ws: ServerConnection, n: int) -> None:
        """Read the SessionStart and welcome it: session `s-1`, resumed when it has a token."""
        start = await self.recv(ws, n)
        resumed = start.get("resume_token") == "r-1"
        welcome = Welcome(session_id="s-1", resume_token="r-1", max_frame_bytes=1 << 20)
        await ws.send(dump_message(welcome.model_copy(update={"resumed": resumed})))

    async def answer(self, ws: ServerConnection, n: int) -> None:
        """Answer every PlayerUtterance with a one-delta reply, until the client closes."""
        while True:
            said = await self.recv(ws, n)
            if said["type"] == "PlayerUtterance":
                reply = LLMStreamDelta(
                    npc_id=said["npc_id"], session_id="s-1", turn_id=said["turn_id"], seq=0,
                    delta="Aye.", final=True, finish_reason="stop",
                )  # fmt: skip
                await ws.send(dump_message(reply))


@contextlib.asynccontextmanager
async def scripted_peer(script: Script) -> AsyncIterator[Peer]:
    peer = Peer(script)
    async with serve(peer._handle, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        peer.url = f"ws://127.0.0.1:{port}/v1/ws"
        yield peer


def dropping_first(refused: int) -> Script:
    """The first connection is welcomed and dropped (no close handshake) at the player's
    line; the next `refused` close before their Welcome; later ones are welcomed and
    answered."""

    async def script(peer: Peer, ws: ServerConnection, n: int) -> None:
        if n == 0:
            await peer.welcome(ws, n)
            await peer.recv(ws, n)
            ws.transport.abort()
        elif n > refused:
            await peer.welcome(ws, n)
            await peer.answer(ws, n)

    return script


async def test_reconnecting_gives_up_after_max_reconnects_and_the_client_is_closed() -> None:
    async with scripted_peer(dropping_first(refused=3)) as peer, asyncio.timeout(10):
        client = MythicClient(peer.url, backoff_s=0.001, max_reconnects=3, timeout_s=5)
        await client.connect()
        turn = await client.say("marla", "Open?")
        with pytest.raises(ConnectionLostError, match="during turn"):
            await turn.reply()
        # A line said while the client reconnects waits for it, and ends when it gives up.
        with pytest.raises(ConnectionLostError, match=r"gave up reconnecting .* after 3 tries"):
            await client.say("marla", "Anyone there?")
        assert client.closed
        assert len(peer.received) == 1 + 3
        await client.aclose()


async def test_a_resume_on_the_last_try_allowed_succeeds() -> None:
    async with scripted_peer(dropping_first(refused=2)) as peer, asyncio.timeout(10):
        client = MythicClient(peer.url, backoff_s=0.001, max_reconnects=3, timeout_s=5)
        await client.connect()
        with pytest.raises(ConnectionLostError):
            await (await client.say("marla", "Open?")).reply()
        assert await (await client.say("marla", "Still open?")).reply() == "Aye."
        assert (client.resumes, client.closed, len(peer.received)) == (1, False, 1 + 3)
        await client.aclose()


async def test_reconnecting_gives_up_after_max_reconnect_s() -> None:
    async def script(peer: Peer, ws: ServerConnection, n: int) -> None:
        if n == 0:
            await peer.welcome(ws, n)
            await peer.recv(ws, n)
            ws.transport.abort()
        else:  # the server accepts the connection and never welcomes it
            await ws.wait_closed()

    async with scripted_peer(script) as peer, asyncio.timeout(10):
        # Each try may take `timeout_s`; only `max_reconnect_s` ends them before it.
        client = MythicClient(
            peer.url, backoff_s=0.001, max_reconnects=1000, max_reconnect_s=0.2, timeout_s=5
        )
        await client.connect()
        with pytest.raises(ConnectionLostError):
            await (await client.say("marla", "Open?")).reply()
        with pytest.raises(ConnectionLostError, match="gave up reconnecting"):
            await client.say("marla", "Anyone there?")
        assert client.closed
        await client.aclose()


async def test_disconnect_keeps_the_session_and_connect_resumes_it() -> None:
    async def script(peer: Peer, ws: ServerConnection, n: int) -> None:
        await peer.welcome(ws, n)
        if n == 0:
            await peer.recv(ws, n)  # the line is never answered
            await peer.recv(ws, n)  # the close ends it
        else:
            await peer.answer(ws, n)

    async with scripted_peer(script) as peer, asyncio.timeout(10):
        client = MythicClient(peer.url, backoff_s=0.001, timeout_s=5)
        await client.connect()
        turn = await client.say("marla", "Open?")
        await client.disconnect()
        with pytest.raises(ConnectionLostError):
            await turn.reply()
        assert client.closed
        with pytest.raises(ConnectionLostError, match="disconnected"):
            await client.say("marla", "Hello?")  # closed: it fails at once, nothing is sent
        await peer.ended[0].wait()
        # No SessionEnd, and no connection of the client's own before `connect`.
        assert [m["type"] for m in peer.received[0]] == ["SessionStart", "PlayerUtterance"]
        assert len(peer.received) == 1

        welcome = await client.connect()
        assert (welcome.resumed, welcome.session_id, client.resumes) == (True, "s-1", 1)
        assert peer.received[1][0]["resume_token"] == "r-1"
        assert not client.closed
        assert await (await client.say("marla", "Open now?")).reply() == "Aye."
        await client.aclose()
        await peer.ended[1].wait()
        assert peer.received[1][-1]["type"] == "SessionEnd"
        assert client.closed
