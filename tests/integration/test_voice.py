"""Voice over the real server: speech in (VAD, Whisper), the reply spoken (Piper) with visemes,
barge-in, backchannels, and bad audio. The questions are synthesised by the server's own TTS
workers and streamed at real-time pace, as a microphone would send them."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mythic.client import MythicClient, ToolResult, VoiceTurn
from mythic.config import MythicSettings
from mythic.contracts import (
    AudioChunk,
    Cutoff,
    Error,
    ToolCall,
    VoiceFormat,
    dump_audio_frame,
)
from mythic.dialogue import INTERRUPTED_NOTE
from mythic.dialogue._phrases import sentences_end
from mythic.engine import Engine
from mythic.server import Gateway
from mythic.speech import VoiceProfile
from tests.conftest import unavailable
from tests.integration.test_server import engines, running, until
from tests.integration.test_speech import QUESTION, STEADY, sounds_like

pytestmark = pytest.mark.integration
__all__ = ["engines"]  # the fixture, used by name

RATE = 16000


def _speech_available() -> None:
    import shutil

    try:
        from mythic.speech import piper_voice_files, whisper_model_dir

        whisper_model_dir()
        ok = piper_voice_files() is not None and shutil.which("sox") is not None
    except Exception as exc:  # noqa: BLE001 - any missing part of the stack
        unavailable(f"the speech stack is not installed: {exc}")
        return
    if not ok:
        unavailable("the speech stack (Piper voice, sox) is not installed")


@contextlib.asynccontextmanager
async def voice_server(
    engines: tuple[Engine, Engine],
    settings: MythicSettings,
    max_tokens: int = 40,
    spoken_max_sentences: int = 3,
    decide: bool = False,
    speech: dict[str, Any] | None = None,
    dialogue: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[str, Gateway]]:
    _speech_available()
    async with running(
        engines,
        settings,
        chat={"max_tokens": max_tokens, "temperature": 0.0},
        dialogue={
            "decide": decide,
            "spoken_max_sentences": spoken_max_sentences,
            **(dialogue or {}),
        },
        speech={"enabled": True, "sample_rate": RATE, "partial_interval_ms": 300, **(speech or {})},
    ) as (address, gateway):
        voice = gateway.voice
        assert voice is not None
        await until(lambda: voice.ready, timeout_s=180)
        yield address, gateway


@contextlib.asynccontextmanager
async def voice_talk(
    engines: tuple[Engine, Engine], settings: MythicSettings, timeout_s: float, **server: Any
) -> AsyncIterator[tuple[str, Gateway, MythicClient]]:
    """A voice server (`server`: `voice_server`'s options), a client sending PCM in JSON
    frames, and a deadline for the whole exchange."""
    async with (
        voice_server(engines, settings, **server) as (address, gateway),
        MythicClient(f"ws://{address}/v1/ws", voice=VoiceFormat(), timeout_s=60) as client,
        asyncio.timeout(timeout_s),
    ):
        yield address, gateway, client


async def said(gateway: Gateway, text: str, voice: str | VoiceProfile = STEADY) -> bytes:
    """`text` spoken at 16 kHz, with a little silence before it (by default by a steady
    voice: the same audio every run)."""
    assert gateway.voice is not None
    pcm, _ = await gateway.voice.tts.speak(text, voice)
    return bytes(RATE // 5 * 2) + pcm


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


async def test_a_spoken_question_gets_a_spoken_answer_with_visemes(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with (
        voice_server(engines, settings) as (address, gateway),
        MythicClient(
            f"ws://{address}/v1/ws", voice=VoiceFormat(binary=True), timeout_s=60
        ) as client,
        asyncio.timeout(300),
    ):
        question = await said(gateway, "Is the tavern open tonight?")
        turn = await client.talk("marla", question)
        await turn.wait(180)
        assert gateway.voice is not None
        heard_back = await gateway.voice.asr.transcribe(turn.pcm, RATE)
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            metrics = (await http.get("/metrics")).text
    assert turn.transcript is not None and "tavern" in turn.transcript.lower()
    assert turn.turn_id.startswith("v-")
    assert turn.partials  # captions while the player spoke
    assert turn.text.strip() and turn.chunks and turn.spoken.is_set()
    assert [c.seq for c in turn.chunks] == list(range(len(turn.chunks)))
    assert turn.chunks[-1].final and not any(c.final for c in turn.chunks[:-1])
    for chunk in turn.chunks[:-1]:  # 40-80 ms each (a clause's last may be shorter)
        assert chunk.sample_rate == RATE
        assert len(chunk.pcm) / 2 / RATE <= 0.0805
    visemes = [v for c in turn.chunks for v in c.visemes]
    assert visemes, "no visemes for lip-sync"
    for chunk in turn.chunks:
        times = [v.t for v in chunk.visemes]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert all(0 <= t <= len(chunk.pcm) / 2 / RATE for t in times)
    # The audio says the reply: Whisper hears most of its words back.
    spoken, written = words(heard_back.text), words(turn.text)
    assert len(spoken & written) >= max(2, len(written) // 3), (heard_back.text, turn.text)
    stats = gateway.voice.stats
    assert stats.utterances == 1 and stats.traces
    hops = stats.traces[-1]
    assert list(hops) == ["asr_final", "first_token", "first_tts", "first_audio"]
    assert all(math.isfinite(v) and v >= 0 for v in hops.values())
    assert hops == dict(sorted(hops.items(), key=lambda kv: kv[1]))  # in pipeline order
    assert "mythic_voice_utterances_total 1.0" in metrics
    assert 'mythic_voice_first_audio_seconds{quantile="0.5"}' in metrics
    # The reply's prompt was prepared from the captions while the player spoke.
    assert gateway.cast.stats.warm_ups >= 1
    assert "mythic_warm_ups_total" in metrics
    assert 'mythic_reply_prompt_tokens_total{source="cached"}' in metrics


async def _first_audio(turn: VoiceTurn) -> None:
    async with asyncio.timeout(180):
        while not turn.chunks:
            if turn.spoken.is_set():
                raise AssertionError(f"the reply ended without audio: {turn.text!r}")
            await asyncio.sleep(0.02)


async def test_a_spoken_reply_ends_with_its_last_allowed_sentence(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with voice_talk(engines, settings, 300, max_tokens=120, spoken_max_sentences=1) as (
        address,
        gateway,
        client,
    ):
        turn = await client.talk("marla", await said(gateway, "Tell me about the old mill."))
        await turn.wait(180)
        capped = gateway.cast.stats.capped
        history = gateway.cast.actors["marla"].histories[client.session_id]
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            metrics = (await http.get("/metrics")).text
    text = turn.text.strip()
    # One sentence, said and spoken whole; the model had more to say and was stopped there.
    assert text and sentences_end(text + " ", 2) is None, text
    assert capped == 1, text
    assert "mythic_spoken_replies_capped_total 1.0" in metrics
    assert turn.chunks and turn.chunks[-1].final and turn.spoken.is_set()
    assert [m.content for m in history if m.role == "assistant"] == [text]


async def test_a_spoken_lines_tool_call_reaches_the_games_handler(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    calls: list[ToolCall] = []

    async def game(call: ToolCall) -> ToolResult:
        calls.append(call)
        return "ok", {"distance_m": 140}

    async with (
        voice_server(engines, settings, decide=True) as (address, gateway),
        MythicClient(
            f"ws://{address}/v1/ws", voice=VoiceFormat(binary=True), timeout_s=60,
            tool_handler=game,
        ) as client,
        asyncio.timeout(300),
    ):  # fmt: skip
        await client.scene("marla", zone="old_town", time="21:10", objects={"player": 1.2})
        line = "Which way to Blackfen Marsh? Set a waypoint to Blackfen Marsh for me."
        turn = await client.talk("marla", await said(gateway, line))
        await turn.wait(180)
        history = list(gateway.cast.actors["marla"].histories[client.session_id])
    # The call reached the game at once (not after the server's tool timeout), the turn
    # lists it, and the game's answer is what the NPC's history holds.
    assert [c.name for c in calls] == ["set_waypoint"], (turn.transcript, turn.text)
    assert turn.tool_calls == calls and calls[0].turn_id == turn.turn_id
    events = [m.content for m in history if m.content.startswith("Game event:")]
    assert len(events) == 1 and '-> ok {"distance_m": 140}' in events[0], events
    assert turn.spoken.is_set() and turn.chunks and turn.chunks[-1].final


async def test_speaking_over_the_npc_cuts_it_off_and_the_next_turn_knows(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    # A long story: no cap on the spoken reply's sentences.
    async with voice_talk(engines, settings, 400, max_tokens=80, spoken_max_sentences=0) as (
        _,
        gateway,
        client,
    ):
        first = await client.talk(
            "marla", await said(gateway, "Tell me a long story about the town.")
        )
        await _first_audio(first)
        # One utterance (a pause at a full stop or comma can split a line in two).
        interruption = await said(gateway, QUESTION)
        second = await client.talk("marla", interruption)
        await first.wait(120)
        await second.wait(180)
        assert gateway.voice is not None
        stats = gateway.voice.stats
        history = gateway.cast.actors["marla"].histories[client.session_id]
    assert isinstance(first.cutoff, Cutoff) and first.cutoff.reason == "barge_in"
    assert stats.barge_ins >= 1
    assert second.transcript is not None and sounds_like(second.transcript, QUESTION)
    assert second.text.strip() and second.chunks
    # The cut-off reply is in the history, marked, so the NPC's next turn knows; it holds the
    # words the player heard before cutting in (a start of what was written), no more.
    replies = [m.content for m in history if m.role == "assistant"]
    assert replies[0].endswith(INTERRUPTED_NOTE), replies
    kept = re.findall(r"[\w']+", replies[0].removesuffix(INTERRUPTED_NOTE))
    written = re.findall(r"[\w']+", first.text)
    assert kept == written[: len(kept)], (replies[0], first.text)
    assert len(kept) < len(written), (replies[0], first.text)


async def test_a_backchannel_does_not_interrupt(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with voice_talk(engines, settings, 400, max_tokens=80) as (_, gateway, client):
        first = await client.talk(
            "marla", await said(gateway, "Tell me about the Drowned Lantern.")
        )
        await _first_audio(first)
        for backchannel in ("Mm-hm.", "Yeah."):
            await client.talk("marla", await said(gateway, backchannel))
        await first.wait(180)
        assert gateway.voice is not None
        stats = gateway.voice.stats
        history = gateway.cast.actors["marla"].histories[client.session_id]
    # The NPC never stopped: no cut-off, its whole reply spoken and kept.
    assert first.cutoff is None and first.chunks[-1].final, (stats, first.text, history)
    assert stats.barge_ins == 0
    assert stats.backchannels + stats.no_words >= 1
    replies = [m.content for m in history if m.role == "assistant"]
    assert replies == [first.text.strip()], (replies, first.text)


async def test_a_pause_in_the_middle_of_a_sentence_does_not_end_the_line(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with voice_talk(engines, settings, 400) as (_, gateway, client):
        start = await said(gateway, "So I was wondering whether you could")
        rest = await said(gateway, "tell me where the old mill stands.")
        turn = await client.talk("marla", start + bytes(RATE * 2 * 7 // 10) + rest)
        await turn.wait(180)
        assert gateway.voice is not None
        stats = gateway.voice.stats
    # One line, both halves in it: the turn model heard that the first half was unfinished
    # (700 ms of silence: more than trailing_silence_ms, which alone would have cut it).
    assert turn.transcript is not None, turn
    assert "wondering" in turn.transcript.lower() and "mill" in turn.transcript.lower()
    assert stats.utterances == 1, stats
    # The pause's verdict ("not yet"), and a reply begun from its half and dropped when the
    # player went on, come when the machine transcribes the half within the pause; a slower
    # one waits for the verdict instead (turn_wait_ms): one line either way. Every reply begun
    # early was kept or dropped, and at most one (the whole line's) was kept.
    assert stats.preempted == stats.preempt_kept + stats.preempt_discarded <= 2, stats
    assert stats.preempt_kept <= 1 and stats.turn_verdicts["complete"] <= 1, stats
    assert turn.text.strip() and turn.spoken.is_set()


async def _error(client: MythicClient) -> Error:
    async with asyncio.timeout(30):
        while True:
            event = await client.events.get()
            if isinstance(event, Error):
                return event


async def test_bad_audio_gets_typed_errors_and_the_session_goes_on(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    import numpy as np

    async with (
        voice_server(engines, settings) as (address, gateway),
        MythicClient(f"ws://{address}/v1/ws", voice=VoiceFormat(), timeout_s=60) as client,
        MythicClient(f"ws://{address}/v1/ws", timeout_s=60) as text_only,
        asyncio.timeout(300),
    ):
        # A sample rate other than the session's.
        await client.send_audio("marla", bytes(640), sample_rate=48000)
        assert (await _error(client)).code == "bad_audio"
        # Odd-length PCM in a binary frame: refused by the codec.
        chunk = AudioChunk(
            npc_id="marla", session_id=client.session_id, pcm=bytes(4), sample_rate=RATE,
            ts_client=0.0,
        )  # fmt: skip
        assert client._ws is not None
        await client._ws.send(dump_audio_frame(chunk)[:-1])
        error = await _error(client)
        assert error.code == "invalid_message" and error.ref == "pcm"
        # Audio for an NPC the world does not have.
        await client.send_audio("nobody", bytes(640))
        assert (await _error(client)).code == "unknown_npc"
        # Audio on a session that did not open with voice.
        await text_only.send(chunk.model_copy(update={"session_id": text_only.session_id}))
        assert (await _error(text_only)).code == "voice_off"
        # Silence and noise alone make no line.
        rng = np.random.default_rng(0)
        noise = (rng.normal(0, 3000, RATE * 2)).clip(-32768, 32767).astype("<i2").tobytes()
        assert gateway.voice is not None
        before = gateway.voice.stats.utterances
        noisy = await client.talk("marla", bytes(RATE * 2 * 2) + noise, silence_ms=1000)
        # The session still talks, by voice and by text.
        turn = await client.talk("marla", await said(gateway, "Good evening to you Marla"))
        await turn.wait(180)
        # The channel hears its audio in order, so the noise was done with before that line
        # was heard: it made no line of its own (one line counted, and no transcript for it).
        assert gateway.voice.stats.utterances == before + 1
        assert noisy.transcript is None and not noisy.heard.is_set()
        reply = await (await client.say("marla", "And what news?")).reply()
    assert turn.transcript and turn.text.strip() and reply.strip()


def test_the_voice_helpers(monkeypatch: Any) -> None:
    from mythic.voice import Decimator, is_backchannel

    assert is_backchannel("Yeah.") and is_backchannel("mm-hm") and is_backchannel("I see")
    assert not is_backchannel("Yeah, but where is the mill?") and not is_backchannel("")
    import numpy as np

    t = np.arange(48000) / 48000
    tone = (np.sin(2 * np.pi * 440 * t) * 10000).astype("<i2").tobytes()
    decimate = Decimator(48000)
    out = b"".join(decimate(tone[i : i + 960 * 2]) for i in range(0, len(tone), 960 * 2))
    assert len(out) == 16000 * 2  # chunked, the sample count is exact
    back = np.frombuffer(out, dtype="<i2").astype(float)
    peak = np.abs(np.fft.rfft(back)).argmax()
    assert peak == 440  # the tone survives, at 1 Hz resolution
    del monkeypatch


async def test_a_client_that_stops_streaming_in_a_pause_is_still_heard(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A client that sends 200 ms of silence after the question and then nothing: the endpoint
    (300 ms of silence) never comes, so the stall (`speech.stall_ms`) ends the utterance."""
    async with voice_talk(engines, settings, 300, speech={"turn_detector": "silence"}) as (
        _,
        gateway,
        client,
    ):
        turn = await client.talk("marla", await said(gateway, QUESTION), silence_ms=200)
        await turn.wait(180)
    assert turn.transcript is not None and sounds_like(turn.transcript, QUESTION), turn.transcript
    assert turn.text.strip()


async def test_a_scenes_replies_are_spoken_each_in_its_npcs_voice_with_visemes(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """In a voice session a scene's replies stream as speech like any reply: the player's line
    to the NPC it names, then the NPCs' ambient exchange, each reply's TTSChunks in order (seq
    0, 1, ..., the last final) with visemes, under the reply's turn id and its NPC's id."""
    from mythic.contracts import TTSChunk

    async with (
        voice_server(engines, settings) as (address, _),
        MythicClient(
            f"ws://{address}/v1/ws", voice=VoiceFormat(binary=True), timeout_s=120
        ) as client,
        asyncio.timeout(600),
    ):
        scene = await client.start_scene("snug", ["marla", "captain_strand"], max_exchanges=0)
        talks = [await (await scene.say("Marla, is the fire lit tonight?")).wait()]
        talks.append(await (await scene.ambient(2, opener="captain_strand")).wait())
        replies = [r for t in talks for r in t.replies if r.text.strip()]
        assert replies and replies[0].npc_id == "marla", [t.replies for t in talks]
        assert any(r.npc_id == "captain_strand" for r in replies), [t.replies for t in talks]
        chunks: dict[str, list[TTSChunk]] = {}

        def spoken() -> bool:
            while not client.events.empty():
                event = client.events.get_nowait()
                if isinstance(event, TTSChunk):
                    chunks.setdefault(event.turn_id, []).append(event)
            return all(any(c.final for c in chunks.get(r.turn_id, [])) for r in replies)

        await until(spoken, timeout_s=300)
        await scene.end()
    for reply in replies:
        audio = chunks[reply.turn_id]
        assert {c.npc_id for c in audio} == {reply.npc_id}
        assert [c.seq for c in audio] == list(range(len(audio))), reply.turn_id
        assert audio[-1].final and not any(c.final for c in audio[:-1])
        assert all(c.pcm for c in audio[:-1]) and any(c.visemes for c in audio), reply.turn_id
