"""The ASR worker process: faster-whisper (CTranslate2) on the CPU.

Imported by name inside worker processes only (`WorkerPool`), never by the server process.

Whisper's encoder is trained on 30 s windows, and faster-whisper pads every utterance to one:
a 2 s question costs the encoder as much as 30 s of speech (about 0.9 s on 2 cores for tiny).
The encoder's cost grows with its window, so an utterance that fits a shorter one with a
second to spare (`speech.asr_window_s`, else twice that, else 30; whisper.cpp's
`audio_ctx`) is encoded in that window instead: about 3.5x faster at 10 s, and a little less
accurate (30 s, the whole window, is the default for finals). Partials, drafts that only
guide the reply's preparation while the player speaks, are decoded in their own window
(`speech.partial_window_s`, 10 by default), so that transcribing the growing line over and
over leaves the cores to the model.
Windows much shorter than 10 s make the decoder lose track of the end and repeat itself
("What is your name? What is your name? What"): a transcript that repeats itself
(`repeats_itself`) is decoded again in a window twice as long (up to 30 s). The decoding
itself follows faster-whisper's (greedy or beam, blank and non-speech tokens suppressed, no
timestamps) and its no-speech rule (no-speech probability above 0.6 with an average log
probability below -1: nothing was said).
"""

from __future__ import annotations

import importlib
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mythic._extras import require
from mythic.speech._errors import SpeechModelError
from mythic.speech._turn import TurnModel

_FULL_WINDOW_S = 30.0  # what Whisper was trained on
_FRAMES_PER_S = 100  # mel frames (10 ms hop)
_WINDOW_MARGIN_S = 1.0  # silence kept after the speech inside a short window
_REPETITIVE = 2.4  # zlib compression ratio above which a transcript repeats itself
_STUTTER = re.compile(r"([a-z]{2,4})\1{3,}")  # one to four letters, four times or more
_NO_SPEECH_PROB = 0.6
_NO_SPEECH_LOGPROB = -1.0
_TOKENS_PER_S = 12  # at most this many tokens per second of audio (speech: 3-5), plus
_TOKENS_EXTRA = 16  # these: a decoder that loses track stops there


def load(config: dict[str, Any]) -> Recognizer:
    """Load the Whisper model named by the pool's config."""
    return Recognizer(
        config["model_dir"],
        threads=config["threads"],
        language=config["language"],
        window_s=config.get("window_s", _FULL_WINDOW_S),
        partial_window_s=config.get("partial_window_s"),
        turn_model=config.get("turn_model"),
    )


def repeats_itself(text: str) -> bool:
    """The decoder lost track of the end: a phrase of 3 or more words said twice in a row (or
    of 2 words, three times), a syllable stuttered ("catechololololo"), or text so repetitive
    that zlib compresses it more than 2.4 times (Whisper's own test, for long transcripts)."""
    data = text.encode()
    if data and len(data) / len(zlib.compress(data)) > _REPETITIVE:
        return True
    if _STUTTER.search(text.lower()):
        return True
    words = re.findall(r"[a-z0-9']+", text.lower())
    count = len(words)
    for size in range(2, count // 2 + 1):
        copies = 2 if size >= 3 else 3
        for start in range(count - copies * size + 1):
            phrase = words[start : start + size]
            if all(
                words[start + k * size : start + (k + 1) * size] == phrase for k in range(1, copies)
            ):
                return True
    return False


class Recognizer:
    """One Whisper model (int8 on the CPU), transcribing one utterance at a time.

    Args:
        window_s: the encoder window of an utterance shorter than it by a second or more,
            else twice it, else 30 (see the module's docstring); 30 encodes every utterance in
            Whisper's own window.
        partial_window_s: the same for a partial transcript (a request with `"partial":
            true`); None: `window_s`.
        turn_model: Smart Turn's ONNX file (`mythic.speech._turn`), for requests that ask
            whether the player's turn is over (`"turn": true`); None: no such requests.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        threads: int,
        language: str,
        window_s: float = _FULL_WINDOW_S,
        partial_window_s: float | None = None,
        turn_model: str | None = None,
    ) -> None:
        started = time.perf_counter()
        whisper = require("faster_whisper", package="faster-whisper", extra="speech")
        self._np: Any = require("numpy", package="numpy", extra="speech")
        self.language = language
        self.window_s = min(float(window_s), _FULL_WINDOW_S)
        self.partial_window_s = min(
            float(partial_window_s if partial_window_s is not None else window_s), _FULL_WINDOW_S
        )
        try:
            self._model = whisper.WhisperModel(
                model_dir,
                device="cpu",
                compute_type="int8",
                cpu_threads=threads,
                num_workers=1,
                local_files_only=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise SpeechModelError(f"cannot load the Whisper model in {model_dir}: {exc}") from exc
        # faster-whisper's own pieces (the version is pinned in constraints.txt).
        tokenizer: Any = importlib.import_module("faster_whisper.tokenizer")
        transcribe: Any = importlib.import_module("faster_whisper.transcribe")
        model = self._model
        self._tokenizer: Any = tokenizer.Tokenizer(
            model.hf_tokenizer,
            model.model.is_multilingual,
            task="transcribe",
            language=language if model.model.is_multilingual else "en",
        )
        self._prompt: list[int] = model.get_prompt(self._tokenizer, [], without_timestamps=True)
        self._suppress: list[int] = transcribe.get_suppressed_tokens(self._tokenizer, [-1])
        # The first call in each window allocates its buffers: pay for it now, not on the
        # player's first line.
        quiet = self._np.zeros(8000, dtype=self._np.float32)
        windows = {_FULL_WINDOW_S}
        for first in (self.window_s, self.partial_window_s):
            windows |= {first, min(2 * first, _FULL_WINDOW_S)}
        for window in sorted(windows):
            self._decode(quiet, window, beam_size=1, duration=0.5)
        self._scores = (0.0, 0.0)  # the last decode's average log-probability, no-speech
        self._turn: TurnModel | None = None
        turn_error = None
        if turn_model is not None:
            try:
                self._turn = TurnModel(Path(turn_model), threads=threads)
            except SpeechModelError as exc:  # a damaged file: Whisper still serves
                turn_error = exc.message
        self.info: dict[str, Any] = {
            "pid": os.getpid(),
            "model": model_dir,
            "turn_model": turn_model if self._turn is not None else None,
            "turn_error": turn_error,
            "load_s": time.perf_counter() - started,
        }

    def run(self, payload: dict[str, Any], cancelled: Callable[[], bool]) -> Iterator[Any]:
        """Transcribe one utterance: yields one dict (text, lang, duration_s, took_s, ...).
        With `"turn": true`, then a dict `{"turn": p, "took_s": ...}`: the probability that
        the player's turn is over (the turn model's, on the same audio). The transcript comes
        first: a reply can start from it (preemptively) while the turn model decides."""
        started = time.perf_counter()
        np = self._np
        audio = np.frombuffer(payload["pcm"], dtype="<i2").astype(np.float32) / 32768.0
        if payload.get("turn") and self._turn is None:
            raise SpeechModelError("this ASR worker has no turn model (speech.turn_detector)")
        first = self.partial_window_s if payload.get("partial") else self.window_s
        text, lang, duration, window = self._transcribe(
            audio, beam_size=payload["beam_size"], window_s=first
        )
        logprob, no_speech = self._scores
        yield {
            "text": text,
            "lang": lang,
            "duration_s": duration,
            "took_s": time.perf_counter() - started,
            "window_s": window,
            "logprob": logprob,
            "no_speech": no_speech,
        }
        if payload.get("turn") and self._turn is not None and not cancelled():
            started = time.perf_counter()
            try:
                verdict: float | None = self._turn.complete(audio)
            except Exception:  # noqa: BLE001 - onnxruntime's untyped errors: no verdict
                verdict = None  # the transcript is out already; the silence decides
            yield {"turn": verdict, "took_s": time.perf_counter() - started}

    def _transcribe(
        self, audio: Any, *, beam_size: int, window_s: float
    ) -> tuple[str, str, float, float]:
        """(words, language, seconds of audio, the encoder window it was decoded in), starting
        from a `window_s` window."""
        duration = len(audio) / 16000
        window = window_s
        while duration + _WINDOW_MARGIN_S > window and window < _FULL_WINDOW_S:
            window = min(2 * window, _FULL_WINDOW_S)
        text = self._decode(audio, window, beam_size=beam_size, duration=duration)
        while window < _FULL_WINDOW_S and repeats_itself(text):
            window = min(2 * window, _FULL_WINDOW_S)
            text = self._decode(audio, window, beam_size=beam_size, duration=duration)
        return text, self._tokenizer.language_code, duration, window

    def _features(self, audio: Any, window_s: float) -> Any:
        """The log-mel spectrogram (mels, frames) of `audio`, cut or padded with zeros to
        `window_s`, as faster-whisper pads it to 30 s (with the audio padded with silence
        instead, Whisper tiny hears "you" in silence with confidence)."""
        np = self._np
        frames = int(window_s * _FRAMES_PER_S)
        features = self._model.feature_extractor(audio)[:, :-1][:, :frames]
        if features.shape[-1] < frames:
            features = np.pad(features, ((0, 0), (0, frames - features.shape[-1])))
        return features

    def _decode(self, audio: Any, window_s: float, *, beam_size: int, duration: float) -> str:
        """Encode `audio` in a `window_s` window and decode its words; empty when nothing was
        said."""
        np = self._np
        features = self._features(audio, window_s)
        encoded = self._model.encode(np.ascontiguousarray(features, dtype=np.float32))
        longest = self._model.max_length - len(self._prompt)
        new_tokens = min(longest, int(_TOKENS_PER_S * duration) + _TOKENS_EXTRA)
        result = self._model.model.generate(
            encoded,
            [self._prompt],
            beam_size=beam_size,
            max_length=len(self._prompt) + new_tokens,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
        )[0]
        tokens = result.sequences_ids[0]
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        self._scores = (float(avg_logprob), float(result.no_speech_prob))
        if result.no_speech_prob > _NO_SPEECH_PROB and avg_logprob < _NO_SPEECH_LOGPROB:
            return ""
        text: str = self._tokenizer.decode(tokens).strip()
        return text if re.search(r"\w", text) else ""  # "." alone: nothing was said
