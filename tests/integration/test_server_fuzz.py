"""Random and mutated frames thrown at a live server socket: it never crashes, every
connection stays served, and no task is left behind."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from mythic.config import MythicSettings
from mythic.contracts import parse_server_message
from mythic.engine import Engine
from mythic.knowledge import load_world
from mythic.server import Gateway, bind, create_app
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.integration


class ThreadedServer:
    """A real uvicorn on loopback in its own thread and event loop, so synchronous
    hypothesis tests can drive it with a blocking WebSocket client."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.sock = bind("127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self.sock.getsockname()[1]}/v1/ws"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(gateway, warm=False), log_level="warning")
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.at_rest: list[str] = []
        """The loop's tasks before any client connected."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        asyncio.run(serve())

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def tasks(self) -> list[str]:
        """Names of the server loop's tasks other than NPC actors (which live on)."""

        async def names() -> list[str]:
            return sorted(
                t.get_name()
                for t in asyncio.all_tasks()
                if t is not asyncio.current_task() and not t.get_name().startswith("npc ")
            )

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(names(), self.loop).result(10)


@pytest.fixture(scope="module")
def live(smollm: Engine, settings: MythicSettings) -> Iterator[ThreadedServer]:
    effective = settings.model_copy(
        update={
            "server": settings.server.model_copy(
                update={"rate_per_s": 1e6, "rate_burst": 10**6, "max_violations": 10**6}
            ),
            "chat": settings.chat.model_copy(update={"max_tokens": 4}),
            "dialogue": settings.dialogue.model_copy(update={"decide": False}),
        }
    )
    with ThreadedServer(Gateway(effective, load_world(EXAMPLE_WORLD), smollm)) as server:
        server.at_rest = server.tasks()
        yield server


TYPES = [
    "SessionStart",
    "SessionEnd",
    "AudioChunk",
    "PlayerUtterance",
    "SceneUpdate",
    "IntentRequest",
    "Cutoff",
    "Ack",
    "Error",
    "Welcome",
    "ToolCall",
    "Bogus",
]
VALID: list[dict[str, Any]] = [
    {"type": "SceneUpdate", "npc_id": "marla", "zone": "old_town", "time": "21:10"},
    {"type": "SceneUpdate", "npc_id": "bran", "objects": [{"id": "player", "dist": 1.5}]},
    {"type": "Cutoff", "npc_id": "marla", "session_id": "SESSION", "turn_id": "t-1"},
    {"type": "Ack", "ack_of": "ToolCall", "status": "ok", "call_id": "c-1"},
    {"type": "Error", "code": "game_error", "message": "the game had a problem"},
    {"type": "PlayerUtterance", "npc_id": "nobody", "session_id": "SESSION", "turn_id": "t-2",
     "text": "hi"},
    {"type": "PlayerUtterance", "npc_id": "marla", "session_id": "SESSION", "turn_id": "t-3",
     "text": "hi"},
    {"type": "AudioChunk", "npc_id": "marla", "session_id": "SESSION", "pcm": "AAAA",
     "sample_rate": 16000, "ts_client": 1.0},
]  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid message with one field removed, retyped or added, or its envelope broken."""
    message = {"schema_version": "v1", **draw(st.sampled_from(VALID))}
    action = draw(st.sampled_from(["drop", "set", "add", "type", "version", "keep"]))
    key = draw(st.sampled_from(sorted(message)))
    if action == "drop":
        del message[key]
    elif action == "set":
        message[key] = draw(json_values)
    elif action == "add":
        message[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif action == "type":
        message["type"] = draw(st.sampled_from(TYPES))
    elif action == "version":
        message["schema_version"] = draw(st.sampled_from(["v0", "v2", "", 1, None]))
    return json.dumps(message)


frames = st.one_of(
    mutated(),
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.binary(max_size=200),
)


def _probe(ws: Any) -> None:
    """The connection is still served: a known-bad frame gets its typed error back."""
    ws.send("{probe")
    deadline = time.monotonic() + 30
    while True:
        frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        message = parse_server_message(frame)
        if message.type == "Error" and message.code == "bad_json":
            return


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(frames, min_size=1, max_size=8))
def test_random_and_mutated_frames_never_break_the_server(
    live: ThreadedServer, batch: list[str | bytes]
) -> None:
    with connect(live.url, max_size=1 << 22) as ws:
        ws.send('{"schema_version":"v1","type":"SessionStart"}')
        session_id = parse_server_message(ws.recv(timeout=30)).session_id  # type: ignore[union-attr]
        for frame in batch:
            if isinstance(frame, str):
                frame = frame.replace("SESSION", session_id)
            ws.send(frame)
        _probe(ws)


def test_no_task_is_left_behind(live: ThreadedServer) -> None:
    """Runs after the fuzzing (module order): once every connection has closed and every
    turn has ended, the server loop holds only what it held at rest."""
    deadline = time.monotonic() + 30
    while True:
        left = live.tasks()
        busy = [a for a in live.gateway.cast.actors.values() if a.busy_session is not None]
        if not busy and left == live.at_rest:
            break
        assert time.monotonic() < deadline, f"tasks left: {left}, busy NPCs: {busy}"
        time.sleep(0.05)
    assert live.gateway.metrics.open_connections == 0
    assert live.gateway.cast.stats.actor_restarts == 0
    with connect(live.url) as ws:
        ws.send('{"schema_version":"v1","type":"SessionStart"}')
        assert parse_server_message(ws.recv(timeout=30)).type == "Welcome"
