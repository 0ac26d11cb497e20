"""Watching a running world: the Grafana dashboard's and the alert rules' metric names against a
live server's /metrics, and the `/dashboard` page in a real headless Chromium (Debian's
`chromium`, driven over the Chrome DevTools Protocol) while a scripted conversation runs."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from mythic.client import MythicClient
from mythic.config import MemorySettings, MythicSettings
from mythic.contracts import VoiceFormat
from mythic.engine import Engine
from mythic.memory import Memory
from tests.conftest import EXAMPLE_WORLD, unavailable
from tests.integration.test_server import engines, running, until
from tests.integration.test_voice import RATE, _speech_available, said
from tests.unit.test_dashboard_rules import (
    exported_names,
    load_dashboard,
    load_rules,
    missing,
    references,
)

pytestmark = pytest.mark.integration
__all__ = ["engines"]  # the fixture, used by name

CHROMIUM = "chromium"
MARKUP = '<img src=x onerror="document.title=1"><b>Bran</b>'
"""An NPC name that would be an element if the page wrote text as HTML."""
NOTHING = "\N{EN DASH}"
"""What the page shows for a number it does not have yet."""


async def _text(address: str, path: str) -> str:
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=60) as http:
        response = await http.get(path)
        response.raise_for_status()
        return response.text


async def test_every_panel_and_rule_names_a_metric_the_server_exports(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    """A server with memory and voice on, after a text turn (with a player, so memory is
    prefetched) and a spoken one: every metric name of every panel, template variable and
    alert rule is in its /metrics, and the dashboard's JSON has the voice turn's latency."""
    _speech_available()
    memory = Memory(MemorySettings(data_dir=tmp_path))
    async with (
        running(
            engines,
            settings,
            memory=memory,
            chat={"max_tokens": 32, "temperature": 0.0},
            speech={"enabled": True, "sample_rate": RATE},
        ) as (address, gateway),
        asyncio.timeout(300),
    ):
        voice = gateway.voice
        assert voice is not None
        await until(lambda: voice.ready, timeout_s=180)
        async with MythicClient(f"ws://{address}/v1/ws", player_id="dash-1") as client:
            turn = await client.say("marla", "Good evening. Is there a room free?")
            assert [e async for e in turn] and turn.text
        async with MythicClient(
            f"ws://{address}/v1/ws", voice=VoiceFormat(binary=True), timeout_s=60
        ) as client:
            spoken = await client.talk("marla", await said(gateway, "Is the tavern open?"))
            await spoken.wait(180)
        exposition = await _text(address, "/metrics")
        board = json.loads(await _text(address, "/v1/dashboard"))
    # The page's numbers come from the same samples: the spoken turn's first audio is there.
    latency = board["latency"]
    assert latency["first_audio"]["samples"] == 1
    assert latency["first_audio"]["p95_ms"] > latency["voice_first_token"]["p50_ms"]
    assert latency["first_token"]["samples"] >= 1
    assert board["memory"] == {"warm_up": True, "archive_down": False, "archive_pending": 0}
    exported = exported_names(exposition)
    for shown in (
        "mythic_turn_first_token_seconds",
        "mythic_voice_first_audio_seconds",
        "mythic_knowledge_seconds",
        "mythic_turns_total",
        "mythic_memory_warm_up",
    ):
        assert shown in exported, f"{shown} is not in /metrics: the test's server lacks a part"
    found = references(load_dashboard(), load_rules())
    assert len(found) >= 60  # the check cannot pass by reading nothing
    assert not missing(found, exported), "\n".join(missing(found, exported))


class DevTools:
    """A Chromium page over the Chrome DevTools Protocol: commands, and the console errors and
    exceptions and the requests it made."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.session: str | None = None
        self.errors: list[str] = []
        self.requests: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def read(self) -> None:
        """Route answers to their commands and collect events, until the socket closes."""
        async for frame in self.socket:
            message = json.loads(frame)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
                continue
            self._event(message.get("method", ""), message.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(f"exception: {details.get('exception', {}).get('description')}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = [a.get("value", a.get("description")) for a in params["args"]]
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry['text']} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run a command (on the page once attached); its result. Raises on a CDP error."""
        command_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        await self.socket.send(json.dumps(message))
        async with asyncio.timeout(30):
            answer = await future
        assert "error" not in answer, f"{method}: {answer['error']}"
        result: dict[str, Any] = answer["result"]
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def until(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll the page until `expression` is truthy; its value."""
        async with asyncio.timeout(timeout_s):
            while not (value := await self.evaluate(expression)):  # noqa: ASYNC110 - a page
                await asyncio.sleep(0.1)
        return value


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[DevTools]:
    """A headless Chromium with a blank page attached, closed on exit."""
    program = shutil.which(CHROMIUM)
    if program is None:
        unavailable("Debian's chromium is not installed (make setup installs it as root)")
        raise AssertionError("unreachable")
    proc = await asyncio.create_subprocess_exec(
        program,
        "--headless=new",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--no-sandbox",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        active = profile / "DevToolsActivePort"
        async with asyncio.timeout(60):
            while not active.exists() or len(active.read_text().split()) < 2:
                assert proc.returncode is None, "chromium exited at start"
                await asyncio.sleep(0.05)
        port, path = active.read_text().split()[:2]
        async with (
            connect(f"ws://127.0.0.1:{port}{path}", max_size=None) as socket,
            asyncio.TaskGroup() as tasks,
        ):
            tools = DevTools(socket)
            reader = tasks.create_task(tools.read())
            target = await tools.send("Target.createTarget", url="about:blank")
            attached = await tools.send(
                "Target.attachToTarget", targetId=target["targetId"], flatten=True
            )
            tools.session = attached["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                await tools.send(f"{domain}.enable")
            try:
                yield tools
            finally:
                reader.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            async with asyncio.timeout(10):
                await proc.wait()


_SHOWN = """(() => {
  const cells = (id) => [...document.querySelectorAll(`#${id} tbody tr`)].map(
    (tr) => [...tr.cells].map((td) => td.textContent));
  const byMeasure = {};
  for (const tr of document.querySelectorAll('#latency tbody tr')) {
    byMeasure[tr.dataset.measure] = [...tr.cells].map((td) => td.textContent);
  }
  return {
    state: document.getElementById('status').dataset.state,
    world: document.getElementById('world').textContent,
    turns: document.getElementById('turns').textContent,
    latency: byMeasure,
    npcs: cells('npcs'),
    sessions: cells('sessions'),
    tiers: cells('tiers'),
    recent: [...document.querySelectorAll('#recent tbody tr')].map(
      (tr) => [tr.dataset.turn, tr.querySelector('td.line').textContent,
               tr.querySelector('td.trace').textContent]),
  };
})()"""


async def test_the_dashboard_shows_a_live_conversation_in_chromium(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    """The page loads from Mythic alone, and while a player talks to two NPCs (over the
    WebSocket and over HTTP) it shows the turns counting up, each turn's line, the NPCs'
    states and tiers, the session and the first-token percentiles filling in; markup in a
    card is shown as text; no console error, no exception, no request elsewhere."""
    chat = {"max_tokens": 24, "temperature": 0.0}
    world = tmp_path / "ravenmoor"
    shutil.copytree(EXAMPLE_WORLD, world)
    card = world / "npcs" / "bran.yaml"
    name = card.read_text(encoding="utf-8").splitlines()[0]
    card.write_text(
        card.read_text(encoding="utf-8").replace(name, f"name: {json.dumps(MARKUP)}", 1),
        encoding="utf-8",
    )
    async with (
        running(engines, settings, world=world, chat=chat) as (address, gateway),
        chromium(tmp_path / "profile") as page,
        asyncio.timeout(240),
    ):
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            served = await http.get("/dashboard")
            assert "script-src 'self'" in served.headers["content-security-policy"]
            assert (await http.get("/dashboard/secrets.txt")).status_code == 404
            assert (await http.get("/dashboard/..%2Fapp.py")).status_code == 404
            assert (await http.get("/v1/dashboard", params={"turns": 0})).status_code == 422
            assert (await http.get("/v1/dashboard", params={"turns": "x"})).status_code == 422
        await page.send("Page.navigate", url=f"http://{address}/dashboard")
        await page.until("document.getElementById('status')?.dataset.state === 'live'")
        before = await page.evaluate(_SHOWN)
        assert before["world"] == gateway.world.name
        assert before["turns"] == "0" and before["recent"] == []
        assert before["latency"]["first_token"][1:] == [NOTHING, NOTHING, "0"]
        assert sorted(row[0] for row in before["npcs"]) == sorted(gateway.world.npcs)
        assert before["tiers"], "no tier shown"
        # A card's text is shown as text: the markup in Bran's name is not made an element.
        assert next(row[1] for row in before["npcs"] if row[0] == "bran") == MARKUP
        assert await page.evaluate("document.querySelectorAll('main img, main b').length") == 0

        ws_turns: list[str] = []
        async with MythicClient(f"ws://{address}/v1/ws", player_id="watcher-1") as client:
            for n, line in enumerate(("Good evening, Marla.", "Is there a room free?"), 1):
                turn = await client.say("marla", line)
                assert [e async for e in turn]
                record = gateway.cast.actors["marla"].last_turn
                assert record is not None and record.turn_id == turn.turn_id
                ws_turns.append(turn.turn_id)
                shown = await _shown_after(page, n, turn.turn_id, record.text[:160])
                assert shown["latency"]["first_token"][3] == str(n)
                assert shown["latency"]["first_token"][1].endswith(" ms")
            npc = next(row for row in shown["npcs"] if row[0] == "marla")
            assert npc[3], "marla's tiers are not shown"
            assert any(row[0] == client.session_id for row in shown["sessions"])
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http:
            response = await http.post("/v1/npcs/grisk/say", json={"text": "What news?"})
            response.raise_for_status()
            said_by_http = response.json()
        record = gateway.cast.actors["grisk"].last_turn
        assert record is not None and record.turn_id == said_by_http["turn_id"]
        shown = await _shown_after(page, 3, said_by_http["turn_id"], record.text[:160])
        assert [row[0] for row in shown["recent"]] == [said_by_http["turn_id"], *ws_turns[::-1]]
        for _turn_id, _line, trace in shown["recent"]:
            assert "gateway" in trace and "engine" in trace, trace  # each hop and its time
        errors, requests = list(page.errors), list(page.requests)
    assert not errors, errors
    assert requests, "no request seen"
    others = [u for u in requests if not u.startswith((f"http://{address}/", "data:"))]
    assert not others, others


async def _shown_after(page: DevTools, turns: int, turn_id: str, text: str) -> dict[str, Any]:
    """What the page shows once it counts `turns` turns and lists `turn_id` with its line."""
    row = json.dumps(f'#recent tr[data-turn="{turn_id}"] td.line')
    await page.until(
        f"document.getElementById('turns').textContent === '{turns}' && "
        f"document.querySelector({row})?.textContent === {json.dumps(text)}"
    )
    shown: dict[str, Any] = await page.evaluate(_SHOWN)
    return shown
