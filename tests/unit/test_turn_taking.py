"""Turn-taking without models: the endpoint in turn mode (the turn model's verdicts), the
listener's verdict, early transcript and resume events, word timings of synthesised speech,
what a listener heard of a reply, preemptive replies' gate, backchannels and the settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from mythic.config import SpeechSettings
from mythic.dialogue import Hold
from mythic.knowledge import TurnTaking, WorldLoadError, load_world
from mythic.speech import (
    EarlyTranscript,
    Endpointer,
    FinalTranscript,
    Listener,
    SpeechEnded,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    Transcript,
    TurnPredicted,
)
from mythic.speech._tts_worker import word_ends
from mythic.voice._hub import is_backchannel, same_words
from tests.unit.test_speech import Loudness, frames, silence, tone

pytestmark = pytest.mark.unit


def turn_endpointer(**settings: Any) -> Endpointer:
    return Endpointer(SpeechSettings(**settings), detector=Loudness(), turn=True)


# -- the endpoint in turn mode ----------------------------------------------------------------


def test_a_finished_verdict_ends_the_utterance_at_the_pause() -> None:
    ep = turn_endpointer()  # the pause after 4 silent frames (early_final_ms 128)
    events = ep.feed(tone(frames(32)) + silence(frames(4)))
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused]
    (ended,) = ep.verdict(True)
    assert isinstance(ended, SpeechEnded) and ended.reason == "turn"
    assert ended.at_s == events[1].at_s
    assert not ep.in_speech and ep.feed(silence(2.0)) == []


def test_not_yet_lets_the_silence_go_on_to_turn_wait_ms() -> None:
    ep = turn_endpointer(turn_wait_ms=1024)  # 32 frames
    ep.feed(tone(frames(32)) + silence(frames(4)))
    assert ep.verdict(False) == []
    # Past trailing_silence_ms (300) the utterance is still open ...
    assert ep.feed(silence(frames(20))) == [] and ep.in_speech
    # ... and ends at turn_wait_ms of silence.
    (ended,) = ep.feed(silence(frames(8)))
    assert isinstance(ended, SpeechEnded) and ended.reason == "silence"


def test_a_pause_without_a_verdict_waits_and_a_failed_one_falls_back_to_silence() -> None:
    ep = turn_endpointer(turn_wait_ms=1024)
    ep.feed(tone(frames(32)) + silence(frames(12)))  # 384 ms: past trailing_silence_ms
    assert ep.in_speech  # no verdict yet: waiting for it
    (ended,) = ep.verdict(None)  # the model failed: the silence has been long enough
    assert isinstance(ended, SpeechEnded) and ended.reason == "silence"


def test_speech_after_the_pause_makes_its_verdict_stale() -> None:
    ep = turn_endpointer(turn_wait_ms=1024)
    ep.feed(tone(frames(32)) + silence(frames(5)))
    ep.verdict(False)
    events = ep.feed(tone(frames(16)))  # the player goes on
    assert events == [] and ep.in_speech and not ep.paused
    assert ep.verdict(True) == []  # the old pause's verdict, come late: ignored
    (paused,) = ep.feed(silence(frames(4)))
    assert isinstance(paused, SpeechPaused)
    # The new pause waits for its own verdict: not ended at trailing_silence_ms.
    assert ep.feed(silence(frames(10))) == []
    (ended,) = ep.verdict(True)
    assert ended.reason == "turn" and ended.at_s == paused.at_s


def test_without_turn_mode_the_verdict_does_nothing() -> None:
    ep = Endpointer(SpeechSettings(), detector=Loudness())
    ep.feed(tone(frames(32)) + silence(frames(4)))
    assert ep.verdict(True) == [] and ep.in_speech
    with pytest.raises(ValueError, match="early_final_ms"):
        Endpointer(SpeechSettings(early_final_ms=0), detector=Loudness(), turn=True)


# -- the listener with a turn model -----------------------------------------------------------


class TurnASR:
    """A stand-in recogniser with a turn model: audio at least `done_s` long is a finished
    turn; the transcript says how much audio it got."""

    turn_model = "smart-turn.onnx"

    def __init__(self, done_s: float) -> None:
        self.settings = SpeechSettings(partials=False, turn_wait_ms=1024)
        self.done_s = done_s
        self.verdicts: list[float] = []

    async def transcribe(
        self,
        pcm: bytes,
        sample_rate: int,
        *,
        partial: bool = False,
        on_turn: Callable[[float], None] | None = None,
        on_text: Callable[[Transcript], None] | None = None,
    ) -> Transcript:
        seconds = len(pcm) / (2 * sample_rate)
        await asyncio.sleep(0.01)
        transcript = Transcript(f"{seconds:.2f} s", "en", seconds, 0.0, partial)
        if on_turn is not None:  # as the worker: the transcript, then the verdict
            if on_text is not None:
                on_text(transcript)
            await asyncio.sleep(0.01)
            p = 0.9 if seconds >= self.done_s else 0.1
            self.verdicts.append(p)
            on_turn(p)
        return transcript


async def listen(asr: TurnASR, audio: bytes) -> list[Any]:
    async with Listener(asr, detector=Loudness()) as listener:  # type: ignore[arg-type]
        assert listener.turn
        for i in range(0, len(audio), 640):  # 20 ms packets at real-time pace, 50x faster
            listener.feed(audio[i : i + 640])
            await asyncio.sleep(0.0004)
        await asyncio.sleep(0.1)
        listener.end()
        async with asyncio.timeout(5):
            return [event async for event in listener]


async def test_a_finished_turn_ends_at_its_pause_before_trailing_silence() -> None:
    events = await listen(TurnASR(done_s=0.5), tone(1.0) + silence(2.0))
    kinds = [type(e) for e in events]
    assert kinds == [
        SpeechStarted,
        SpeechPaused,
        EarlyTranscript,
        TurnPredicted,
        SpeechEnded,
        FinalTranscript,
    ]
    early, verdict, ended, final = events[2:]
    assert early.transcript == final.transcript
    assert verdict.complete and verdict.probability == 0.9 and verdict.took_s >= 0
    assert ended.reason == "turn" and final.early


async def test_a_mid_sentence_pause_is_not_a_turn_and_the_early_reply_is_withdrawn() -> None:
    # 1.0 s of speech, a 600 ms pause (the model: not finished), 0.8 s more, then silence.
    asr = TurnASR(done_s=1.5)
    events = await listen(asr, tone(1.0) + silence(0.6) + tone(0.8) + silence(2.0))
    kinds = [type(e) for e in events]
    assert kinds.count(SpeechStarted) == kinds.count(SpeechEnded) == 1  # one utterance
    first_pause = kinds.index(SpeechPaused)
    assert kinds[first_pause : first_pause + 4] == [
        SpeechPaused,
        EarlyTranscript,
        TurnPredicted,
        SpeechResumed,
    ]
    assert not events[first_pause + 2].complete
    final = events[-1]
    assert isinstance(final, FinalTranscript) and final.transcript.duration_s > 1.8
    assert events[kinds.index(SpeechEnded)].reason == "turn"


# -- word timings and what was heard ----------------------------------------------------------


def test_word_ends_follow_the_gaps_between_words() -> None:
    phonemes = [("^", 0.1), ("h", 0.1), ("a", 0.2), (" ", 0.05), ("w", 0.1), ("ɜ", 0.2)]
    phonemes += [(" ", 0.05), ("ð", 0.1), ("ɛ", 0.2), ("r", 0.1), (".", 0.3)]
    assert word_ends("Hi, were there.", phonemes) == pytest.approx([0.4, 0.75, 1.2])


def test_word_ends_without_gaps_are_spread_by_letters() -> None:
    phonemes = [("_", 0.5), ("a", 1.0), ("_", 0.5)]  # espeak-like, one spread run
    ends = word_ends("ab abcd ab", phonemes)
    assert ends == pytest.approx([0.5 + 0.25, 0.5 + 0.75, 1.5])
    assert word_ends("", phonemes) == []


def test_backchannels_and_an_npcs_own() -> None:
    assert is_backchannel("Mm-hm.") and is_backchannel("Yeah, right.") and is_backchannel("I see")
    assert all(map(is_backchannel, ["MMMHM", "Mhm.", "Hmm", "Uh-huh.", "Oh", "Erm"]))
    assert not is_backchannel("Mum") and not is_backchannel("Hum the tune")
    assert not is_backchannel("Yeah, but where is the mill?")
    assert not is_backchannel("aye") and is_backchannel("Aye.", {"aye"})
    assert not is_backchannel("")
    assert same_words("Where is the old mill?", "where is the old  mill")
    assert not same_words("Where is the mill?", "Where is the old mill?")


async def test_a_hold_releases_once_and_a_discarded_one_never() -> None:
    calls: list[str] = []
    hold = Hold()
    hold.on_release(lambda: calls.append("a"))
    assert hold.held
    hold.release()
    hold.release()
    hold.on_release(lambda: calls.append("b"))  # after release: at once
    assert calls == ["a", "b"] and await hold.wait()
    dropped = Hold()
    dropped.on_release(lambda: calls.append("c"))
    dropped.discard()
    dropped.release()
    assert dropped.discarded and not await dropped.wait() and calls == ["a", "b"]


# -- settings and cards -----------------------------------------------------------------------


def test_turn_settings_are_checked() -> None:
    SpeechSettings(turn_detector="silence", early_final_ms=0)
    with pytest.raises(ValidationError, match="turn_wait_ms"):
        SpeechSettings(turn_wait_ms=200)
    with pytest.raises(ValidationError):
        SpeechSettings(turn_detector="guess")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SpeechSettings(turn_threshold=1.5)


def test_a_card_sets_its_turn_taking_and_a_bad_one_is_a_typed_error(tmp_path: Any) -> None:
    assert TurnTaking().ignore_backchannels and TurnTaking().resume_after_noise
    (tmp_path / "npcs").mkdir()
    (tmp_path / "world.yaml").write_text("name: T\ndescription: A test world.\n")
    card = "name: Gorm\narchetype: zombie\nstyle: grunts\nturn_taking:\n  backchannels: [{}]\n"
    (tmp_path / "npcs" / "gorm.yaml").write_text(card.format("hrm aye"))
    with pytest.raises(WorldLoadError, match="backchannels"):
        load_world(tmp_path)
    (tmp_path / "npcs" / "gorm.yaml").write_text(card.format("hrm, Aye"))
    world = load_world(tmp_path)
    assert world.npcs["gorm"].turn_taking.backchannels == ["hrm", "aye"]
