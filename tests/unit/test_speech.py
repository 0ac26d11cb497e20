"""mythic.speech without models: clauses, visemes, voices, PCM checks, endpointing on
synthetic frames, the listener's event order, and the worker pool's failure handling (with a
fake engine defined here, which the worker processes import by name)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from mythic import MissingExtraError, MythicError
from mythic.speech import (
    BUILTIN_VOICES,
    PHONEME_VISEMES,
    VISEMES,
    ASRPool,
    AudioFormatError,
    Endpointer,
    FinalTranscript,
    Listener,
    PartialTranscript,
    SileroVAD,
    SpeechBusyError,
    SpeechEnded,
    SpeechError,
    SpeechInputError,
    SpeechModelError,
    SpeechPaused,
    SpeechPoolClosedError,
    SpeechResumed,
    SpeechSettings,
    SpeechStarted,
    SpeechTimeoutError,
    SpeechWorkerError,
    Transcript,
    TTSPool,
    UnknownVoiceError,
    Viseme,
    VoiceProfile,
    Voices,
    split_clauses,
    viseme_for,
    viseme_track,
    voice_profile,
)
from mythic.speech._asr_worker import repeats_itself
from mythic.speech._audio import chunk_bounds
from mythic.speech._visemes import slice_track
from mythic.speech._workers import WorkerPool
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.unit

RATE = 16000


def silence(seconds: float) -> bytes:
    return bytes(2 * round(RATE * seconds))


def frames(count: int) -> float:
    """Seconds in `count` 32 ms VAD frames."""
    return count * 512 / RATE


def tone(seconds: float) -> bytes:
    """A loud square wave: speech, to `Loudness`."""
    period = (8000).to_bytes(2, "little", signed=True) * 20 + (-8000).to_bytes(
        2, "little", signed=True
    ) * 20
    samples = round(RATE * seconds)
    return (period * (samples // 40 + 1))[: 2 * samples]


class Loudness:
    """A stand-in for Silero VAD: a frame is speech when it is loud."""

    def probability(self, frame: bytes) -> float:
        return 1.0 if max(map(abs, memoryview(frame).cast("h"))) > 1000 else 0.0

    def reset(self) -> None:
        pass


def endpointer(**settings: Any) -> Endpointer:
    return Endpointer(SpeechSettings(**settings), detector=Loudness())


# -- clauses ----------------------------------------------------------------------------------


def test_short_sentences_are_clauses_of_their_own() -> None:
    assert split_clauses("Hello there.  Where is the mill?\nIt is north!") == [
        "Hello there.",
        "Where is the mill?",
        "It is north!",
    ]


def test_a_long_sentence_is_cut_at_commas_into_pieces_of_sensible_length() -> None:
    text = (
        "The mill is north of the river, past the old stone bridge, "
        "where the crows gather at dusk and the miller's ghost walks the weir."
    )
    clauses = split_clauses(text)
    assert clauses == [
        "The mill is north of the river,",
        "past the old stone bridge,",
        "where the crows gather at dusk and the miller's ghost walks the weir.",
    ]
    assert " ".join(clauses) == text


def test_short_pieces_join_their_neighbour() -> None:
    text = (
        "Yes, sir, at once, and I will bring the lantern, the rope, "
        "and the key to the old cellar door below."
    )
    assert len(text) > 90
    clauses = split_clauses(text)
    assert len(clauses) > 1
    assert clauses[0].startswith("Yes, sir, at once,")
    assert all(len(c) >= 16 for c in clauses)
    assert " ".join(clauses) == text


def test_a_sentence_without_punctuation_is_wrapped_at_spaces() -> None:
    text = " ".join(["word"] * 60)
    clauses = split_clauses(text)
    assert len(clauses) > 1
    assert all(len(c) <= 90 for c in clauses)
    assert " ".join(clauses) == text


def test_nothing_to_say_gives_no_clause() -> None:
    assert split_clauses("") == []
    assert split_clauses("  ... !? -- ") == []


def test_clause_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="min_chars"):
        split_clauses("Hi.", min_chars=50, max_chars=60)


# -- visemes ----------------------------------------------------------------------------------


def test_the_viseme_set_is_the_fifteen_oculus_visemes() -> None:
    assert len(VISEMES) == 15 == len(set(VISEMES))
    assert VISEMES[0] == "sil"
    assert set(PHONEME_VISEMES.values()) == set(VISEMES)


@pytest.mark.parametrize(
    ("phoneme", "viseme"),
    [
        ("p", "PP"),
        ("m", "PP"),
        ("f", "FF"),
        ("\u00f0", "TH"),
        ("t", "DD"),
        ("k", "kk"),
        ("\u0283", "CH"),
        ("s", "SS"),
        ("n", "nn"),
        ("\u0279", "RR"),
        ("\u00e6", "aa"),
        ("\u0259", "E"),
        ("\u026a", "ih"),
        ("o", "oh"),
        ("\u028a", "ou"),
        ("?", "sil"),
        ("^", "sil"),
    ],
)
def test_phonemes_map_to_visemes(phoneme: str, viseme: str) -> None:
    assert viseme_for(phoneme) == viseme


def test_stress_and_length_marks_hold_the_previous_shape() -> None:
    assert viseme_for("\u02c8") is None  # primary stress
    assert viseme_for("\u02d0") is None  # length
    assert viseme_for(" ") is None
    track = viseme_track([("m", 0.1), ("\u02c8", 0.05), ("a", 0.2), (" ", 0.05), ("a", 0.1)])
    assert track == [Viseme(0.0, "PP"), Viseme(pytest.approx(0.15), "aa")]


def test_a_track_starts_silent_and_never_repeats_a_label() -> None:
    track = viseme_track([("^", 0.05), ("s", 0.1), ("z", 0.1), ("o", 0.2), ("$", 0.1)])
    assert [v.label for v in track] == ["sil", "SS", "oh", "sil"]
    times = [v.t for v in track]
    assert times == sorted(set(times))


def test_a_slice_is_relative_to_its_chunk_and_starts_with_the_current_shape() -> None:
    track = [Viseme(0.0, "sil"), Viseme(0.03, "PP"), Viseme(0.07, "aa"), Viseme(0.2, "sil")]
    first = slice_track(track, 0.0, 0.06)
    second = slice_track(track, 0.06, 0.12)
    assert first == (Viseme(0.0, "sil"), Viseme(0.03, "PP"))
    assert second == (Viseme(0.0, "PP"), Viseme(pytest.approx(0.01), "aa"))
    assert slice_track(track, 0.12, 0.18) == (Viseme(0.0, "aa"),)
    # A mark that rounds onto the chunk's end opens the next chunk instead.
    edge = [Viseme(0.0, "sil"), Viseme(0.05999996, "PP")]
    assert slice_track(edge, 0.0, 0.06) == (Viseme(0.0, "sil"),)
    assert slice_track(edge, 0.06, 0.12) == (Viseme(0.0, "PP"),)


# -- chunks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ms", [40, 41, 79, 80, 81, 99, 100, 159, 1000, 2345])
@pytest.mark.parametrize("chunk_ms", [40, 60, 80])
def test_chunks_are_40_to_80_ms_and_cover_everything(ms: int, chunk_ms: int) -> None:
    rate = 22050
    samples = rate * ms // 1000
    bounds = chunk_bounds(samples, rate, chunk_ms)
    assert bounds[0][0] == 0 and bounds[-1][1] == samples
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    for start, end in bounds:
        assert rate * 0.040 - 1 <= end - start <= rate * 0.080 + 1


def test_audio_shorter_than_a_chunk_is_one_chunk() -> None:
    assert chunk_bounds(100, 22050, 60) == [(0, 100)]
    assert chunk_bounds(0, 22050, 60) == []


# -- voices -----------------------------------------------------------------------------------


def test_every_archetype_has_a_voice() -> None:
    voices = Voices()
    for archetype in ("human", "vampire", "zombie", "lich", "werewolf", "ghoul"):
        assert voices.get(archetype).voice_id == archetype
    monsters = [voices.get(a) for a in ("vampire", "zombie", "lich", "werewolf", "ghoul")]
    assert all(v.sox_args() for v in monsters)
    assert voices.get("human").sox_args() == []


def test_the_example_world_voices_resolve() -> None:
    voices = Voices()
    for card in (EXAMPLE_WORLD / "npcs").glob("*.yaml"):
        data = yaml.safe_load(card.read_text())
        profile = voices.for_npc(data.get("voice_id"), data.get("archetype"))
        assert profile.voice_id == data.get("voice_id", data.get("archetype"))


def test_an_unknown_voice_is_a_typed_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownVoiceError) as info:
        voice_profile("baritone_99")
    assert isinstance(info.value, SpeechError)
    assert isinstance(info.value, MythicError)
    assert "vampire" in str(info.value)
    assert info.value.voice_id == "baritone_99"
    with pytest.raises(UnknownVoiceError):
        Voices().for_npc("nobody", "vampire")


def test_an_npc_without_a_voice_id_gets_its_archetype_or_human() -> None:
    voices = Voices()
    assert voices.for_npc(None, "zombie").voice_id == "zombie"
    assert voices.for_npc(None, "gargoyle").voice_id == "human"
    assert voices.for_npc(None).voice_id == "human"


def test_voices_can_be_added_per_npc() -> None:
    voices = Voices()
    marla = voices.get("human").model_copy(update={"voice_id": "marla", "pitch_semitones": 3.0})
    voices.add(marla)
    assert voices.get("marla").sox_args() == ["pitch", "300"]
    with pytest.raises(ValueError, match="already"):
        voices.add(marla)
    voices.add(marla, replace=True)
    assert len(voices) == len(BUILTIN_VOICES) + 1


@pytest.mark.parametrize(
    "effects",
    [
        [["noiseprof", "/tmp/x"]],  # writes a file
        [["reverb", "/etc/passwd"]],
        [["reverb", "50; rm -rf /"]],
        [["tempo", "0.8"]],  # changes the timing: use rate
        [[]],
    ],
)
def test_effects_are_checked(effects: list[list[str]]) -> None:
    with pytest.raises(ValidationError):
        VoiceProfile(voice_id="x", effects=effects)  # type: ignore[arg-type]


def test_profile_values_are_bounded() -> None:
    with pytest.raises(ValidationError):
        VoiceProfile(voice_id="x", rate=5.0)
    with pytest.raises(ValidationError):
        VoiceProfile(voice_id="X Y")
    with pytest.raises(ValidationError):
        VoiceProfile(voice_id="x", espeak_voice="en; rm")
    for variation in (-0.1, 2.5, float("nan")):
        with pytest.raises(ValidationError):
            VoiceProfile(voice_id="x", variation=variation)
    assert VoiceProfile(voice_id="x", variation=0).variation == 0.0


# -- settings ---------------------------------------------------------------------------------


def test_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        SpeechSettings(chunk_ms=20)
    with pytest.raises(ValidationError):
        SpeechSettings(vad_threshold=0.3, vad_release=0.6)
    with pytest.raises(ValidationError):
        SpeechSettings(asr_workers=0)
    assert SpeechSettings().trailing_silence_ms == 300


def test_the_early_final_must_come_before_the_endpoint() -> None:
    assert SpeechSettings().early_final_ms == 128
    with pytest.raises(ValidationError, match=r"early_final_ms \(300\) must be below"):
        SpeechSettings(early_final_ms=300)
    with pytest.raises(ValidationError, match="early_final_ms"):
        SpeechSettings(trailing_silence_ms=100)  # below the default early final
    with pytest.raises(ValidationError):
        SpeechSettings(early_final_ms=-1)
    assert SpeechSettings(trailing_silence_ms=100, early_final_ms=0).early_final_ms == 0
    assert SpeechSettings(trailing_silence_ms=400, early_final_ms=399).early_final_ms == 399


# -- bad input --------------------------------------------------------------------------------


async def test_bad_pcm_is_a_typed_error_before_any_worker_is_needed() -> None:
    asr = ASRPool()  # not started: the input is checked first
    with pytest.raises(AudioFormatError, match="odd"):
        await asr.transcribe(b"\x00\x00\x00", 16000)
    with pytest.raises(AudioFormatError, match="16000"):
        await asr.transcribe(silence(0.1), 44100)
    with pytest.raises(AudioFormatError, match="30 s"):
        await asr.transcribe(silence(31), 16000)
    with pytest.raises(AudioFormatError):
        await asr.transcribe("text", 16000)  # type: ignore[arg-type]
    empty = await asr.transcribe(b"", 16000)
    assert empty.text == "" and empty.empty
    with pytest.raises(SpeechPoolClosedError):
        await asr.transcribe(silence(0.5), 16000)
    detector = endpointer()
    with pytest.raises(AudioFormatError, match="odd"):
        detector.feed(b"\x01")


def test_tts_requests_are_checked_at_once() -> None:
    tts = TTSPool()
    with pytest.raises(UnknownVoiceError):
        tts.synthesize("Hello.", "no_such_voice")
    with pytest.raises(SpeechInputError):
        tts.synthesize("x" * 5000, "human")
    with pytest.raises(SpeechInputError):
        tts.synthesize(b"Hello", "human")  # type: ignore[arg-type]
    with pytest.raises(SpeechPoolClosedError):
        tts.synthesize("Hello.", "human")


def test_a_missing_extra_names_the_speech_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtraError) as info:
        SileroVAD(Path("unused.onnx"))
    assert info.value.extra == "speech"


# -- endpointing ------------------------------------------------------------------------------


def test_silence_only_is_no_utterance() -> None:
    ep = endpointer()
    assert ep.feed(silence(5.0)) == []
    assert ep.flush() == []


def test_one_utterance_between_silences() -> None:
    ep = endpointer()
    events = ep.feed(silence(1.0) + tone(1.0) + silence(1.0))
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechEnded]
    started, _, ended = events
    assert isinstance(started, SpeechStarted) and isinstance(ended, SpeechEnded)
    assert started.at_s == pytest.approx(1.0, abs=0.04)
    assert ended.at_s == pytest.approx(2.0, abs=0.04)
    assert ended.reason == "silence"
    # The speech plus about 200 ms of padding either side.
    assert ended.duration_s == pytest.approx(1.4, abs=0.1)


def test_a_blip_shorter_than_min_speech_is_no_utterance() -> None:
    ep = endpointer()
    assert ep.feed(silence(0.5) + tone(0.1) + silence(1.0)) == []


def test_a_pause_shorter_than_the_trailing_silence_keeps_one_utterance() -> None:
    ep = endpointer()
    events = ep.feed(tone(0.5) + silence(0.2) + tone(0.5) + silence(1.0))
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechPaused, SpeechEnded]
    events = ep.feed(tone(0.5) + silence(0.6) + tone(0.5) + silence(1.0))
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechEnded] * 2


def test_a_pause_comes_after_early_final_ms_of_silence_with_the_audio_so_far() -> None:
    ep = endpointer()  # 32 ms frames: speech_pad_ms 200 is 6, early_final_ms 128 is 4
    audio = silence(frames(32)) + tone(frames(32)) + silence(frames(20))
    events = ep.feed(audio[: 67 * 1024])  # 3 frames of silence after the speech
    assert [type(e) for e in events] == [SpeechStarted]
    assert not ep.paused
    (paused,) = ep.feed(audio[67 * 1024 : 68 * 1024])  # the 4th
    assert isinstance(paused, SpeechPaused) and ep.paused and ep.in_speech
    assert paused.started_s == pytest.approx(frames(32))
    assert paused.at_s == pytest.approx(frames(64))
    # 6 frames of padding before the speech, 4 (early_final_ms) of silence after it.
    assert paused.pcm == audio[26 * 1024 : 68 * 1024]
    assert paused.duration_s == pytest.approx(frames(42))
    (ended,) = ep.feed(audio[68 * 1024 :])  # the 9th silent frame is the endpoint
    assert isinstance(ended, SpeechEnded) and ended.reason == "silence"
    assert (ended.at_s, ended.started_s) == (paused.at_s, paused.started_s)
    assert ended.pcm == audio[26 * 1024 : 70 * 1024]
    assert not ep.paused


def test_each_pause_in_an_utterance_is_an_event() -> None:
    ep = endpointer()
    audio = tone(frames(20)) + silence(frames(5)) + tone(frames(10)) + silence(frames(12))
    events = ep.feed(audio)
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechPaused, SpeechEnded]
    _, first, second, ended = events
    assert isinstance(first, SpeechPaused) and isinstance(second, SpeechPaused)
    assert first.at_s == pytest.approx(frames(20))
    assert second.at_s == pytest.approx(frames(35))
    assert second.started_s == first.started_s
    assert second.pcm == audio[: 39 * 1024]  # the speech after the first pause included
    assert isinstance(ended, SpeechEnded) and ended.at_s == second.at_s


def test_a_pause_needs_no_more_than_the_speech_pad() -> None:
    ep = endpointer(speech_pad_ms=64, early_final_ms=160)  # 2 frames of pad, 5 of pause
    audio = tone(frames(10)) + silence(frames(12))
    _, paused, ended = ep.feed(audio)
    assert isinstance(paused, SpeechPaused) and isinstance(ended, SpeechEnded)
    assert paused.pcm == audio[: 12 * 1024] == ended.pcm


def test_no_pause_when_the_early_final_is_off_or_in_push_to_talk() -> None:
    ep = endpointer(early_final_ms=0)
    events = ep.feed(tone(1.0) + silence(0.25))
    assert [type(e) for e in events] == [SpeechStarted]
    assert not ep.paused
    assert [type(e) for e in ep.feed(silence(1.0))] == [SpeechEnded]
    ptt = Endpointer(SpeechSettings(), detector=Loudness(), push_to_talk=True)
    ptt.press()
    assert [type(e) for e in ptt.feed(tone(1.0) + silence(1.0) + tone(0.5))] == [SpeechStarted]
    assert not ptt.paused
    assert [type(e) for e in ptt.release()] == [SpeechEnded]


def test_a_long_utterance_is_cut_at_the_maximum() -> None:
    ep = endpointer(max_utterance_s=1.0)
    events = ep.feed(tone(2.5) + silence(1.0))
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    assert ended[0].reason == "max_length"
    assert ended[0].duration_s <= 1.0 + 0.05
    assert len(ended) >= 2


def test_audio_in_odd_sized_pieces_gives_the_same_events() -> None:
    audio = silence(0.7) + tone(0.8) + silence(0.9)
    whole = endpointer().feed(audio)
    ep = endpointer()
    pieces: list[Any] = []
    for i in range(0, len(audio), 158):
        pieces += ep.feed(audio[i : i + 158])
    assert pieces == whole


def test_flush_ends_an_open_utterance() -> None:
    ep = endpointer()
    events = ep.feed(silence(0.5) + tone(1.0))
    assert [type(e) for e in events] == [SpeechStarted]
    assert ep.in_speech
    assert ep.utterance_pcm()
    (ended,) = ep.flush()
    assert isinstance(ended, SpeechEnded) and ended.reason == "flush"
    assert not ep.in_speech


def test_push_to_talk_press_and_release_delimit_the_utterance() -> None:
    ep = Endpointer(SpeechSettings(), detector=Loudness(), push_to_talk=True)
    assert ep.feed(tone(1.0)) == []  # not pressed: not heard
    ep.press()
    events = ep.feed(silence(0.32) + tone(0.64) + silence(0.32))
    assert [type(e) for e in events] == [SpeechStarted]
    (ended,) = ep.release()
    assert isinstance(ended, SpeechEnded) and ended.reason == "release"
    assert ended.duration_s == pytest.approx(1.28, abs=0.001)  # all of it, silence included
    ep.press()
    ep.feed(silence(1.0))
    assert ep.release() == []  # pressed, but nothing said
    with pytest.raises(RuntimeError):
        endpointer().press()


# -- the listener, on a fake recogniser -------------------------------------------------------


class FakeASR:
    """Transcribes instantly: the text says how much audio it got."""

    turn_model = None  # no turn model: turns end on silence alone

    def __init__(self, settings: SpeechSettings) -> None:
        self.settings = settings
        self.partials = 0

    async def transcribe(
        self, pcm: bytes, sample_rate: int, *, partial: bool = False
    ) -> Transcript:
        await asyncio.sleep(0)
        self.partials += partial
        seconds = len(pcm) / (2 * sample_rate)
        return Transcript(f"{seconds:.2f} s", "en", seconds, 0.0, partial)


async def test_listener_events_come_in_order_with_partials_then_the_final() -> None:
    settings = SpeechSettings(partial_interval_ms=200)
    asr = FakeASR(settings)
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        audio = silence(0.5) + tone(1.5) + silence(0.6) + tone(0.6) + silence(0.6)
        for i in range(0, len(audio), 640):  # 20 ms packets, as a client sends them
            listener.feed(audio[i : i + 640])
            await asyncio.sleep(0)  # let the partial tasks run
        listener.end()
        async with asyncio.timeout(5):
            events = [event async for event in listener]
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("SpeechStarted") == kinds.count("SpeechEnded") == 2
    assert kinds.count("FinalTranscript") == 2
    assert kinds[0] == "SpeechStarted" and kinds[-1] == "FinalTranscript"
    first_end = kinds.index("SpeechEnded")
    partials = [e for e in events[:first_end] if isinstance(e, PartialTranscript)]
    assert len(partials) >= 3
    assert all(p.utterance == 1 and p.transcript.partial for p in partials)
    finals = [e for e in events if isinstance(e, FinalTranscript)]
    assert [f.utterance for f in finals] == [1, 2]
    # The final is the early one, of the audio at the pause.
    (paused,) = [e for e in events[:first_end] if isinstance(e, SpeechPaused)]
    assert finals[0].early
    assert finals[0].transcript.duration_s == pytest.approx(paused.duration_s)
    assert kinds.index("FinalTranscript") > first_end


async def test_the_client_can_end_an_utterance_and_listening_goes_on() -> None:
    asr = FakeASR(SpeechSettings(partials=False))
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        listener.feed(silence(0.3) + tone(1.0))
        listener.end_utterance()  # no trailing silence: the client's own endpoint
        listener.feed(silence(0.3) + tone(1.0) + silence(1.0))
        listener.end()
        async with asyncio.timeout(5):
            events = [event async for event in listener]
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    assert [e.reason for e in ended] == ["flush", "silence"]
    assert [type(e) for e in events].count(FinalTranscript) == 2


async def test_a_failed_final_is_an_empty_transcript_with_the_error() -> None:
    class BrokenASR(FakeASR):
        async def transcribe(
            self, pcm: bytes, sample_rate: int, *, partial: bool = False
        ) -> Transcript:
            raise SpeechWorkerError("the worker died")

    asr = BrokenASR(SpeechSettings(partials=False))
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        listener.feed(tone(1.0) + silence(1.0))
        listener.end()
        async with asyncio.timeout(5):
            events = [event async for event in listener]
    final = events[-1]
    assert isinstance(final, FinalTranscript)
    assert final.transcript.text == "" and isinstance(final.error, SpeechWorkerError)


class RecordingASR(FakeASR):
    """Records each request; with `hold`, finals wait until `go` is set."""

    def __init__(self, settings: SpeechSettings, *, hold: bool = False) -> None:
        super().__init__(settings)
        self.calls: list[tuple[bytes, bool]] = []  # (pcm, partial), in the order asked
        self.cancelled = 0
        self.final_asked = asyncio.Event()
        self.go = asyncio.Event()
        if not hold:
            self.go.set()

    async def transcribe(
        self, pcm: bytes, sample_rate: int, *, partial: bool = False
    ) -> Transcript:
        self.calls.append((pcm, partial))
        try:
            if not partial:
                self.final_asked.set()
                await self.go.wait()
            return await super().transcribe(pcm, sample_rate, partial=partial)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    @property
    def finals(self) -> list[bytes]:
        return [pcm for pcm, partial in self.calls if not partial]

    async def asked(self) -> None:
        """Wait until a final has been asked for."""
        async with asyncio.timeout(5):
            await self.final_asked.wait()


async def read_all(listener: Listener) -> list[Any]:
    async with asyncio.timeout(5):
        return [event async for event in listener]


@pytest.mark.parametrize("end", ["silence", "end_utterance", "end"])
async def test_after_a_pause_with_no_more_speech_the_early_transcript_is_the_final(
    end: str,
) -> None:
    asr = RecordingASR(SpeechSettings(partials=False), hold=True)
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        listener.feed(silence(0.5) + tone(1.0) + silence(0.2))
        await asr.asked()  # the early final runs while the silence goes on
        if end == "silence":
            listener.feed(silence(1.0))
        elif end == "end_utterance":
            listener.end_utterance()
        listener.end()
        asr.go.set()  # it was still running at the endpoint: the listener waits for it
        events = await read_all(listener)
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechEnded, FinalTranscript]
    _, paused, ended, final = events
    assert ended.reason == ("silence" if end == "silence" else "flush")
    assert asr.finals == [paused.pcm]  # asked once, for the audio at the pause
    assert final.early and final.error is None and final.ended is ended
    assert final.transcript.duration_s == pytest.approx(paused.duration_s)


async def test_speech_after_a_pause_drops_the_early_transcript() -> None:
    asr = RecordingASR(SpeechSettings(partials=False), hold=True)
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        listener.feed(silence(0.5) + tone(1.0) + silence(0.2))
        await asr.asked()
        listener.feed(tone(0.5))  # the player goes on: the early final is cancelled
        listener.end_utterance()  # the client's endpoint, before any pause
        listener.end()
        asr.go.set()
        events = await read_all(listener)
    assert asr.cancelled == 1
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechEnded, FinalTranscript]
    _, paused, resumed, ended, final = events
    assert resumed.utterance == 1
    assert asr.finals == [paused.pcm, ended.pcm]
    assert not final.early
    assert final.transcript.duration_s == pytest.approx(ended.duration_s)
    assert ended.duration_s > paused.duration_s + 0.5


async def test_a_new_pause_replaces_the_early_transcript_of_the_last() -> None:
    asr = RecordingASR(SpeechSettings(partials=False), hold=True)
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        listener.feed(tone(1.0) + silence(0.2) + tone(1.0) + silence(0.2))
        await asr.asked()  # one feed: the first pause's was dropped before it started
        listener.feed(silence(1.0))
        listener.end()
        asr.go.set()
        events = await read_all(listener)
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechPaused, SpeechEnded, FinalTranscript]
    second, final = events[2], events[-1]
    assert asr.finals == [second.pcm]
    assert final.early and final.transcript.duration_s == pytest.approx(second.duration_s)


async def test_no_partial_after_a_pause_until_speech_goes_on() -> None:
    asr = RecordingASR(SpeechSettings(partial_interval_ms=100))
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        audio = silence(0.3) + tone(1.0) + silence(0.29) + tone(1.0) + silence(1.0)
        for i in range(0, len(audio), 640):
            listener.feed(audio[i : i + 640])
            await asyncio.sleep(0)
        listener.end()
        events = await read_all(listener)
    kinds = [type(e) for e in events]
    assert kinds.count(SpeechPaused) == 2 and kinds.count(FinalTranscript) == 1
    partials = [partial for _, partial in asr.calls]
    first, second = (i for i, partial in enumerate(partials) if not partial)
    # Partials stop at the first pause, start again with the speech after it, stop at the
    # second; none is heard while a pause lasts.
    assert partials[first + 1 : second] and all(partials[first + 1 : second])
    assert partials[second + 1 :] == []
    paused_at = [i for i, kind in enumerate(kinds) if kind is SpeechPaused]
    assert PartialTranscript not in kinds[paused_at[1] :]
    final = events[-1]
    assert final.early and asr.finals[-1] == events[paused_at[1]].pcm


async def test_push_to_talk_has_no_early_final() -> None:
    asr = RecordingASR(SpeechSettings(partials=False))
    listener = Listener(asr, detector=Loudness(), push_to_talk=True)  # type: ignore[arg-type]
    async with listener:
        listener.press()
        listener.feed(tone(1.0) + silence(1.0))
        listener.release()
        listener.end()
        events = await read_all(listener)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded, FinalTranscript]
    assert asr.finals == [events[1].pcm] and not events[-1].early


async def test_closing_cancels_a_running_early_transcript() -> None:
    asr = RecordingASR(SpeechSettings(partials=False), hold=True)
    listener = Listener(asr, detector=Loudness())  # type: ignore[arg-type]
    listener.feed(tone(1.0) + silence(0.2))
    await asr.asked()
    await listener.aclose()
    assert asr.cancelled == 1
    assert [type(e) for e in await read_all(listener)] == [SpeechStarted, SpeechPaused]


# -- the worker pool, with a fake engine ------------------------------------------------------


class FakeEngine:
    """Runs inside the worker processes of the tests below (they import this module)."""

    def __init__(self, config: dict[str, Any]) -> None:
        if config.get("fail"):
            raise SpeechModelError("no such model")
        self.info = {"pid": os.getpid()}

    def run(self, payload: dict[str, Any], cancelled: Callable[[], bool]) -> Iterator[Any]:
        op = payload["op"]
        if op == "echo":
            yield from range(payload["items"])
        elif op == "endless":
            n = 0
            while not cancelled():
                yield n
                n += 1
        elif op == "bad_input":
            raise AudioFormatError("odd bytes")
        elif op == "bug":
            raise KeyError("oops")
        elif op == "crash":
            yield "first"
            os._exit(3)
        elif op == "hang":
            threading.Event().wait()


def load(config: dict[str, Any]) -> FakeEngine:
    return FakeEngine(config)


def fake_pool(size: int = 1, **config: Any) -> WorkerPool:
    return WorkerPool("fake", __name__, config, size=size, start_timeout_s=30)


async def run_job(pool: WorkerPool, payload: dict[str, Any], timeout_s: float = 10) -> list[Any]:
    job = await pool.submit(payload, wait=True, timeout_s=timeout_s)
    items = []
    while True:
        more, item = await job.next(timeout_s)
        if not more:
            return items
        items.append(item)


async def test_worker_pool_serves_jobs_and_passes_typed_errors_back() -> None:
    pool = fake_pool()
    await pool.start()
    try:
        assert await run_job(pool, {"op": "echo", "items": 3}) == [0, 1, 2]
        with pytest.raises(AudioFormatError, match="odd bytes"):
            await run_job(pool, {"op": "bad_input"})
        with pytest.raises(SpeechWorkerError, match="KeyError"):
            await run_job(pool, {"op": "bug"})
        assert await run_job(pool, {"op": "echo", "items": 1}) == [0]
        assert pool.restarts == 0
    finally:
        await pool.close()
    assert pool.pids == []
    with pytest.raises(SpeechPoolClosedError):
        await run_job(pool, {"op": "echo", "items": 1})


async def test_a_worker_that_dies_fails_its_job_and_is_replaced() -> None:
    pool = fake_pool()
    await pool.start()
    try:
        (before,) = pool.pids
        job = await pool.submit({"op": "crash"}, wait=True, timeout_s=10)
        assert await job.next(10) == (True, "first")
        with pytest.raises(SpeechWorkerError, match="exited"):
            await job.next(10)
        assert await run_job(pool, {"op": "echo", "items": 2}) == [0, 1]
        assert pool.restarts == 1 and pool.pids != [before]
        os.kill(pool.pids[0], signal.SIGKILL)  # killed from outside while idle
        try:
            items = await run_job(pool, {"op": "echo", "items": 1})
        except SpeechWorkerError:
            # Handed out before its death was seen: a typed, retryable error, and the
            # next job runs on the replacement.
            items = await run_job(pool, {"op": "echo", "items": 1})
        assert items == [0]
        assert pool.restarts == 2
    finally:
        await pool.close()


async def test_a_worker_that_hangs_times_out_and_is_replaced() -> None:
    pool = fake_pool()
    await pool.start()
    try:
        with pytest.raises(SpeechTimeoutError):
            await run_job(pool, {"op": "hang"}, timeout_s=1)
        assert await run_job(pool, {"op": "echo", "items": 1}) == [0]
        assert pool.restarts == 1
    finally:
        await pool.close()


async def test_a_cancelled_job_stops_and_frees_its_worker() -> None:
    pool = fake_pool()
    await pool.start()
    try:
        job = await pool.submit({"op": "endless"}, wait=True, timeout_s=10)
        assert await job.next(10) == (True, 0)
        job.cancel()
        assert await job.next(10) == (False, None)
        # One worker: this only runs once the endless job has stopped.
        assert await run_job(pool, {"op": "echo", "items": 2}) == [0, 1]
    finally:
        await pool.close()


async def test_a_busy_pool_refuses_at_once_when_asked_not_to_wait() -> None:
    pool = fake_pool()
    await pool.start()
    try:
        job = await pool.submit({"op": "endless"}, wait=True, timeout_s=10)
        with pytest.raises(SpeechBusyError):
            await pool.submit({"op": "echo", "items": 1}, wait=False, timeout_s=10)
        with pytest.raises(SpeechBusyError):
            await pool.submit({"op": "echo", "items": 1}, wait=True, timeout_s=0.2)
        job.cancel()
    finally:
        await pool.close()


async def test_a_worker_that_cannot_load_fails_the_start_with_its_error() -> None:
    pool = fake_pool(fail=True)
    with pytest.raises(SpeechModelError, match="no such model"):
        await pool.start()
    assert pool.pids == []


@pytest.mark.parametrize(
    ("text", "repeats"),
    [
        ("Where is the old mill?", False),
        ("What is your name? What is your name? What", True),  # a short window's loop
        ("Where's the old mill? Where's the old mill?", True),
        ("What do you know about the catechololololo", True),  # a stutter
        ("the bell the bell the bell", True),  # two words, three times
        ("very very good", False),
        ("I said go, go, go!", False),
        ("no no no", False),
        (" ".join(["the mill is north of the river"] * 6), True),  # zlib: Whisper's own test
        (
            "The mill stands north of the river, past the old stone bridge. "
            "Nobody has ground grain there since the miller vanished.",
            False,
        ),
        ("", False),
    ],
)
def test_a_transcript_that_repeats_itself_is_found(text: str, repeats: bool) -> None:
    assert repeats_itself(text) is repeats
