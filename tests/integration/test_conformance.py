"""The client conformance suite (`clients/conformance/`) played by the Python client,
`mythic.client`, against a real `mythic serve` on loopback with the embedded model.

The scenarios are the same JSON files every client SDK plays (`test_sdk_typescript.py`,
`test_sdk_csharp.py`, `test_sdk_godot.py`); their format is in `clients/conformance/README.md`.
The server those players share and the audio clips are the harness's
(`tests/integration/conformance.py`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from mythic.client import (
    ClientError,
    ConnectionLostError,
    MythicClient,
    Scene,
    SceneTalk,
    ToolResult,
    Turn,
    TurnEvent,
    VoiceTurn,
)
from mythic.contracts import (
    AUDIO_FRAME_MAGIC,
    Ack,
    ClientMessage,
    Cutoff,
    Error,
    LLMStreamDelta,
    ToolCall,
    VoiceFormat,
    parse_server_message,
)
from tests.integration.conformance import SCENARIOS

pytestmark = pytest.mark.integration

WAIT_S = 120.0
"""The bound on any one wait of a scenario step (a reply on two shared cores included)."""


class ScenarioFailedError(AssertionError):
    """A step's expectation did not hold; says which step of which scenario."""


_CLIENT_MESSAGE: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)


class _TurnLog:
    """One turn of a scenario: its SDK turn, the events read so far, how it ended."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.events: list[TurnEvent] = []
        self.lost = False
        self.over = False
        self._events = aiter(turn)

    async def read(self, until: str) -> None:
        while not self.over:
            try:
                event = await anext(self._events)
            except StopAsyncIteration:
                self.over = True
                return
            except ConnectionLostError:
                self.lost = self.over = True
                return
            self.events.append(event)
            if until == "text" and isinstance(event, LLMStreamDelta) and event.delta:
                return


class Player:
    """Plays one scenario through `mythic.client`, step by step."""

    def __init__(self, url: str, name: str, audio: Path) -> None:
        self.url = url
        self.name = name
        self.audio = audio
        self.clients: dict[str, MythicClient] = {}
        self.sessions: dict[str, str] = {}
        self.bare: dict[str, ClientConnection] = {}
        self.turns: dict[str, _TurnLog] = {}
        self.spoken: dict[str, VoiceTurn] = {}
        self.tool_runs: dict[str, int] = {}
        self.scenes: dict[str, Scene] = {}
        self.talks: dict[str, SceneTalk] = {}

    async def play(self, steps: list[dict[str, Any]]) -> None:
        try:
            for n, step in enumerate(steps):
                try:
                    async with asyncio.timeout(step.get("timeout_s", WAIT_S)):
                        await getattr(self, f"_{step['do']}")(step, step.get("client", "main"))
                except (AssertionError, TimeoutError, ValidationError) as exc:
                    raise ScenarioFailedError(f"{self.name} step {n} {step}: {exc!r}") from exc
        finally:
            for client in self.clients.values():
                await client.aclose()
            for ws in self.bare.values():
                await ws.close()

    def _fill(self, value: Any, who: str) -> Any:
        """The `$session_id` placeholder, replaced by the client's session id."""
        if isinstance(value, str):
            return value.replace(
                "$session_id", self.clients[who].session_id if who in self.clients else ""
            )
        if isinstance(value, dict):
            return {k: self._fill(v, who) for k, v in value.items()}
        if isinstance(value, list):
            return [self._fill(v, who) for v in value]
        return value

    # -- steps --------------------------------------------------------------------------------

    async def _connect(self, step: dict[str, Any], who: str) -> None:
        client = self.clients.get(who)
        if client is None:
            tools: dict[str, dict[str, Any]] = step.get("tools", {})

            async def game(call: ToolCall) -> ToolResult:
                self.tool_runs[call.turn_id] = self.tool_runs.get(call.turn_id, 0) + 1
                answer = tools.get(call.name, {"status": "rejected"})
                await asyncio.sleep(answer.get("delay_s", 0))  # the game takes its time
                return answer["status"], answer.get("result")

            voice = VoiceFormat(**step["voice"]) if "voice" in step else None
            client = MythicClient(
                self.url, tool_handler=game, voice=voice, backoff_s=0.05, timeout_s=WAIT_S
            )
            self.clients[who] = client
        welcome = await client.connect()
        expect = step.get("expect", {})
        if "resumed" in expect:
            assert welcome.resumed is expect["resumed"], welcome
        if expect.get("same_session"):
            assert welcome.session_id == self.sessions[who], (welcome, self.sessions)
        self.sessions[who] = welcome.session_id

    async def _disconnect(self, step: dict[str, Any], who: str) -> None:
        del step
        await self.clients[who].disconnect()

    async def _drop(self, step: dict[str, Any], who: str) -> None:
        del step
        self.clients[who]._ws.transport.abort()  # the network drops: no close handshake

    async def _wait_resumed(self, step: dict[str, Any], who: str) -> None:
        client, expect = self.clients[who], step["expect"]
        while client.resumes < expect["resumes"] or not client._connected.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert client.resumes == expect["resumes"]
        if expect.get("same_session"):
            assert client.session_id == self.sessions[who]

    async def _close(self, step: dict[str, Any], who: str) -> None:
        del step
        if who in self.bare:
            await self.bare.pop(who).close()
        else:
            await self.clients.pop(who).aclose()

    async def _open_bare(self, step: dict[str, Any], who: str) -> None:
        del step
        self.bare[who] = await connect(self.url)

    async def _say(self, step: dict[str, Any], who: str) -> None:
        turn = await self.clients[who].say(step["npc"], step["text"], turn_id=step["turn"])
        self.turns[step["turn"]] = _TurnLog(turn)

    async def _talk(self, step: dict[str, Any], who: str) -> None:
        pcm = (self.audio / f"{step['audio']}.pcm").read_bytes()
        self.spoken[step["turn"]] = await self.clients[who].talk(
            step["npc"],
            pcm,
            chunk_ms=step.get("chunk_ms", 40),
            silence_ms=step.get("silence_ms", 800),
            realtime=False,
            turn_id=step["turn"],
        )

    async def _listen(self, step: dict[str, Any], who: str) -> None:
        del who
        turn = self.spoken[step["turn"]]
        await turn.replied.wait()
        if turn.text.strip():  # a reply that said something is spoken to its end
            await turn.spoken.wait()
        self._check_spoken(turn, step.get("expect", {}))

    def _check_spoken(self, turn: VoiceTurn, expect: dict[str, Any]) -> None:
        deltas = turn.deltas
        assert [d.seq for d in deltas] == list(range(len(deltas))), "seq has gaps"
        if "finish_reason" in expect:
            assert deltas and deltas[-1].finish_reason in expect["finish_reason"], deltas
        if expect.get("text"):
            assert turn.text.strip(), deltas
        if expect.get("heard"):
            assert turn.transcript is not None and turn.transcript.strip(), turn.errors
        if expect.get("audio"):
            chunks = turn.chunks
            assert [c.seq for c in chunks] == list(range(len(chunks))), "TTSChunk seq has gaps"
            assert chunks and chunks[-1].final and not any(c.final for c in chunks[:-1])
            start, heard = 0.0, []  # each viseme's time in the whole turn
            for chunk in chunks:
                assert chunk.pcm and len(chunk.pcm) % 2 == 0 and chunk.sample_rate > 0, chunk
                duration = len(chunk.pcm) / 2 / chunk.sample_rate
                times = [v.t for v in chunk.visemes]
                assert all(a < b for a, b in itertools.pairwise(times)), times
                assert all(0 <= t <= duration for t in times), (times, duration)
                heard += [start + t for t in times]
                start += duration
            assert heard and heard == sorted(heard), "no visemes, or not running forward"

    async def _cutoff(self, step: dict[str, Any], who: str) -> None:
        del who
        await self.turns[step["turn"]].turn.cutoff()

    async def _scene(self, step: dict[str, Any], who: str) -> None:
        await self.clients[who].scene(
            step["npc"], zone=step.get("zone"), time=step.get("time"), objects=step.get("objects")
        )

    async def _scene_start(self, step: dict[str, Any], who: str) -> None:
        expect = step.get("expect", {})
        start = self.clients[who].start_scene(
            step["scene"], step["npcs"], max_exchanges=step.get("max_exchanges")
        )
        if "error" in expect:
            with pytest.raises(ClientError) as refused:
                await start
            error = refused.value.error
            assert error is not None, refused.value
            for key, value in expect["error"].items():
                assert getattr(error, key) == value, (key, error)
            return
        scene = await start
        self.scenes[step["scene"]] = scene
        if "npcs" in expect:
            assert list(scene.npcs) == expect["npcs"], scene.npcs

    async def _scene_say(self, step: dict[str, Any], who: str) -> None:
        del who
        scene = self.scenes[step["scene"]]
        self.talks[step["turn"]] = await scene.say(
            step["text"], to=step.get("to"), turn_id=step["turn"]
        )

    async def _scene_ambient(self, step: dict[str, Any], who: str) -> None:
        del who
        self.talks[step["turn"]] = await self.scenes[step["scene"]].ambient(
            step.get("lines", 6),
            topic=step.get("topic"),
            opener=step.get("opener"),
            priority=step.get("priority", "bronze"),
            turn_id=step["turn"],
        )

    async def _scene_read(self, step: dict[str, Any], who: str) -> None:
        del who
        talk = await self.talks[step["turn"]].wait()
        expect = step.get("expect", {})
        for reply in talk.replies:
            assert [d.seq for d in reply.deltas] == list(range(len(reply.deltas))), "seq gaps"
        said = [(r.npc_id, r.text, r.finish_reason) for r in talk.replies]
        if "speakers" in expect:
            assert talk.speakers == expect["speakers"], said
        if "first_speaker" in expect:
            assert talk.speakers[:1] == [expect["first_speaker"]], said
        if "at_most" in expect:
            assert len(talk.replies) <= expect["at_most"], said
        if "chosen_by" in expect:
            assert talk.turns and talk.turns[0].chosen_by == expect["chosen_by"], talk.turns
        if expect.get("text"):
            assert talk.replies and talk.replies[0].text.strip(), said
        if "finish_reason" in expect:
            assert all(r.finish_reason in expect["finish_reason"] for r in talk.replies), said
        if "errors" in expect:
            assert [e.code for e in talk.errors] == expect["errors"], talk.errors

    async def _scene_join(self, step: dict[str, Any], who: str) -> None:
        del who
        npcs = await self.scenes[step["scene"]].join(step["npc"])
        if "npcs" in step.get("expect", {}):
            assert list(npcs) == step["expect"]["npcs"], npcs

    async def _scene_leave(self, step: dict[str, Any], who: str) -> None:
        del who
        npcs = await self.scenes[step["scene"]].leave(step["npc"])
        if "npcs" in step.get("expect", {}):
            assert list(npcs) == step["expect"]["npcs"], npcs

    async def _scene_end(self, step: dict[str, Any], who: str) -> None:
        del who
        scene = self.scenes[step["scene"]]
        await scene.end()
        assert scene.ended is not None

    async def _intent(self, step: dict[str, Any], who: str) -> None:
        update = await self.clients[who].intent(
            step["npc"],
            context=step.get("context"),
            with_bark=step.get("with_bark", False),
            request_id=step.get("request_id"),
        )
        expect = step.get("expect", {})
        assert update.npc_id == step["npc"], update
        if "request_id" in expect:
            assert update.request_id == expect["request_id"], update
        if expect.get("bark"):
            assert update.bark is not None and 1 <= len(update.bark.split()) <= 8, update
        if "target_in" in expect:
            assert update.target in expect["target_in"], update

    async def _ack(self, step: dict[str, Any], who: str) -> None:
        log = self.turns[step["turn"]]
        if "call" in step:
            calls = [e for e in log.events if isinstance(e, ToolCall)]
            await self.clients[who].ack(calls[step["call"]], step["status"])
            return
        await self.clients[who].send(
            Ack(
                ack_of="ToolCall",
                status=step["status"],
                turn_id=step["turn"],
                call_id=step["call_id"],
            )
        )

    async def _send(self, step: dict[str, Any], who: str) -> None:
        message = {"schema_version": "v1", **self._fill(step["message"], who)}
        if step.get("refused_locally"):
            with pytest.raises(ValidationError):
                _CLIENT_MESSAGE.validate_python(message)
            return
        await self.clients[who].send(_CLIENT_MESSAGE.validate_python(message))

    async def _send_raw(self, step: dict[str, Any], who: str) -> None:
        frame: str | bytes
        if "text" in step:
            frame = self._fill(step["text"], who) * step.get("repeat", 1)
        elif "binary_base64" in step:
            frame = base64.b64decode(step["binary_base64"])
        else:
            audio = step["audio_frame"]
            header = json.dumps(self._fill(audio["header"], who)).encode()
            pcm = base64.b64decode(audio["pcm_base64"])
            frame = AUDIO_FRAME_MAGIC + len(header).to_bytes(4, "little") + header + pcm
        ws = self.bare[who] if who in self.bare else self.clients[who]._ws
        for _ in range(step.get("count", 1)):
            await ws.send(frame)

    async def _expect_closed(self, step: dict[str, Any], who: str) -> None:
        ws = self.bare[who]
        with contextlib.suppress(ConnectionClosed):
            while True:  # what comes before the close is read, so the close frame is
                await ws.recv()
        assert ws.close_code == step["expect"]["code"], (ws.close_code, ws.close_reason)

    async def _expect_error(self, step: dict[str, Any], who: str) -> None:
        error = await (self._bare_error(who) if who in self.bare else self._client_error(who))
        for key, value in step["expect"].items():
            assert getattr(error, key) == value, (key, error)

    async def _client_error(self, who: str) -> Error:
        events = self.clients[who].events
        while not isinstance(event := await events.get(), Error):
            pass
        return event

    async def _bare_error(self, who: str) -> Error:
        while not isinstance(message := parse_server_message(await self.bare[who].recv()), Error):
            pass
        return message

    async def _read(self, step: dict[str, Any], who: str) -> None:
        del who
        log = self.turns[step["turn"]]
        await log.read(step["until"])
        if step["until"] == "end":
            self._check_turn(log, step.get("expect", {}))

    def _check_turn(self, log: _TurnLog, expect: dict[str, Any]) -> None:
        deltas = [e for e in log.events if isinstance(e, LLMStreamDelta)]
        assert [d.seq for d in deltas] == list(range(len(deltas))), "seq has gaps"
        assert log.lost is expect.get("lost", False), log.events
        if "finish_reason" in expect:
            assert log.turn.finish_reason in expect["finish_reason"], log.events
        if expect.get("text"):
            assert log.turn.text.strip(), log.events
        if "tool_calls" in expect:
            calls = [e for e in log.events if isinstance(e, ToolCall)]
            assert [c.name for c in calls] == [c["name"] for c in expect["tool_calls"]], calls
            for call, wanted in zip(calls, expect["tool_calls"], strict=True):
                assert call.args | wanted.get("args", {}) == call.args, call
        if "distinct_calls" in expect:
            ids = {e.call_id for e in log.events if isinstance(e, ToolCall)}
            assert len(ids) == expect["distinct_calls"], log.events
        if "tool_runs" in expect:
            assert self.tool_runs.get(log.turn.turn_id, 0) == expect["tool_runs"], self.tool_runs
        if expect.get("voiced"):
            ends = [i for i, d in enumerate(deltas) if d.finish_reason == "tool_call"]
            assert ends and "".join(d.delta for d in deltas[ends[0] + 1 :]).strip(), deltas
        if "cutoffs" in expect:
            cutoffs = [e.reason for e in log.events if isinstance(e, Cutoff)]
            assert cutoffs == expect["cutoffs"], log.events
        if "errors" in expect:
            assert [e.code for e in log.events if isinstance(e, Error)] == expect["errors"]


def _scenario(path: Path) -> dict[str, Any]:
    scenario: dict[str, Any] = json.loads(path.read_text())
    assert scenario["name"] == path.stem, "a scenario is named after its file"
    return scenario


def test_the_suite_has_every_scenario_of_issue_35() -> None:
    """The suite is what the README says: at least the scenarios issue 35 lists."""
    assert {p.stem for p in SCENARIOS} >= {
        "session_start_and_resume",
        "line_streamed",
        "tool_call_and_duplicate_ack",
        "barge_in_by_new_line",
        "cutoff",
        "scene_and_intent_with_bark",
        "bad_frames",
        "session_errors",
        "refused_by_the_client",
        "dropped_connection_mid_turn",
        "tool_call_sent_again",
        "audio_in_and_out",
        "flood",
    }


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_scenario(conformance_url: str, conformance_audio: Path, path: Path) -> None:
    scenario = _scenario(path)
    await Player(conformance_url, scenario["name"], conformance_audio).play(scenario["steps"])
