"""Voice activity and endpointing: where an utterance starts and ends in a microphone stream."""

from __future__ import annotations

import importlib.util
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mythic._extras import require
from mythic.speech._audio import ASR_SAMPLE_RATE, BYTES_PER_SAMPLE, check_pcm16
from mythic.speech._errors import AudioFormatError, SpeechModelError
from mythic.speech._settings import SpeechSettings

if TYPE_CHECKING:
    import numpy
    import numpy.typing as npt

__all__ = [
    "FRAME_SAMPLES",
    "EndpointEvent",
    "Endpointer",
    "SileroVAD",
    "SpeechDetector",
    "SpeechEnded",
    "SpeechPaused",
    "SpeechStarted",
    "silero_vad_path",
]

FRAME_SAMPLES = 512
"""Samples per VAD frame: 32 ms at 16 kHz, the frame Silero VAD v5/v6 is trained on."""

_FRAME_BYTES = FRAME_SAMPLES * BYTES_PER_SAMPLE
_FRAME_S = FRAME_SAMPLES / ASR_SAMPLE_RATE
_CONTEXT_SAMPLES = 64


class SpeechDetector(Protocol):
    """Gives each 32 ms frame a probability that it is speech (stateful over the stream)."""

    def probability(self, frame: bytes) -> float:
        """Speech probability of one frame: `FRAME_SAMPLES` PCM16 samples at 16 kHz."""
        ...

    def reset(self) -> None:
        """Forget the stream so far (a new microphone stream starts)."""
        ...


def silero_vad_path() -> Path:
    """The Silero VAD ONNX model that `faster-whisper` ships (`assets/silero_vad_v*.onnx`).

    Found without importing faster_whisper (which loads CTranslate2); the newest version
    shipped is taken.
    """
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        require("faster_whisper", package="faster-whisper", extra="speech")
        raise SpeechModelError("faster_whisper is installed but has no package folder")
    assets = Path(next(iter(spec.submodule_search_locations))) / "assets"
    models = sorted(assets.glob("silero_vad_v*.onnx"), key=lambda p: _version(p.stem))
    if not models:
        raise SpeechModelError(
            f"no silero_vad_v*.onnx in {assets}",
            fix="pip install --force-reinstall 'faster-whisper>=1.2'",
        )
    return models[-1]


def _version(stem: str) -> int:
    digits = stem.rsplit("_v", 1)[-1]
    return int(digits) if digits.isdigit() else 0


class SileroVAD:
    """Silero VAD (v6, as shipped by faster-whisper) on onnxruntime with one thread.

    Streaming: each call takes the next 512-sample frame; the LSTM state and the last 64
    samples of context carry over to the next call. About 0.1 ms a frame on one CPU core.
    """

    def __init__(self, model: Path | None = None) -> None:
        np_ = require("numpy", package="numpy", extra="speech")
        ort = require("onnxruntime", package="onnxruntime", extra="speech")
        path = model or silero_vad_path()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 4
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise SpeechModelError(f"cannot load the VAD model {path}: {exc}") from exc
        self._np: Any = np_
        self.reset()

    def reset(self) -> None:
        np = self._np
        self._h: npt.NDArray[numpy.float32] = np.zeros((1, 1, 128), dtype=np.float32)
        self._c: npt.NDArray[numpy.float32] = np.zeros((1, 1, 128), dtype=np.float32)
        self._context: npt.NDArray[numpy.float32] = np.zeros(_CONTEXT_SAMPLES, dtype=np.float32)

    def probability(self, frame: bytes) -> float:
        if len(frame) != _FRAME_BYTES:
            raise AudioFormatError(f"a VAD frame is {_FRAME_BYTES} bytes, not {len(frame)}")
        np = self._np
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32) / 32768.0
        window = np.concatenate((self._context, samples))[None, :]
        out, self._h, self._c = self._session.run(
            None, {"input": window, "h": self._h, "c": self._c}
        )
        self._context = samples[-_CONTEXT_SAMPLES:]
        return float(out.reshape(-1)[0])


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The player started speaking: `at_s` is when, in seconds of audio fed so far.

    Comes `min_speech_ms` after the speech began (that long is needed to tell speech from a
    click); the moment to stop an NPC that is speaking (barge-in).
    """

    at_s: float


@dataclass(frozen=True, slots=True)
class SpeechEnded:
    """An utterance is complete: its audio (16 kHz mono PCM16), ready for the final ASR.

    Attributes:
        at_s: when the speech stopped, in seconds of audio fed so far.
        started_s: when it began.
        pcm: the utterance with `speech_pad_ms` of audio either side.
        reason: `silence` (trailing silence, the endpoint), `turn` (the turn model said the
            player had finished, at a pause), `max_length` (cut at `max_utterance_s`),
            `release` (push-to-talk released) or `flush` (input ended).
    """

    at_s: float
    started_s: float
    pcm: bytes
    reason: Literal["silence", "turn", "max_length", "release", "flush"]

    @property
    def duration_s(self) -> float:
        """Seconds of audio in `pcm`."""
        return len(self.pcm) / (BYTES_PER_SAMPLE * ASR_SAMPLE_RATE)


@dataclass(frozen=True, slots=True)
class SpeechPaused:
    """The player paused: `early_final_ms` of silence, the endpoint not yet reached.

    The moment to start the final transcript early: if the utterance ends with no more
    speech, its `SpeechEnded` has the same `at_s` and `started_s`, and a transcript of `pcm`
    is as good as one of the `SpeechEnded`'s audio. Speech may go on after a pause instead;
    each pause in an utterance gives one event.

    Attributes:
        at_s: when the speech stopped, in seconds of audio fed so far.
        started_s: when the utterance began.
        pcm: the utterance so far (16 kHz mono PCM16): `speech_pad_ms` of audio before the
            speech, and min(`early_final_ms`, `speech_pad_ms`) of the silence after it.
    """

    at_s: float
    started_s: float
    pcm: bytes

    @property
    def duration_s(self) -> float:
        """Seconds of audio in `pcm`."""
        return len(self.pcm) / (BYTES_PER_SAMPLE * ASR_SAMPLE_RATE)


EndpointEvent = SpeechStarted | SpeechPaused | SpeechEnded


class Endpointer:
    """Finds utterances in a 16 kHz microphone stream: feed PCM, get start/end events.

    Voice mode (default): an utterance starts after `min_speech_ms` of speech and ends after
    `trailing_silence_ms` of silence (or at `max_utterance_s`); after `early_final_ms` of that
    silence it says `SpeechPaused`, once per pause. Push-to-talk mode: `press()` and
    `release()` delimit the utterance (all audio between them is kept); the VAD still decides
    whether anything was said, so a press with only silence or noise in it is no utterance.
    Either way, input without speech never yields an utterance.

    Turn mode (`turn=True`, voice mode only): a pause's end of turn is decided by a turn model
    whose verdict comes through `verdict()` (the caller asks the model at `SpeechPaused`):
    "finished" ends the utterance at once, "not yet" lets the silence go on to
    `turn_wait_ms`, as does a verdict that has not come; a failed one (None) falls back to
    `trailing_silence_ms`.

    Synchronous and I/O-free: `feed` runs the VAD inline (about 0.1 ms per 32 ms frame).
    """

    def __init__(
        self,
        settings: SpeechSettings | None = None,
        *,
        detector: SpeechDetector | None = None,
        push_to_talk: bool = False,
        turn: bool = False,
    ) -> None:
        self.settings = settings or SpeechSettings()
        self.push_to_talk = push_to_talk
        self.turn = turn and not push_to_talk
        self._detector = detector if detector is not None else SileroVAD()
        s = self.settings
        self._min_speech = max(1, round(s.min_speech_ms / 1000 / _FRAME_S))
        self._trailing = max(1, round(s.trailing_silence_ms / 1000 / _FRAME_S))
        self._early = max(1, round(s.early_final_ms / 1000 / _FRAME_S)) if s.early_final_ms else 0
        self._wait = max(self._trailing, round(s.turn_wait_ms / 1000 / _FRAME_S))
        if self.turn and not self._early:
            raise ValueError("an Endpointer in turn mode needs early_final_ms above 0")
        self._pad = round(s.speech_pad_ms / 1000 / _FRAME_S)
        self._max_frames = int(s.max_utterance_s / _FRAME_S)
        self.reset()

    def reset(self) -> None:
        """Forget the stream: no utterance open, time back to 0."""
        self._detector.reset()
        self._pending = b""
        self._frames_seen = 0
        self._recent: deque[bytes] = deque(maxlen=self._pad + self._min_speech)
        self._run = 0  # consecutive speech frames before an utterance is confirmed
        self._utterance: list[bytes] | None = None
        self._first = 0  # frame index of the open utterance's first kept frame
        self._heard = False  # speech confirmed in the open utterance
        self._started = 0  # frame index where its speech began
        self._last_speech = 0  # frame index just after its last speech frame
        self._silence = 0
        self._endpoint = self._wait if self.turn else self._trailing
        """Silence frames that end the open utterance now (turn mode: by the verdict)."""
        self._pressed = False

    @property
    def now_s(self) -> float:
        """Seconds of audio fed so far (whole frames)."""
        return self._frames_seen * _FRAME_S

    @property
    def in_speech(self) -> bool:
        """Whether an utterance has started and not yet ended."""
        return self._heard

    @property
    def speech_s(self) -> float:
        """Seconds from the open utterance's first speech to its last so far (0 when none is
        open): how long the player has been talking, the silence after it not counted."""
        return (self._last_speech - self._started) * _FRAME_S if self._heard else 0.0

    @property
    def paused(self) -> bool:
        """Whether the open utterance is in a pause: `SpeechPaused` came, no speech since."""
        return self._heard and bool(self._early) and self._silence >= self._early

    def verdict(self, complete: bool | None) -> list[EndpointEvent]:
        """Turn mode: the turn model's verdict on the current pause (`complete`: the player
        has finished; None: the model failed). Ends the utterance now when finished (or, for
        None, when `trailing_silence_ms` has passed); ignored when no pause is open (the
        player spoke again: that pause's verdict is stale)."""
        if not self.turn or not self.paused:
            return []
        if complete:
            return self._close("turn")
        self._endpoint = self._wait if complete is False else self._trailing
        if self._silence >= self._endpoint:
            return self._close("silence")
        return []

    def utterance_pcm(self) -> bytes:
        """The audio of the open utterance so far (empty when none has started)."""
        if not self._heard or not self._utterance:
            return b""
        return b"".join(self._utterance)

    def feed(self, pcm: bytes) -> list[EndpointEvent]:
        """Add audio (16 kHz mono PCM16, any even length); the events it completes."""
        check_pcm16(pcm, ASR_SAMPLE_RATE, expected_rate=ASR_SAMPLE_RATE)
        data = self._pending + bytes(pcm)
        whole = len(data) - len(data) % _FRAME_BYTES
        self._pending = data[whole:]
        events: list[EndpointEvent] = []
        for offset in range(0, whole, _FRAME_BYTES):
            self._frame(data[offset : offset + _FRAME_BYTES], events)
        return events

    def press(self) -> None:
        """Push-to-talk pressed: audio from now on belongs to the utterance."""
        if not self.push_to_talk:
            raise RuntimeError("press() needs Endpointer(push_to_talk=True)")
        if not self._pressed:
            self._pressed = True
            self._open(self._frames_seen)

    def release(self) -> list[EndpointEvent]:
        """Push-to-talk released: the utterance ends, if anything was said in it."""
        if not self.push_to_talk:
            raise RuntimeError("release() needs Endpointer(push_to_talk=True)")
        self._pressed = False
        return self._close("release")

    def flush(self) -> list[EndpointEvent]:
        """The input ended: an open utterance ends now (a partial frame is dropped)."""
        self._pending = b""
        self._pressed = False
        return self._close("flush")

    def _open(self, first: int) -> None:
        self._utterance = []
        self._first = first
        self._heard = False
        self._run = 0
        self._silence = 0

    def _frame(self, frame: bytes, events: list[EndpointEvent]) -> None:
        index = self._frames_seen
        self._frames_seen += 1
        if self.push_to_talk and not self._pressed:
            return
        p = self._detector.probability(frame)
        if self.push_to_talk:
            assert self._utterance is not None
            self._utterance.append(frame)
            self._listen(index, p, events)
            if p >= self.settings.vad_release:
                self._last_speech = index + 1
        elif self._utterance is None:
            self._recent.append(frame)
            self._listen(index, p, events)
            if self._heard:
                self._utterance = list(self._recent)
                self._first = index + 1 - len(self._utterance)
            return
        else:
            self._utterance.append(frame)
            if p >= self.settings.vad_release:
                self._last_speech = index + 1
                if self._silence and self.turn:
                    self._endpoint = self._wait  # a new pause waits for its own verdict
                self._silence = 0
            else:
                self._silence += 1
            if self._silence >= self._endpoint:
                events.extend(self._close("silence"))
                return
            if self._early and self._silence == self._early:
                events.append(self._pause())
        if self._utterance is not None and len(self._utterance) >= self._max_frames:
            events.extend(self._close("max_length"))
            if self._pressed:
                self._open(self._frames_seen)

    def _listen(self, index: int, p: float, events: list[EndpointEvent]) -> None:
        """Count speech frames until `min_speech_ms` of them in a row start the utterance."""
        if self._heard:
            return
        self._run = self._run + 1 if p >= self.settings.vad_threshold else 0
        if self._run >= self._min_speech:
            self._heard = True
            self._started = index + 1 - self._run
            self._last_speech = index + 1
            self._silence = 0
            events.append(SpeechStarted(self._started * _FRAME_S))

    def _pause(self) -> SpeechPaused:
        assert self._utterance is not None
        keep = self._last_speech + min(self._early, self._pad) - self._first
        return SpeechPaused(
            at_s=self._last_speech * _FRAME_S,
            started_s=self._started * _FRAME_S,
            pcm=b"".join(self._utterance[:keep]),
        )

    def _close(
        self, reason: Literal["silence", "turn", "max_length", "release", "flush"]
    ) -> list[EndpointEvent]:
        frames, heard = self._utterance, self._heard
        self._utterance, self._heard, self._run = None, False, 0
        self._endpoint = self._wait if self.turn else self._trailing
        self._recent.clear()
        if frames is None or not heard:
            return []  # nothing was said: no utterance
        if not self.push_to_talk:
            # Keep `speech_pad_ms` of the trailing silence; drop the rest.
            frames = frames[: max(0, self._last_speech + self._pad - self._first)]
        return [
            SpeechEnded(
                at_s=self._last_speech * _FRAME_S,
                started_s=self._started * _FRAME_S,
                pcm=b"".join(frames),
                reason=reason,
            )
        ]
